"""Greedy sampling on the GPU: argmax over a 150k-262k vocabulary in two launches.

Stage 1: P programs (default 256, ~2 per SM) each scan a contiguous slice and write its
maximum and the first index reaching it; stage 2: one program picks the largest of the P
maxima, the lowest index on ties -- torch.argmax's rule. NaN counts as -inf. Writes an int64
token id into `out` (a static device tensor: the decode graph's output), no host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["argmax", "make_argmax_scratch", "argmax_reference"]


@triton.jit
def _stage1(x_ptr, val_ptr, idx_ptr, V, CHUNK, sxm, P, BLOCK: tl.constexpr):
    p = tl.program_id(0)
    row = tl.program_id(1)
    lo = p * CHUNK
    best = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    bidx = tl.full((BLOCK,), 2147483647, dtype=tl.int32)
    for off in range(0, CHUNK, BLOCK):
        e = lo + off + tl.arange(0, BLOCK)
        msk = (e < V) & (e < lo + CHUNK)
        v = tl.load(x_ptr + row * sxm + e, mask=msk, other=float("-inf")).to(tl.float32)
        v = tl.where(v == v, v, float("-inf"))
        take = v > best  # strict: the earlier index stays on ties (lanes scan increasing e)
        best = tl.where(take, v, best)
        bidx = tl.where(take, e, bidx)
    m = tl.max(best, axis=0)
    i = tl.min(tl.where((best == m) & (bidx < 2147483647), bidx, 2147483647), axis=0)
    i = tl.where(i == 2147483647, lo, i)  # all -inf: the first index of the slice
    tl.store(val_ptr + row * P + p, m)
    tl.store(idx_ptr + row * P + p, i)


@triton.jit
def _stage2(val_ptr, idx_ptr, out_ptr, P, PB: tl.constexpr):
    row = tl.program_id(0)
    j = tl.arange(0, PB)
    msk = j < P
    v = tl.load(val_ptr + row * P + j, mask=msk, other=float("-inf"))
    i = tl.load(idx_ptr + row * P + j, mask=msk, other=2147483647)
    m = tl.max(v, axis=0)
    best = tl.min(tl.where((v == m) & msk, i, 2147483647), axis=0)
    tl.store(out_ptr + row, best.to(tl.int64))


def make_argmax_scratch(m: int, parts: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty((m, parts), dtype=torch.float32, device=device),
            torch.empty((m, parts), dtype=torch.int32, device=device))


def argmax(logits: torch.Tensor, out: torch.Tensor | None = None, scratch=None, parts: int = 256,
           block: int = 1024) -> torch.Tensor:
    """logits (V,) or (M, V) -> int64 (1,) or (M,) argmax per row."""
    x2 = logits.reshape(1, -1) if logits.ndim == 1 else logits
    m, v = x2.shape
    if scratch is None:
        scratch = make_argmax_scratch(m, parts, logits.device)
    parts = scratch[0].shape[1]
    chunk = triton.cdiv(triton.cdiv(v, parts), block) * block
    if out is None:
        out = torch.empty((m,), dtype=torch.int64, device=logits.device)
    _stage1[(parts, m)](x2, scratch[0], scratch[1], v, chunk, x2.stride(0), parts, BLOCK=block, num_warps=4)
    _stage2[(m,)](scratch[0], scratch[1], out, parts, PB=triton.next_power_of_2(parts), num_warps=4)
    return out


def argmax_reference(logits: torch.Tensor) -> torch.Tensor:
    x = logits.float().reshape(-1, logits.shape[-1])
    return torch.argmax(torch.nan_to_num(x, nan=float("-inf")), dim=-1)
