"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's kernels.

A decode step is hundreds of short kernels, and each one's launch (grid setup, CTA scheduling)
costs about as much as its work. Launched with PDL, a kernel may be started while the one before
it in the stream is still finishing; it then waits in the kernel (`griddepcontrol.wait`) until
that one has completed and its writes are visible. So a kernel launched this way must call
`wait(PDL)` before its first global memory access; it also lets the next kernel launch early
(`griddepcontrol.launch_dependents`). Under a CUDA graph capture the launches become
programmatic edges of the graph. Switch: TALLOW_PDL=0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import switches
from . import INTERPRETED

_CAPABLE: dict = {}  # device index -> whether it supports PDL


def enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: a CUDA device of compute capability >= 9,
    compiled kernels (not the interpreter), and the switch on. Read per call (capture time)."""
    if device.type != "cuda" or INTERPRETED or not switches.enabled("TALLOW_PDL"):
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPABLE:
        _CAPABLE[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _CAPABLE[index]


def launch(device: torch.device) -> dict:
    """The launch options and the kernel's PDL constexpr for `device`: pass as **launch(device)."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {"PDL": False}


@triton.jit
def wait(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
