"""Routed-expert decode GEMV with integer inner products: mmvq.py's arithmetic over the chosen experts.

moe_gemv.py rebuilds every weight as fp32 before an fp32 fma with x, as quant_gemv does; on the
H200 that read the experts at 0.5-0.9 TB/s (docs/performance.md, session 8's profile), where the
dense integer-dot GEMV (mmvq.py) reads its matrices near the copy bandwidth. Here x is quantized
once per projection to ggml's Q8_1 blocks (mmvq.quantize_q8_1: the token rows for gate/up, the
pairs' GLU outputs for down, the GLU folded into that quantization when it comes lazily), and
program (tile, p) takes the integer dots of rows tile*BLOCK_N.. of expert ids[p]'s matrix with x
row p // X_DIV, through mmvq's per-type step functions with one x row (ROWS=1): the same integer
sums and the same fp32 combination, in the same order, as mmvq_q8 on that expert's matrix alone.

NVFP4 experts (GGUF type 40; Hopper has no FP4 instructions) take the same road: each code word
holds 8 E2M1 codes (a sub-block's bytes j..j+3: elements j, j+8, j+1, j+9, ...), turned into 4+4
signed bytes (the codes' values doubled, ggml's kvalues) by byte-permute table lookups in
registers (`_e2m1_words`), dotted with x's Q8_1 codes stored in that same order
(quantize_q8_1(nv_order=True)); per 16-element sub-block the integer sum times its UE4M3 scale / 2
times x's block scale, in fp32.

The expert id is read from a device tensor, so nothing is decided on the host and the decode step
stays one CUDA graph; per pair one accumulator, no split K: a pair's output does not depend on the
other pairs of the launch (a verification row is bit for bit its decode step's).
Switch: TALLOW_MOE_MMVQ=0 (kernels/gpu/moe.py) takes moe_gemv's fp32 tiles instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import INTERPRETED, pdl
from .fp4_gemv import NVFP4, _ue4m3_half
from .mmvq import (MMVQ_TYPES, Q8Act, _BLOCK, _G_PER, _PLANES, _WORDS, _dp4a, _q4k_step, _q4x_step, _q6k_step, _q80_step,
                   mmvq_config, mmvq_reference)
from .moe_gemv import ExpertWeights
from .planes import PlaneWeight

__all__ = ["moe_mmvq", "moe_mmvq_reference", "moe_mmvq_config", "moe_mmvq_ok"]


def moe_mmvq_ok(w: ExpertWeights) -> bool:
    """Whether this stacked expert weight has an integer-dot kernel (a plane type of MMVQ_TYPES, or NVFP4)."""
    return (w.planes is not None and w.planes.qtype in MMVQ_TYPES) or (w.raw is not None and w.qtype == NVFP4)


@triton.jit
def _e2m1_half(c):
    """Portable: 4 E2M1 codes in the low 16 bits of c (nibble i -> byte i) -> int32 of 4 signed
    bytes, their doubled values (the interpreter's form of _e2m1_words' lookup, same integers)."""
    out = tl.zeros_like(c)
    for i in tl.static_range(4):
        n = (c >> (4 * i)) & 15
        mag = n & 7
        big = tl.where((mag & 1) == 1, 6, 4) << (tl.maximum(mag - 4, 0) >> 1)
        v = tl.where(mag < 4, mag, big)
        v = tl.where(n >= 8, -v, v)
        out |= (v & 255) << (8 * i)
    return out


@triton.jit
def _e2m1_words(w, ASM: tl.constexpr):
    """A word of 8 E2M1 codes -> (lo, hi): the values of nibbles 0-3 and 4-7 as 4 signed bytes each.
    ASM: three byte permutes per half (prmt: the value from the positive table -- the doubled
    E2M1 values 0, 1, 2, 3, 4, 6, 8, 12 as the bytes of two words -- and from the negative one for
    codes 8..15, then per byte the one its sign bit picks); else _e2m1_half's arithmetic."""
    if ASM:
        lo, hi = tl.inline_asm_elementwise(
            """{
            .reg .b32 s, p, n, t, a0, a1, b0, b1;
            mov.b32 a0, 0x03020100;
            mov.b32 a1, 0x0C080604;
            mov.b32 b0, 0xFDFEFF00;
            mov.b32 b1, 0xF4F8FAFC;
            and.b32 s, $2, 0x7777;
            prmt.b32 p, a0, a1, s;
            prmt.b32 n, b0, b1, s;
            shr.b32 t, $2, 1;
            and.b32 t, t, 0x4444;
            or.b32 t, t, 0x3210;
            prmt.b32 $0, p, n, t;
            shr.b32 s, $2, 16;
            and.b32 s, s, 0x7777;
            prmt.b32 p, a0, a1, s;
            prmt.b32 n, b0, b1, s;
            shr.b32 t, $2, 17;
            and.b32 t, t, 0x4444;
            or.b32 t, t, 0x3210;
            prmt.b32 $1, p, n, t;
            }""", "=r,=r,r", [w], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
        return lo, hi
    else:
        return _e2m1_half(w & 0xFFFF), _e2m1_half((w >> 16) & 0xFFFF)


@triton.jit
def _moe_nvfp4_kernel(w_ptr, wb_ptr, xq_ptr, d8_ptr, ids_ptr, y_ptr, sc_ptr, N, K, stride_ym, X_DIV, PART_ROWS,
                      BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr, ASM: tl.constexpr,
                      PARTS: tl.constexpr, PDL: tl.constexpr):
    # w_ptr: the raw blocks as int32 words (9 a block: the 4 scale bytes, then 8 code words, two
    # per sub-block); wb_ptr: the same bytes, for the scales. Per K step BLOCKS blocks.
    pid = tl.program_id(0)
    p = tl.program_id(1)
    pdl.wait(PDL)
    e = tl.load(ids_ptr + p).to(tl.int64)
    local = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = local < N
    local = tl.minimum(local, N - 1).to(tl.int64)
    rows = e * N + local
    nb = K // 64
    xr = (p // X_DIV).to(tl.int64)
    xq = xq_ptr + xr * (K // 4)
    d8 = d8_ptr + xr * (K // 32)
    u = tl.arange(0, 8)  # code word u of a block: sub-block u // 2, x words 2u and 2u + 1
    s = tl.arange(0, 4)
    acc = tl.zeros((BLOCK_N, BLOCKS, 4), dtype=tl.float32)
    for kb in tl.range(0, nb, BLOCKS, num_stages=STAGES):
        blk = kb + tl.arange(0, BLOCKS)
        ok = blk < nb
        blk = tl.where(ok, blk, 0)
        w = tl.load(w_ptr + rows[:, None, None] * (nb * 9) + blk[None, :, None] * 9 + 1 + u[None, None, :],
                    mask=ok[None, :, None], other=0)  # (BN, B, 8)
        lo, hi = _e2m1_words(w, ASM)
        xo = blk[:, None] * 16 + 2 * u[None, :]
        xl = tl.load(xq + xo, mask=ok[:, None], other=0)[None, :, :]
        xh = tl.load(xq + xo + 1, mask=ok[:, None], other=0)[None, :, :]
        prod = _dp4a(lo, xl, ASM) + _dp4a(hi, xh, ASM)  # (BN, B, 8), exact
        sumi = tl.sum(tl.reshape(prod, (BLOCK_N, BLOCKS, 4, 2)), axis=3)  # per sub-block
        sc = _ue4m3_half(tl.load(wb_ptr + rows[:, None, None] * (nb * 36) + blk[None, :, None] * 36 + s[None, None, :],
                                 mask=ok[None, :, None], other=0).to(tl.int32))  # (BN, B, 4)
        dx = tl.load(d8 + blk[:, None] * 2 + s[None, :] // 2, mask=ok[:, None], other=0.0).to(tl.float32)[None, :, :]
        acc = tl.fma(sc * dx, sumi.to(tl.float32), acc)
    tl.store(y_ptr + p.to(tl.int64) * stride_ym + local,
             _scaled(tl.sum(tl.sum(acc, axis=2), axis=1), sc_ptr, e, local, PART_ROWS, PARTS), mask=row_ok)


@triton.jit
def _scaled(y, sc_ptr, e, local, PART_ROWS, PARTS: tl.constexpr):
    """y times the expert's output scale of the part its rows belong to (PARTS 0: none; gate and
    up side by side: PARTS 2, PART_ROWS the width), one fp32 multiply as the torch ops it replaces."""
    if PARTS == 0:
        return y
    return y * tl.load(sc_ptr + e * PARTS + local // PART_ROWS)


@triton.jit
def _moe_mmvq_kernel(p0, p1, p2, p3, xq_ptr, d8_ptr, xs_ptr, s8_ptr, ids_ptr, y_ptr, sc_ptr, N, K, stride_ym, X_DIV,
                     PART_ROWS, QT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr,
                     BLOCK_K: tl.constexpr, G: tl.constexpr, DP4A: tl.constexpr, PARTS: tl.constexpr,
                     PDL: tl.constexpr):
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
    tl.store(y_ptr + p.to(tl.int64) * stride_ym + local, _scaled(tl.sum(acc0, axis=1), sc_ptr, e, local, PART_ROWS, PARTS),
             mask=row_ok)


# (BLOCK_N, BLOCKS, warps, stages): the H200 sweep's best for both of Gemma 4 26B's NVFP4 shapes
# (scripts/gpu_moe_mmvq.py --sweep, session 12: gate+up 18.7 µs, down 9.4 µs; (4, 2, 1, 3) 20.0 / 11.6)
NVFP4_CONFIG = (4, 4, 1, 2)


def moe_mmvq_config(qtype: str, rows: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCKS per K step, num_warps, num_stages): mmvq's configuration for one expert's
    (rows, k) shape, without K splits (the pairs already give rows/BLOCK_N x pairs programs:
    Qwen3-30B-A3B's gate+up 384 x 8), BLOCKS no more than the K blocks there are."""
    if qtype in ("Q4_K", "Q6_K"):
        # the H200 sweep (scripts/gpu_moe_mmvq.py --sweep, session 12): 8 rows a one-warp program,
        # no cp.async stages, the best for Qwen3-30B-A3B's and Gemma 4 26B's gate+up (8.4 / 10.8
        # µs against mmvq_config's 11.8 / 16.7) and the Q6_K down (7.3 against 13.7); the short
        # Q4_K down (K 768) 4 rows (6.05 against 6.48)
        return (8, 2, 1, 1) if qtype == "Q6_K" or k >= 2048 else (4, 2, 1, 1)
    block_n, blocks, warps, stages = mmvq_config(qtype, rows, k)[:4]
    nb = k // _BLOCK[qtype]
    while blocks > 1 and blocks > nb:
        blocks //= 2
    return block_n, blocks, warps, stages


def moe_mmvq(xq: Q8Act, w: ExpertWeights, ids: torch.Tensor, x_div: int, out: torch.Tensor | None = None,
             config=None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """y[p] = the integer-dot product of x row p // x_div (Q8_1, xq; for NVFP4 quantized with
    nv_order=True) with expert ids[p]'s matrix, for every pair p (ids (P,) on the device,
    M * x_div == P). Returns float32 (P, w.rows). `scale` (n_experts, parts) fp32: each output row
    times its expert's scale for the part (of `parts` equal row ranges) it lies in (the files'
    per-expert `.scale` tensors, applied in the launch instead of a gather and a multiply)."""
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
    dp4a = not (INTERPRETED or dev.type != "cuda")  # inline PTX needs a compiled kernel; same integers
    parts = 0 if scale is None else scale.shape[1]
    if scale is not None and (scale.shape[0] != w.n_experts or w.rows % parts or not scale.is_contiguous()):
        raise ValueError(f"moe_mmvq: scale {tuple(scale.shape)} does not split {w.n_experts} experts' {w.rows} rows.")
    sc = scale if scale is not None else out
    part_rows = w.rows // max(parts, 1)
    if w.raw is not None:  # NVFP4: x's codes must come in nv_order (quantize_q8_1(nv_order=True))
        block_n, blocks, warps, stages = tuple(config) if config is not None else NVFP4_CONFIG
        _moe_nvfp4_kernel[(triton.cdiv(w.rows, block_n), p_count)](
            w.raw.view(torch.int32), w.raw, xq.qs.view(torch.int32), xq.d, ids, out, sc, w.rows, w.k, out.stride(0), x_div,
            part_rows, BLOCK_N=block_n, BLOCKS=blocks, STAGES=stages, ASM=dp4a, PARTS=parts, num_warps=warps,
            **pdl.launch(dev))
        return out
    qtype = w.planes.qtype
    block_n, blocks, warps, stages = tuple(config) if config is not None else moe_mmvq_config(qtype, w.rows, w.k)
    planes = [w.planes.planes[name].view(torch.int32) if name in _WORDS[qtype] else w.planes.planes[name]
              for name in _PLANES[qtype]]
    planes += [planes[0]] * (4 - len(planes))
    _moe_mmvq_kernel[(triton.cdiv(w.rows, block_n), p_count)](
        *planes, xq.qs.view(torch.int32), xq.d, xq.isum, xq.s, ids, out, sc, w.rows, w.k, out.stride(0), x_div,
        part_rows, QT=MMVQ_TYPES.index(qtype), BLOCK_N=block_n, BLOCKS=blocks, STAGES=stages, BLOCK_K=_BLOCK[qtype],
        G=blocks * _G_PER[qtype], DP4A=dp4a, PARTS=parts, num_warps=warps, **pdl.launch(dev))
    return out


def _nvfp4_reference(xq: Q8Act, w: ExpertWeights, ids: list[int], x_div: int) -> torch.Tensor:
    """float64: per pair and 16-element sub-block, the exact integer dot of the doubled codes with
    x's natural-order codes, times UE4M3 / 2 times x's block scale, summed."""
    from ...quant.fp4 import KVALUES, ue4m3_half

    nb = w.k // 64
    blocks = w.raw.view(w.n_experts, w.rows, nb, 36)
    out = []
    for p, e in enumerate(ids):
        b = blocks[e].to(torch.int64)  # (rows, nb, 36)
        q = b[..., 4:].reshape(w.rows, nb, 4, 8)
        codes = KVALUES.to(b.device)[torch.cat((q & 15, q >> 4), dim=-1)].double()  # (rows, nb, 4, 16)
        x = xq.qs[p // x_div].double().reshape(nb, 4, 16)
        sumi = (codes * x).sum(-1)  # exact
        sc = ue4m3_half(b[..., :4].to(torch.uint8)).double()  # (rows, nb, 4)
        d8 = xq.d[p // x_div].double().reshape(nb, 2).repeat_interleave(2, dim=1)  # (nb, 4)
        out.append((sc * d8 * sumi).sum((1, 2)).float()[None])
    return torch.cat(out)


def moe_mmvq_reference(xq: Q8Act, w: ExpertWeights, ids: torch.Tensor, x_div: int,
                       scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per pair, mmvq_reference (float64, exact integer dots) of the chosen expert's planes and its
    x row's Q8_1 blocks (natural order, also for NVFP4) -> float32 (P, rows), times `scale` as
    moe_mmvq applies it."""
    if scale is not None:
        y = moe_mmvq_reference(xq, w, ids, x_div)
        parts = scale.shape[1]
        return (y.view(y.shape[0], parts, -1) * scale[ids.reshape(-1).long()].view(-1, parts, 1)).view_as(y)
    ids = ids.reshape(-1).tolist()
    if w.raw is not None:
        return _nvfp4_reference(xq, w, ids, x_div)
    out = []
    for p, e in enumerate(ids):
        part = PlaneWeight(w.planes.qtype, w.rows, w.k,
                           {f: t.view(w.n_experts, w.rows, -1)[e] for f, t in w.planes.planes.items()})
        r = p // x_div
        row = Q8Act(xq.qs[r:r + 1], xq.d[r:r + 1], xq.s[r:r + 1], xq.isum[r:r + 1])
        out.append(mmvq_reference(None, part, xq=row).float())
    return torch.cat(out)
