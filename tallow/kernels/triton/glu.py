"""Gated activations of the feed-forward block, one launch: SwiGLU silu(gate) * up and GeGLU
with ggml's GELU (tanh approximation evaluated at the fp16-rounded gate, result rounded to
fp16, as tallow/layers.py geglu; the tanh here is exp-based, so a value can land one fp16 ulp
from torch's at a rounding boundary).

gate and up may be views into one (M, 2F) output of a concatenated gate/up GEMV (any row
stride, last dim contiguous). Graph-safe with `out` given.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl

__all__ = ["glu", "swiglu", "geglu", "glu_reference"]


@triton.jit
def _act(g, u, KIND: tl.constexpr):
    if KIND == 0:
        return g / (1.0 + tl.exp(-g)) * u
    else:
        h = g.to(tl.float16).to(tl.float32)
        z = 0.7978845608028654 * (h + 0.044715 * h * h * h)
        # 0.5 * (1 + tanh(z)) = sigmoid(2z): no cancellation for negative h
        return (h / (1.0 + tl.exp(-2.0 * z))).to(tl.float16).to(tl.float32) * u


@triton.jit
def _glu_kernel(g_ptr, u_ptr, y_ptr, F, sgm, sum_, sym, KIND: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    off = tl.program_id(1) * BLOCK
    e = off + tl.arange(0, BLOCK)
    msk = e < F
    g = tl.load(g_ptr + row * sgm + e, mask=msk, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * sum_ + e, mask=msk, other=0.0).to(tl.float32)
    y = _act(g, u, KIND)
    tl.store(y_ptr + row * sym + e, y, mask=msk)


def glu(gate: torch.Tensor, up: torch.Tensor, kind: str = "swiglu",
        out: torch.Tensor | None = None) -> torch.Tensor:
    """kind 'swiglu' or 'geglu'; gate, up (M, F) or (F,) -> float32 of the same shape."""
    squeeze = gate.ndim == 1
    g2 = gate.reshape(1, -1) if squeeze else gate
    u2 = up.reshape(1, -1) if squeeze else up
    m, f = g2.shape
    if g2.stride(1) != 1 or u2.stride(1) != 1:
        raise ValueError("glu: the last dim of gate and up must be contiguous.")
    if out is None:
        out = torch.empty((m, f), dtype=torch.float32, device=gate.device)
    o2 = out.reshape(m, f)
    block = 1024
    grid = (m, triton.cdiv(f, block))
    _glu_kernel[grid](g2, u2, o2, f, g2.stride(0), u2.stride(0), o2.stride(0),
                      KIND={"swiglu": 0, "geglu": 1}[kind], BLOCK=block, num_warps=4,
                      **pdl.launch(gate.device))
    return out


def swiglu(gate, up, out=None):
    return glu(gate, up, "swiglu", out)


def geglu(gate, up, out=None):
    return glu(gate, up, "geglu", out)


def glu_reference(gate: torch.Tensor, up: torch.Tensor, kind: str = "swiglu") -> torch.Tensor:
    g, u = gate.float(), up.float()
    if kind == "swiglu":
        return torch.nn.functional.silu(g) * u
    h = torch.nn.functional.gelu(g.half().float(), approximate="tanh").half().float()
    return h * u
