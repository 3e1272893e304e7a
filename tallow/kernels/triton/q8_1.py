"""x to ggml's Q8_1 blocks, the activation form of the integer-dot GEMV (mmvq.py).

Per 32-element block of a row: d = amax / 127 (IEEE division), codes q = roundf(x / d) (half away
from zero; 0 where amax is 0), the fp32 sum of the block's x in the warp's xor-butterfly order
(ggml's ds.y, stored as fp16), and the integer code sums per 16. `q8_1_blocks` is the block math
for any kernel that holds the blocks in registers: the quantize launch here, and RMSNorm when it
writes its output's Q8_1 form in the same launch (rmsnorm.py), so both give the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import pdl

__all__ = ["Q8Act", "quantize_q8_1", "quantize_q8_1_reference", "empty_q8_1"]


@dataclass
class Q8Act:
    """x (M, K) as ggml's Q8_1 blocks, one plane per field."""

    qs: torch.Tensor  # int8 (M, K)
    d: torch.Tensor  # fp16 (M, K/32): amax / 127
    s: torch.Tensor  # fp16 (M, K/32): the fp32 sum of the block's x (ggml's ds.y; unused by Q4_K/Q6_K)
    isum: torch.Tensor  # int32 (M, K/16): sums of the codes per 16


def empty_q8_1(m: int, k: int, device) -> Q8Act:
    return Q8Act(torch.empty((m, k), dtype=torch.int8, device=device),
                 torch.empty((m, k // 32), dtype=torch.float16, device=device),
                 torch.empty((m, k // 32), dtype=torch.float16, device=device),
                 torch.empty((m, k // 16), dtype=torch.int32, device=device))


@triton.jit
def _roundf(v):
    """C's roundf (half away from zero), exact: v - trunc(v) is exact for |v| < 2^23."""
    t = v.to(tl.int32)  # truncates toward zero
    r = v - t.to(tl.float32)
    return t + (r >= 0.5).to(tl.int32) - (r <= -0.5).to(tl.int32)


@triton.jit
def q8_1_blocks(v, blk, ok, q_row, d_row, s_row, i_row, BLK: tl.constexpr):
    """Quantize v (BLK, 32) fp32, blocks `blk` of one row (`ok`: inside the row), and store them at
    the row's planes: codes q_row (int8), d_row / s_row (fp16 per 32), i_row (int32 per 16)."""
    j = tl.arange(0, 32)
    amax = tl.max(tl.abs(v), axis=1)
    # the warp's xor butterfly: lane i + lane i^16, then ^8, ^4, ^2, ^1 (each a two-term sum)
    s = tl.sum(tl.reshape(v, (BLK, 2, 16)), axis=1)
    s = tl.sum(tl.reshape(s, (BLK, 2, 8)), axis=1)
    s = tl.sum(tl.reshape(s, (BLK, 2, 4)), axis=1)
    s = tl.sum(tl.reshape(s, (BLK, 2, 2)), axis=1)
    s = tl.sum(tl.reshape(s, (BLK, 2, 1)), axis=1)
    s = tl.reshape(s, (BLK,))
    d = tl.math.div_rn(amax, tl.full((BLK,), 127.0, tl.float32))
    safe = tl.where(amax == 0.0, 1.0, d)
    q = tl.where(amax[:, None] == 0.0, 0, _roundf(tl.math.div_rn(v, tl.broadcast_to(safe[:, None], (BLK, 32)))))
    tl.store(q_row + blk[:, None] * 32 + j[None, :], q.to(tl.int8), mask=ok[:, None])
    tl.store(d_row + blk, d.to(tl.float16), mask=ok)
    tl.store(s_row + blk, s.to(tl.float16), mask=ok)
    isum = tl.sum(tl.reshape(q, (BLK, 2, 16)), axis=2)  # (BLK, 2)
    h = tl.arange(0, 2)
    tl.store(i_row + blk[:, None] * 2 + h[None, :], isum, mask=ok[:, None])


@triton.jit
def _q8_1_kernel(x_ptr, q_ptr, d_ptr, s_ptr, i_ptr, K, stride_xm, BLK: tl.constexpr, PDL: tl.constexpr):
    m = tl.program_id(0)
    blk = tl.program_id(1) * BLK + tl.arange(0, BLK)
    j = tl.arange(0, 32)
    nblk = K // 32
    ok = blk < nblk
    pdl.wait(PDL)
    v = tl.load(x_ptr + m * stride_xm + blk[:, None] * 32 + j[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    q8_1_blocks(v, blk, ok, q_ptr + m * K, d_ptr + m * nblk, s_ptr + m * nblk, i_ptr + m * (K // 16), BLK)


def quantize_q8_1(x: torch.Tensor, out: Q8Act | None = None) -> Q8Act:
    """x float32/16 (M, K), K a multiple of 32 -> Q8Act. `out` reuses buffers (CUDA graphs)."""
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    m, k = x2.shape
    if k % 32:
        raise ValueError(f"quantize_q8_1 wants K a multiple of 32, got {k}.")
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    if out is None:
        out = empty_q8_1(m, k, x2.device)
    blk = 8
    _q8_1_kernel[(m, triton.cdiv(k // 32, blk))](x2, out.qs, out.d, out.s, out.isum, k, x2.stride(0), BLK=blk,
                                                 num_warps=2, **pdl.launch(x2.device))
    return out


def _roundf_reference(v: torch.Tensor) -> torch.Tensor:
    # exact for fp32 inputs: float64 holds |v| + 0.5 without rounding
    a = v.double()
    return (torch.sign(a) * torch.floor(a.abs() + 0.5)).to(torch.int32)


def quantize_q8_1_reference(x: torch.Tensor) -> Q8Act:
    """A torch transcription of ggml-cuda's quantize_q8_1 (IEEE division, see the docstring)."""
    x2 = (x.reshape(1, -1) if x.ndim == 1 else x).float()
    m, k = x2.shape
    v = x2.reshape(m, k // 32, 32)
    amax = v.abs().amax(dim=2)
    d = amax / 127.0
    q = torch.where(amax[..., None] == 0, torch.zeros((), dtype=torch.int32, device=v.device),
                    _roundf_reference(v / torch.where(amax == 0, 1.0, d)[..., None]))
    s = v
    for width in (16, 8, 4, 2, 1):
        s = s[..., :width] + s[..., width:2 * width]
    return Q8Act(q.to(torch.int8).reshape(m, k), d.half(), s[..., 0].half(), q.reshape(m, k // 16, 16).sum(-1).int())
