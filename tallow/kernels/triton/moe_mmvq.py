"""Routed-expert decode GEMV with integer inner products: mmvq.py's arithmetic over the chosen experts.

moe_gemv.py rebuilds every weight as fp32 before an fp32 fma with x, as quant_gemv does; on the
H200 that read the experts at 0.5-0.9 TB/s (docs/performance.md, session 8's profile), where the
dense integer-dot GEMV (mmvq.py) reads its matrices near the copy bandwidth. Here x is quantized
once per projection to ggml's Q8_1 blocks (mmvq.quantize_q8_1: the token rows for gate/up, the
pairs' GLU outputs for down, the GLU folded into that quantization when it comes lazily), and
program (tile, p) takes the integer dots of rows tile*BLOCK_N.. of expert ids[p]'s matrix with x
row p // X_DIV, through mmvq's per-type step functions with one x row (ROWS=1): the same integer
sums and the same fp32 combination, in the same order, as mmvq_q8 on that expert's matrix alone.

The expert id is read from a device tensor, so nothing is decided on the host and the decode step
stays one CUDA graph; per pair one accumulator, no split K: a pair's output does not depend on the
other pairs of the launch (a verification row is bit for bit its decode step's).
Switch: TALLOW_MOE_MMVQ=1 (kernels/gpu/moe.py); otherwise moe_gemv's fp32 tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import INTERPRETED, pdl
from .mmvq import (MMVQ_TYPES, Q8Act, _BLOCK, _G_PER, _PLANES, _WORDS, _q4k_step, _q4x_step, _q6k_step, _q80_step,
                   mmvq_config, mmvq_reference)
from .moe_gemv import ExpertWeights
from .planes import PlaneWeight

__all__ = ["moe_mmvq", "moe_mmvq_reference", "moe_mmvq_config", "moe_mmvq_ok"]


def moe_mmvq_ok(w: ExpertWeights) -> bool:
    """Whether this stacked expert weight has an integer-dot kernel (a plane type of MMVQ_TYPES)."""
    return w.planes is not None and w.planes.qtype in MMVQ_TYPES


@triton.jit
def _moe_mmvq_kernel(p0, p1, p2, p3, xq_ptr, d8_ptr, xs_ptr, s8_ptr, ids_ptr, y_ptr, N, K, stride_ym, X_DIV,
                     QT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr,
                     BLOCK_K: tl.constexpr, G: tl.constexpr, DP4A: tl.constexpr, PDL: tl.constexpr):
    # QT as mmvq: 0 Q4_K, 1 Q6_K, 2 Q8_0, 3/4/5 Q4_0/Q4_1/Q5_0. N: one expert's rows.
    pid = tl.program_id(0)
    p = tl.program_id(1)
    pdl.wait(PDL)  # the ids and x's codes come from the kernels before this one
    e = tl.load(ids_ptr + p).to(tl.int64)
    local = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = local < N
    local = tl.minimum(local, N - 1).to(tl.int64)
    rows = e * N + local  # rows of the stacked weight (int64: 128 experts' planes pass 2^31 bytes)
    nb = K // BLOCK_K
    xr = (p // X_DIV).to(tl.int64)
    xq = xq_ptr + xr * (K // 4)
    d8 = d8_ptr + xr * (K // 32)
    xs = xs_ptr + xr * (K // 16)
    s8 = s8_ptr + xr * (K // 32)
    # mmvq's step functions carry 8 x rows' accumulators; with ROWS=1 only acc0 is touched
    acc0 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    acc4 = acc0
    acc5 = acc0
    acc6 = acc0
    acc7 = acc0
    for kb in tl.range(0, nb, BLOCKS, num_stages=STAGES):
        if QT == 0:
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _q4k_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, p0, p1, p2, xq, d8, xs,
                rows, kb, nb, nb, K, G, 1, DP4A)
        elif QT == 1:
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _q6k_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, p0, p1, p2, p3, xq, d8, xs,
                rows, kb, nb, nb, K, G, 1, DP4A)
        elif QT == 2:
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _q80_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, p0, p1, xq, d8,
                rows, kb, nb, nb, K, G, 1, DP4A)
        else:
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _q4x_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, p0, p1, p2, xq, d8, s8,
                rows, kb, nb, nb, K, G, 1, QT - 3, DP4A)
    tl.store(y_ptr + p.to(tl.int64) * stride_ym + local, tl.sum(acc0, axis=1), mask=row_ok)


def moe_mmvq_config(qtype: str, rows: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCKS per K step, num_warps, num_stages): mmvq's configuration for one expert's
    (rows, k) shape, without K splits (the pairs already give rows/BLOCK_N x pairs programs:
    Qwen3-30B-A3B's gate+up 384 x 8), BLOCKS no more than the K blocks there are."""
    block_n, blocks, warps, stages = mmvq_config(qtype, rows, k)[:4]
    nb = k // _BLOCK[qtype]
    while blocks > 1 and blocks > nb:
        blocks //= 2
    return block_n, blocks, warps, stages


def moe_mmvq(xq: Q8Act, w: ExpertWeights, ids: torch.Tensor, x_div: int, out: torch.Tensor | None = None,
             config=None) -> torch.Tensor:
    """y[p] = the integer-dot product of x row p // x_div (Q8_1, xq) with expert ids[p]'s matrix,
    for every pair p (ids (P,) on the device, M * x_div == P). Returns float32 (P, w.rows)."""
    if not moe_mmvq_ok(w):
        raise ValueError(f"moe_mmvq: no integer-dot kernel for this expert weight ({w.kind}).")
    m_rows, k = xq.qs.shape
    p_count = ids.numel()
    if k != w.k or m_rows * x_div != p_count:
        raise ValueError(f"moe_mmvq: x ({m_rows}, {k}) and {p_count} pairs do not match K={w.k}, x_div={x_div}.")
    dev = xq.qs.device
    ids = ids.reshape(-1)
    if out is None:
        out = torch.empty((p_count, w.rows), dtype=torch.float32, device=dev)
    qtype = w.planes.qtype
    block_n, blocks, warps, stages = tuple(config) if config is not None else moe_mmvq_config(qtype, w.rows, w.k)
    dp4a = not (INTERPRETED or dev.type != "cuda")  # inline PTX needs a compiled kernel; same integers
    planes = [w.planes.planes[name].view(torch.int32) if name in _WORDS[qtype] else w.planes.planes[name]
              for name in _PLANES[qtype]]
    planes += [planes[0]] * (4 - len(planes))
    _moe_mmvq_kernel[(triton.cdiv(w.rows, block_n), p_count)](
        *planes, xq.qs.view(torch.int32), xq.d, xq.isum, xq.s, ids, out, w.rows, w.k, out.stride(0), x_div,
        QT=MMVQ_TYPES.index(qtype), BLOCK_N=block_n, BLOCKS=blocks, STAGES=stages, BLOCK_K=_BLOCK[qtype],
        G=blocks * _G_PER[qtype], DP4A=dp4a, num_warps=warps, **pdl.launch(dev))
    return out


def moe_mmvq_reference(xq: Q8Act, w: ExpertWeights, ids: torch.Tensor, x_div: int) -> torch.Tensor:
    """Per pair, mmvq_reference (float64, exact integer dots) of the chosen expert's planes and its
    x row's Q8_1 blocks -> float32 (P, rows)."""
    ids = ids.reshape(-1).tolist()
    out = []
    for p, e in enumerate(ids):
        part = PlaneWeight(w.planes.qtype, w.rows, w.k,
                           {f: t.view(w.n_experts, w.rows, -1)[e] for f, t in w.planes.planes.items()})
        r = p // x_div
        row = Q8Act(xq.qs[r:r + 1], xq.d[r:r + 1], xq.s[r:r + 1], xq.isum[r:r + 1])
        out.append(mmvq_reference(None, part, xq=row).float())
    return torch.cat(out)
