"""The Mamba mixer's conv1d and selective scan in C (ssm_step.c, built into the optional library with
ggml_dot.c): one call each per layer and token block, the states updated in place, instead of the
torch reference's small ops and state copies (kernels/cpu/ssm.py). Bits: ssm_step.c's header.

Switch (read at load, kernels/ssm_ops.mixer_ops): TALLOW_CPU_C_SSM=0 runs the torch reference; on by
default where the library is built. The calls take CPU float32 tensors whose last dimension is
contiguous (row strides are passed, so column slices of the in-projection go in without a copy).
"""

from __future__ import annotations

import ctypes

import torch

from ... import switches
from . import ggml_dot


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ss_conv.argtypes = [p, i64, i64, i64, i32, p, p, p, p]
    lib.ss_scan.argtypes = [p, i64, i64, i64, i64, p, i64, p, i64, p, p, i32, p, i64, p, i64, p, p, i64, i64, p, i32]
    lib.ss_conv.restype = None
    lib.ss_scan.restype = i32


def _lib() -> ctypes.CDLL | None:
    return ggml_dot.bound("ss_scan", _declare)


def usable() -> bool:
    """TALLOW_CPU_C_SSM (default on) and the library built with ssm_step.c."""
    return switches.enabled("TALLOW_CPU_C_SSM") and _lib() is not None


def fits(*tensors: torch.Tensor | None) -> bool:
    """CPU float32 tensors with a contiguous last dimension (None: an absent optional input). Asked
    of every call's inputs: a plain loop, the cheapest form (a layer's decode step is ~100 us)."""
    for t in tensors:
        if t is not None and (t.dtype is not torch.float32 or not t.is_cpu or t.stride(-1) != 1):
            return False
    return True


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def conv(x: torch.Tensor, state: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """SiLU(causal conv1d of x (n, C) after state (d_conv - 1, C), plus bias); state updated in place.
    weight_t (d_conv, C): the layer's (C, d_conv) kernel transposed, contiguous; bias (C,) contiguous."""
    n, channels = x.shape
    out = torch.empty((n, channels), dtype=torch.float32)
    _lib().ss_conv(x.data_ptr(), x.stride(0), n, channels, weight_t.shape[0], state.data_ptr(),
                                   weight_t.data_ptr(), bias.data_ptr(), out.data_ptr())
    return out


def scan(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
         dt_bias: torch.Tensor | None, D: torch.Tensor | None, z: torch.Tensor | None) -> torch.Tensor:
    """(selective scan + x D) * SiLU(z) over the rows of x (n, n_head * head_dim); dt (n, n_head); B, C
    (n, n_group * d_state); state (n_head, head_dim, d_state) contiguous, updated in place; A (n_head,
    d_state) (Mamba-1) or (n_head,); dt_bias, D (n_head,) or None; z (n, n_head * head_dim) or None."""
    n_head, head_dim, d_state = state.shape
    n = x.shape[0]
    n_group = B.shape[1] // d_state
    y = torch.empty((n, n_head * head_dim), dtype=torch.float32)
    zs = 0 if z is None else z.stride(0)
    rc = _lib().ss_scan(state.data_ptr(), n_head, head_dim, d_state, n_group, x.data_ptr(), x.stride(0), dt.data_ptr(),
                                        dt.stride(0), _ptr(dt_bias), A.data_ptr(), int(A.dim() == 2), B.data_ptr(), B.stride(0),
                                        C.data_ptr(), C.stride(0), _ptr(D), _ptr(z), zs, n, y.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise MemoryError("the C selective scan could not allocate its scratch.")
    return y
