"""Decode GEMV with integer inner products, llama.cpp's CUDA MMVQ arithmetic: y = x @ W^T, M <= 8.

Why. quant_gemv.py rebuilds every weight as fp32 (unpack, int->float, scale fma, min) before its
fp32 fma with x: 6-14 SASS instructions per weight in its K loop (scripts/gemv_sass_count.py),
so on the H200 it is instruction-bound, well under the memory bandwidth (docs/performance.md);
the integer dots here take 1.3-4. ggml's CUDA backend instead quantizes x once
per product to Q8_1 (32-element blocks of int8 codes with an fp16 scale) and takes integer dot
products of weight codes with x codes (dp4a: 4 int8 products and their sum in one instruction),
applying the weight's sub-block scale and min once per 32 elements (16 for Q6_K).

Two launches:
  quantize_q8_1  x (M, K) fp32 -> Q8Act: codes int8 (M, K), d fp16 (M, K/32) and ggml's fp32
                 sum (as fp16) per 32, plus the integer code sums per 16 (what the min and
                 offset terms below multiply; ggml recomputes them with a dp4a against 0x01010101).
  mmvq_q8        the GEMV over the byte planes (planes.py) read as int32 words: Q4_K, Q6_K, Q8_0,
                 Q4_0, Q4_1, Q5_0.

Arithmetic per row n and x row m, as vecdotq.cuh combines it:
  Q4_K, block b, sub-block s (32 elements, 6-bit scale sc and min mn):
      d * sum_s d8_s * (sumi_s * sc_s) - dmin * sum_s d8_s * (xsum_s * mn_s)
      sumi_s = sum_j q_j * xq_j (q 0..15), xsum_s = sum_j xq_j: exact int32
  Q6_K, block b, 16-element group t (int8 scale sc_t):
      d * sum_t d8_t * (sumi_t * sc_t),  sumi_t = sum_j (q_j - 32) * xq_j
      computed as sum_j q_j * xq_j - 32 * xsum_t (q 0..63 fits a signed byte, so one dp4a)
  Q8_0, block b (32 int8 codes, fp16 d):  (d * d8) * sumi
  Q4_0 / Q5_0 (codes 0..15 / 0..31, offset 8 / 16):  d * (sumi * d8 - offset * s8), s8 = x's fp32
      block sum (as fp16);  Q4_1:  sumi * fp16(d * d8) + fp16(m * s8)
The integer parts are exact; the combination is fp32 in a fixed order with explicit fmas (never
left to the compiler's contraction, whose choice varied with ROWS); the split-K merge (as
quant_gemv's, ticketed, in split order) keeps results deterministic and row m of an M-row product
bit for bit its one-row product.

Numerics versus quant_gemv: x is rounded to 8 bits per 32-element block (|error| <= amax/254 per
element), as llama.cpp's CUDA build does -- not its CPU build, whose Q8_K/Q8_0 activations differ.
The quantization rounds like ggml's quantize_q8_1 (d = amax/127, q = roundf(x/d), sum in the
warp's butterfly order) but with IEEE division, where llama.cpp compiles with -use_fast_math
(approximate division): a code can differ where x/d sits within an ulp of a .5 tie.

DP4A (constexpr): True issues PTX dp4a through inline asm (compiled GPU only); False takes the
same dot as four int32 multiply-adds of sign-extended bytes (portable: the interpreter, and the
"int32 multiply-reduce" variant the GPU benchmark compares).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ... import switches
from . import INTERPRETED, pdl
from .planes import PlaneWeight, _nib
from .quant_gemv import TICKET_SLOTS, Prologue, _finish_rows, _prologue, _q4_k_scale_min, _tickets, _x, epilogue_addend
from .rmsnorm import _geometry as _norm_geometry
from .rmsnorm import _norm_add_row, _rstd

__all__ = ["Q8Act", "quantize_q8_1", "quantize_q8_1_reference", "nv_order_reference", "mmvq", "mmvq_q8", "mmvq_reference",
           "mmvq_config", "MMVQ_TYPES", "rmsnorm_add_q8"]

MMVQ_TYPES = ("Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0")


@dataclass
class Q8Act:
    """x (M, K) as ggml's Q8_1 blocks, one plane per field (see the module docstring)."""

    qs: torch.Tensor  # int8 (M, K)
    d: torch.Tensor  # fp16 (M, K/32): amax / 127
    s: torch.Tensor  # fp16 (M, K/32): the fp32 sum of the block's x (ggml's ds.y; unused by Q4_K/Q6_K)
    isum: torch.Tensor  # int32 (M, K/16): sums of the codes per 16

    @classmethod
    def empty(cls, m: int, k: int, device) -> "Q8Act":
        """Buffers for M rows of K elements, to be written by a quantizing kernel."""
        return cls(torch.empty((m, k), dtype=torch.int8, device=device),
                   torch.empty((m, k // 32), dtype=torch.float16, device=device),
                   torch.empty((m, k // 32), dtype=torch.float16, device=device),
                   torch.empty((m, k // 16), dtype=torch.int32, device=device))


# ------------------------------------------------------------------------------------------
# x -> Q8_1
# ------------------------------------------------------------------------------------------

@triton.jit
def _roundf(v):
    """C's roundf (half away from zero), exact: v - trunc(v) is exact for |v| < 2^23."""
    t = v.to(tl.int32)  # truncates toward zero
    r = v - t.to(tl.float32)
    return t + (r >= 0.5).to(tl.int32) - (r <= -0.5).to(tl.int32)


@triton.jit
def _store_q8_1(v, m, blk, j, ok, K, nblk, q_ptr, d_ptr, sb_ptr, i_ptr, BLK: tl.constexpr, NV_ORDER: tl.constexpr):
    """Row m's blocks blk of v (BLK, 32) as Q8_1: codes, scales, block sums and the codes' half-block sums."""
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
    # NV_ORDER: each 16 codes as 0, 8, 1, 9, ..., 7, 15 -- the order of NVFP4's nibbles (moe_mmvq.py)
    if NV_ORDER:
        pos = (j % 8) * 2 + (j % 16) // 8 + (j // 16) * 16
    else:
        pos = j
    tl.store(q_ptr + m * K + blk[:, None] * 32 + pos[None, :], q.to(tl.int8), mask=ok[:, None])
    tl.store(d_ptr + m * nblk + blk, d.to(tl.float16), mask=ok)
    tl.store(sb_ptr + m * nblk + blk, s.to(tl.float16), mask=ok)
    isum = tl.sum(tl.reshape(q, (BLK, 2, 16)), axis=2)  # (BLK, 2)
    h = tl.arange(0, 2)
    tl.store(i_ptr + m * (K // 16) + blk[:, None] * 2 + h[None, :], isum, mask=ok[:, None])


@triton.jit
def _q8_1_kernel(x_ptr, a_ptr, w_ptr, s_ptr, q_ptr, d_ptr, sb_ptr, i_ptr, K, stride_xm, stride_am, stride_sm, eps,
                 BLK: tl.constexpr, PRO: tl.constexpr, WRITE_SUM: tl.constexpr, PDL: tl.constexpr,
                 NV_ORDER: tl.constexpr = False):
    # PRO: quant_gemv's prologue codes (0 x as given, 1/2 RMSNorm with/without the residual add,
    # 3/4 SwiGLU/GeGLU of x's two halves): the op before the product, applied as x is loaded.
    # A norm needs the whole row's 1/RMS: every program of the row computes it (the row is a
    # few KB, in L2), and the row's first program writes the residual sum.
    m = tl.program_id(0)
    blk = tl.program_id(1) * BLK + tl.arange(0, BLK)
    j = tl.arange(0, 32)
    nblk = K // 32
    ok = blk < nblk
    pdl.wait(PDL)
    x_row = x_ptr + m * stride_xm
    rstd = _prologue(x_row, a_ptr + m * stride_am, s_ptr + m * stride_sm, K, eps, tl.program_id(1) == 0,
                     PRO, WRITE_SUM)
    v = _x(x_row, a_ptr + m * stride_am, w_ptr, blk[:, None] * 32 + j[None, :], ok[:, None], rstd, K, PRO)
    _store_q8_1(v, m, blk, j, ok, K, nblk, q_ptr, d_ptr, sb_ptr, i_ptr, BLK, NV_ORDER)


@triton.jit
def _q8_1_norm_kernel(x_ptr, a_ptr, w_ptr, s_ptr, q_ptr, d_ptr, sb_ptr, i_ptr, K, stride_xm, stride_am, stride_sm, eps,
                      BLK: tl.constexpr, ROW: tl.constexpr, HAS_RES: tl.constexpr, WRITE_SUM: tl.constexpr,
                      PDL: tl.constexpr, NV_ORDER: tl.constexpr = False):
    # The norm-folded quantization in one pass over memory (TALLOW_Q8_NORM_ONE_PASS). The chunked
    # kernel above walks the row in 1024-element steps for its 1/RMS, one dependent memory round
    # trip per step, in every program of the row (4.1-4.4 µs a launch for qwen3-4b's 2560 in
    # session 11's no-PDL profile, where the one-pass RMSNorm took ~2). Here every load is issued
    # at once: program (m, p) quantizes blocks p*BLK.. of row m and takes the 1/RMS from the whole
    # row (ROW >= K elements) loaded beside them. ROW == 0: one program holds the whole row as BLK
    # blocks and takes the 1/RMS from those (no second load).
    m = tl.program_id(0)
    blk = tl.program_id(1) * BLK + tl.arange(0, BLK)
    j = tl.arange(0, 32)
    nblk = K // 32
    ok = blk < nblk
    offs = blk[:, None] * 32 + j[None, :]
    # the norm weight is never written inside a step: load it before waiting for the kernel ahead
    w = tl.load(w_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    pdl.wait(PDL)
    v = tl.load(x_ptr + m * stride_xm + offs, mask=ok[:, None], other=0.0).to(tl.float32)
    if HAS_RES:
        v += tl.load(a_ptr + m * stride_am + offs, mask=ok[:, None], other=0.0).to(tl.float32)
        if WRITE_SUM:  # each program its own blocks of the new residual stream
            tl.store(s_ptr + m * stride_sm + offs, v, mask=ok[:, None])
    if ROW > 0:
        e = tl.arange(0, ROW)
        r = tl.load(x_ptr + m * stride_xm + e, mask=e < K, other=0.0).to(tl.float32)
        if HAS_RES:
            r += tl.load(a_ptr + m * stride_am + e, mask=e < K, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(r * r, axis=0) / K + eps)
    else:
        rstd = 1.0 / tl.sqrt(tl.sum(tl.sum(v * v, axis=1), axis=0) / K + eps)
    v = (v * rstd) * w  # rmsnorm.py's order: the normed value times the weight
    _store_q8_1(v, m, blk, j, ok, K, nblk, q_ptr, d_ptr, sb_ptr, i_ptr, BLK, NV_ORDER)


NORM_ONE_PASS_MAX = 8192  # row elements loaded at once by _q8_1_norm_kernel (rmsnorm.py's ONE_PASS_MAX)


NORM_ONE_PASS_MIN = 1025  # narrower rows keep the chunked kernel (one chunk there already): see below


def _norm_q8_config(k: int) -> tuple[int, int]:
    """(blocks per program, 0 for the whole row in one; warps) of the one-pass norm quantization.
    From the H200 (scripts/gpu_q8_norm.py, session 13): 8 blocks a program, as the chunked kernel
    spreads them, each program loading the whole row for its 1/RMS beside its own blocks (1.7 µs
    at 2560 against the chunked kernel's 2.6; one program per row was slower, 3.4). Rows up to
    1024 (smollm2, gemma3: a single chunk, so no serial walk to remove) stay on the chunked
    kernel: the one-pass one timed faster alone there (1.6-1.9 µs against 2.2), but no decode gain
    could be measured (the smollm2 twin's -2..3% with it stayed when both settings ran the same
    kernel: the A/B's own noise, docs/performance.md session 13)."""
    return 8, 4


def quantize_q8_1(x: torch.Tensor, out: Q8Act | None = None, prologue: Prologue | None = None,
                  nv_order: bool = False, norm_config: tuple[int, int] | None = None) -> Q8Act:
    """x float32/16 (M, K), K a multiple of 32 -> Q8Act. `out` reuses buffers (CUDA graphs).
    With a `prologue` (quant_gemv.Prologue), the codes are those of prologue(x) (x (M, 2K) for a
    GLU), as quant_gemv computes it; a norm's `sum_out` receives x + residual. `nv_order`: the
    codes of each 16 stored as 0, 8, 1, 9, ..., 7, 15 (nv_order_reference), the NVFP4 GEMV's x.
    A norm over rows up to NORM_ONE_PASS_MAX runs in one pass over memory (`norm_config`, (blocks
    per program or 0 for a whole row, warps), overrides _norm_q8_config, for sweeps;
    TALLOW_Q8_NORM_ONE_PASS=0: the chunked kernel)."""
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    pro = prologue.code if prologue is not None else 0
    m, k = x2.shape
    if pro >= 3:
        k //= 2
    if k % 32:
        raise ValueError(f"quantize_q8_1 wants K a multiple of 32, got {k}.")
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    dev = x2.device
    if out is None:
        out = Q8Act.empty(m, k, dev)
    a = prologue.residual if pro == 1 else x2
    wt = prologue.weight if pro in (1, 2) else x2
    sum_out = prologue.sum_out if pro == 1 else None
    s_t = sum_out if sum_out is not None else x2
    if (pro in (1, 2) and (NORM_ONE_PASS_MIN <= k <= NORM_ONE_PASS_MAX or norm_config is not None)
            and switches.enabled("TALLOW_Q8_NORM_ONE_PASS")):
        per, nw = _norm_q8_config(k)
        per, nw = norm_config if norm_config is not None else (per, nw)
        nblk = k // 32
        per, row = (triton.next_power_of_2(nblk), 0) if per == 0 or per >= nblk else (per, triton.next_power_of_2(k))
        _q8_1_norm_kernel[(m, triton.cdiv(nblk, per))](
            x2, a, wt, s_t, out.qs, out.d, out.s, out.isum, k, x2.stride(0), a.stride(0), s_t.stride(0),
            float(prologue.eps), BLK=per, ROW=row, HAS_RES=pro == 1, WRITE_SUM=sum_out is not None,
            NV_ORDER=nv_order, num_warps=nw, **pdl.launch(dev))
        return out
    blk = 8
    _q8_1_kernel[(m, triton.cdiv(k // 32, blk))](
        x2, a, wt, s_t, out.qs, out.d, out.s, out.isum, k, x2.stride(0), a.stride(0), s_t.stride(0),
        float(prologue.eps) if prologue is not None else 0.0, BLK=blk, PRO=pro, WRITE_SUM=sum_out is not None,
        NV_ORDER=nv_order, num_warps=2, **pdl.launch(dev))
    return out


@triton.jit
def _rmsnorm_add_q8_kernel(x_ptr, res_ptr, w_ptr, scale_ptr, y_ptr, w2_ptr, h_ptr, q_ptr, d_ptr, sb_ptr, i_ptr, D, eps,
                           sxm, srm, sym, shm, HAS_SCALE: tl.constexpr, BLOCK: tl.constexpr, RELOAD: tl.constexpr,
                           PDL: tl.constexpr):
    # rmsnorm.py's _rmsnorm_add_kernel (ONE_PASS, NORM2), the same operations in the same order at
    # the same BLOCK and warps (so the same 1/RMS bits), then the normed row h as Q8_1 blocks: the
    # quantization the integer-dot GEMV reading h would otherwise launch on its own
    # (TALLOW_NORM_ADD_Q8). h is still written (a consumer on the fp32 GEMV reads it).
    row = tl.program_id(0)
    e = tl.arange(0, BLOCK)
    msk = e < D
    # the norm weights are never written inside a step: loaded before waiting for the kernel ahead
    w = tl.load(w_ptr + e, mask=msk, other=0.0).to(tl.float32)
    w2 = tl.load(w2_ptr + e, mask=msk, other=0.0).to(tl.float32)
    pdl.wait(PDL)
    r = tl.load(res_ptr + row * srm + e, mask=msk, other=0.0).to(tl.float32)
    v = tl.load(x_ptr + row * sxm + e, mask=msk, other=0.0).to(tl.float32)
    y = _norm_add_row(v, r, w, scale_ptr, D, eps, HAS_SCALE)
    tl.store(y_ptr + row * sym + e, y, mask=msk)
    h = (y * _rstd(y, D, eps)) * w2
    tl.store(h_ptr + row * shm + e, h, mask=msk)
    blk = tl.arange(0, BLOCK // 32)
    j = tl.arange(0, 32)
    ok = blk < D // 32
    if RELOAD:  # h read back as (blocks, 32) from where this program wrote it, not reshaped in registers
        tl.debug_barrier()
        h2 = tl.load(h_ptr + row * shm + blk[:, None] * 32 + j[None, :], mask=ok[:, None], other=0.0)
    else:
        h2 = tl.reshape(h, (BLOCK // 32, 32))
    _store_q8_1(h2, row, blk, j, ok, D, D // 32, q_ptr, d_ptr, sb_ptr, i_ptr, BLOCK // 32, False)


NORM_ADD_Q8_RELOAD = False  # the blocks from h re-read (L1) rather than h reshaped in registers (scripts/gpu_norm_add_q8.py)


def rmsnorm_add_q8(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor, next_weight: torch.Tensor,
                   scale: torch.Tensor | None = None, out: torch.Tensor | None = None, reload: bool | None = None):
    """rmsnorm.rmsnorm_add(x, weight, eps, residual, scale, out, next_weight) -> (out, h), and h's
    Q8_1 blocks (Q8Act, the bytes quantize_q8_1(h) writes) from the same launch: (out, h, q8).
    None where that launch cannot take the row (the norm's chunked loop: rows over ONE_PASS_MAX or
    TALLOW_NORM_ONE_PASS=0; K not a multiple of 32): the caller runs rmsnorm_add. `reload`: the
    blocks quantized from h read back from memory as (blocks, 32) (default NORM_ADD_Q8_RELOAD),
    else h reshaped in registers; the bytes are the same either way."""
    m, d = x.shape
    block, warps, one_pass = _norm_geometry(d)
    if not one_pass or d % 32 or d < 32 or x.stride(1) != 1 or residual.stride(1) != 1:
        return None
    dev = x.device
    if out is None:
        out = torch.empty((m, d), dtype=torch.float32, device=dev)
    h = torch.empty((m, d), dtype=torch.float32, device=dev)
    q8 = Q8Act.empty(m, d, dev)
    _rmsnorm_add_q8_kernel[(m,)](x, residual, weight, scale if scale is not None else weight, out, next_weight, h,
                                 q8.qs, q8.d, q8.s, q8.isum, d, float(eps), x.stride(0), residual.stride(0),
                                 out.stride(0), h.stride(0), HAS_SCALE=scale is not None, BLOCK=block,
                                 RELOAD=NORM_ADD_Q8_RELOAD if reload is None else reload, num_warps=warps,
                                 **pdl.launch(dev))
    return out, h, q8


def nv_order_reference(qs: torch.Tensor) -> torch.Tensor:
    """Codes (M, K) in natural order -> each 16 as 0, 8, 1, 9, ..., 7, 15 (quantize_q8_1's nv_order)."""
    m, k = qs.shape
    return qs.reshape(m, k // 16, 2, 8).transpose(2, 3).reshape(m, k).contiguous()


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


# ------------------------------------------------------------------------------------------
# The GEMV
# ------------------------------------------------------------------------------------------

@triton.jit
def _dp4a(a, b, DP4A: tl.constexpr):
    """Per int32 lane: the sum of the four signed-byte products of a and b."""
    if DP4A:
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r",
                                         [a, b, tl.zeros_like(a)], dtype=tl.int32, is_pure=True, pack=1)
    else:
        p = ((a << 24) >> 24) * ((b << 24) >> 24)
        p += ((a << 16) >> 24) * ((b << 16) >> 24)
        p += ((a << 8) >> 24) * ((b << 8) >> 24)
        p += (a >> 24) * (b >> 24)
        return p


# Q4_K, per K step of BLOCKS blocks: G = BLOCKS*4 chunks of 32 code bytes (8 int32 words).
# Chunk c, word t: low nibbles are elements c*64 + 4t..4t+3 (sub-block 2c), high nibbles
# c*64 + 32 + 4t.. (sub-block 2c+1); in x's int32 words: c*16 + t and c*16 + 8 + t.
@triton.jit
def _q4k_row(acc, wl, wh, d, dmin, sc_lo, mn_lo, sc_hi, mn_hi, xq_ptr, d8_ptr, xs_ptr, K, chunk, t, ok,
             r: tl.constexpr, ROWS: tl.constexpr, DP4A: tl.constexpr):
    if r < ROWS:
        xrow = xq_ptr + r * (K // 4) + chunk[:, None] * 16 + t[None, :]
        xl = tl.load(xrow, mask=ok[:, None], other=0)
        xh = tl.load(xrow + 8, mask=ok[:, None], other=0)
        il = tl.sum(_dp4a(wl, xl[None, :, :], DP4A), axis=2)  # (BN, G) exact
        ih = tl.sum(_dp4a(wh, xh[None, :, :], DP4A), axis=2)
        d8l = tl.load(d8_ptr + r * (K // 32) + chunk * 2, mask=ok, other=0.0).to(tl.float32)[None, :]
        d8h = tl.load(d8_ptr + r * (K // 32) + chunk * 2 + 1, mask=ok, other=0.0).to(tl.float32)[None, :]
        srow = xs_ptr + r * (K // 16) + chunk * 4
        sl = (tl.load(srow, mask=ok, other=0) + tl.load(srow + 1, mask=ok, other=0))[None, :]
        sh = (tl.load(srow + 2, mask=ok, other=0) + tl.load(srow + 3, mask=ok, other=0))[None, :]
        # explicit fmas: a sum of two products left to the compiler's contraction may fuse either
        # one, and did so differently for different ROWS (row r of an M-row product then missed
        # its one-row product on the H200)
        sum_d = tl.fma(d8l, (il * sc_lo).to(tl.float32), d8h * (ih * sc_hi).to(tl.float32))
        sum_m = tl.fma(d8l, (sl * mn_lo).to(tl.float32), d8h * (sh * mn_hi).to(tl.float32))
        acc += tl.fma(d, sum_d, -(dmin * sum_m))
    return acc


@triton.jit
def _q4k_step(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, qs_ptr, sc_ptr, dm_ptr, xq_ptr, d8_ptr, xs_ptr,
              rows, kb, nb, kend, K, G: tl.constexpr, ROWS: tl.constexpr, DP4A: tl.constexpr):
    g = tl.arange(0, G)
    t = tl.arange(0, 8)
    chunk = kb * 4 + g
    ok = chunk < kend * 4
    chunk = tl.where(ok, chunk, 0)
    blk = chunk // 4
    w = tl.load(qs_ptr + rows[:, None, None] * (nb * 32) + chunk[None, :, None] * 8 + t[None, None, :],
                mask=ok[None, :, None], other=0)  # (BN, G, 8) int32 words
    wl = w & 0x0F0F0F0F
    wh = (w >> 4) & 0x0F0F0F0F
    d = tl.load(dm_ptr + rows[:, None] * (nb * 2) + blk[None, :] * 2).to(tl.float32)
    dmin = tl.load(dm_ptr + rows[:, None] * (nb * 2) + blk[None, :] * 2 + 1).to(tl.float32)
    # 6-bit scale/min of sub-blocks s_lo = 2*(chunk%4) and s_hi = s_lo + 1 (ggml's get_scale_min_k4)
    sbase = sc_ptr + rows[:, None] * (nb * 12) + blk[None, :] * 12
    s_lo = (chunk % 4) * 2
    s_hi = s_lo + 1
    low = s_lo[None, :] < 4
    sc_lo, mn_lo, sc_hi, mn_hi = _q4_k_scale_min(sbase, s_lo, s_hi, low)
    acc0 = _q4k_row(acc0, wl, wh, d, dmin, sc_lo, mn_lo, sc_hi, mn_hi, xq_ptr, d8_ptr, xs_ptr, K, chunk, t, ok, 0, ROWS, DP4A)
    acc1 = _q4k_row(acc1, wl, wh, d, dmin, sc_lo, mn_lo, sc_hi, mn_hi, xq_ptr, d8_ptr, xs_ptr, K, chunk, t, ok, 1, ROWS, DP4A)
    acc2 = _q4k_row(acc2, wl, wh, d, dmin, sc_lo, mn_lo, sc_hi, mn_hi, xq_ptr, d8_ptr, xs_ptr, K, chunk, t, ok, 2, ROWS, DP4A)
    acc3 = _q4k_row(acc3, wl, wh, d, dmin, sc_lo, mn_lo, sc_hi, mn_hi, xq_ptr, d8_ptr, xs_ptr, K, chunk, t, ok, 3, ROWS, DP4A)
    acc4 = _q4k_row(acc4, wl, wh, d, dmin, sc_lo, mn_lo, sc_hi, mn_hi, xq_ptr, d8_ptr, xs_ptr, K, chunk, t, ok, 4, ROWS, DP4A)
    acc5 = _q4k_row(acc5, wl, wh, d, dmin, sc_lo, mn_lo, sc_hi, mn_hi, xq_ptr, d8_ptr, xs_ptr, K, chunk, t, ok, 5, ROWS, DP4A)
    acc6 = _q4k_row(acc6, wl, wh, d, dmin, sc_lo, mn_lo, sc_hi, mn_hi, xq_ptr, d8_ptr, xs_ptr, K, chunk, t, ok, 6, ROWS, DP4A)
    acc7 = _q4k_row(acc7, wl, wh, d, dmin, sc_lo, mn_lo, sc_hi, mn_hi, xq_ptr, d8_ptr, xs_ptr, K, chunk, t, ok, 7, ROWS, DP4A)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


# Q6_K, per K step of BLOCKS blocks: H = BLOCKS*4 quarters. Quarter h = 2*gh + hh of half-block
# gh (128 elements), word tt (0..3): ql words gh*16 + hh*4 + tt (parts 0 and 2 of the half, low
# and high nibbles) and +8 (parts 1 and 3); qh word gh*8 + hh*4 + tt holds 2 bits of each part.
# Part p's 4 elements are gh*128 + p*32 + hh*16 + 4tt..: x word gh*32 + p*8 + hh*4 + tt, scale
# and code-sum index gh*8 + p*2 + hh, d8 index gh*4 + p.
@triton.jit
def _q6k_part(s, v, sc, d8_ptr, xq_ptr, xs_ptr, xword, sidx, gh, ok, p: tl.constexpr, DP4A: tl.constexpr):
    """s + d8 * (sumi * sc) for part p (an explicit fma: see _q4k_row); part 0 starts the sum."""
    x = tl.load(xq_ptr + xword + p * 8, mask=ok[:, None], other=0)  # (H, 4)
    xs = tl.load(xs_ptr + sidx + p * 2, mask=ok, other=0)[None, :]
    d8 = tl.load(d8_ptr + gh * 4 + p, mask=ok, other=0.0).to(tl.float32)[None, :]
    sumi = tl.sum(_dp4a(v, x[None, :, :], DP4A), axis=2) - 32 * xs  # sum (q - 32) * xq, exact
    if p == 0:
        return d8 * (sumi * sc).to(tl.float32)
    return tl.fma(d8, (sumi * sc).to(tl.float32), s)


@triton.jit
def _q6k_row(acc, v0, v1, v2, v3, sc0, sc1, sc2, sc3, d, xq_ptr, d8_ptr, xs_ptr, K, gh, hh, tt, ok,
             r: tl.constexpr, ROWS: tl.constexpr, DP4A: tl.constexpr):
    if r < ROWS:
        xq = xq_ptr + r * (K // 4)
        xs = xs_ptr + r * (K // 16)
        d8 = d8_ptr + r * (K // 32)
        xword = (gh * 32 + hh * 4)[:, None] + tt[None, :]
        sidx = gh * 8 + hh
        s = _q6k_part(acc, v0, sc0, d8, xq, xs, xword, sidx, gh, ok, 0, DP4A)
        s = _q6k_part(s, v1, sc1, d8, xq, xs, xword, sidx, gh, ok, 1, DP4A)
        s = _q6k_part(s, v2, sc2, d8, xq, xs, xword, sidx, gh, ok, 2, DP4A)
        s = _q6k_part(s, v3, sc3, d8, xq, xs, xword, sidx, gh, ok, 3, DP4A)
        acc = tl.fma(d, s, acc)
    return acc


@triton.jit
def _q6k_step(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, ql_ptr, qh_ptr, sc_ptr, d_ptr, xq_ptr, d8_ptr, xs_ptr,
              rows, kb, nb, kend, K, H: tl.constexpr, ROWS: tl.constexpr, DP4A: tl.constexpr):
    h = kb * 4 + tl.arange(0, H)
    tt = tl.arange(0, 4)
    ok = h < kend * 4
    h = tl.where(ok, h, 0)
    gh = h // 2
    hh = h % 2
    m3 = ok[None, :, None]
    lw = ql_ptr + rows[:, None, None] * (nb * 32) + (gh * 16 + hh * 4)[None, :, None] + tt[None, None, :]
    a = tl.load(lw, mask=m3, other=0)
    b = tl.load(lw + 8, mask=m3, other=0)
    qh = tl.load(qh_ptr + rows[:, None, None] * (nb * 16) + (gh * 8 + hh * 4)[None, :, None] + tt[None, None, :],
                 mask=m3, other=0)
    v0 = (a & 0x0F0F0F0F) | ((qh << 4) & 0x30303030)  # codes 0..63, one per byte
    v1 = (b & 0x0F0F0F0F) | ((qh << 2) & 0x30303030)
    v2 = ((a >> 4) & 0x0F0F0F0F) | (qh & 0x30303030)
    v3 = ((b >> 4) & 0x0F0F0F0F) | ((qh >> 2) & 0x30303030)
    srow = sc_ptr + rows[:, None] * (nb * 16) + (gh * 8 + hh)[None, :]
    sc0 = tl.load(srow).to(tl.int32)
    sc1 = tl.load(srow + 2).to(tl.int32)
    sc2 = tl.load(srow + 4).to(tl.int32)
    sc3 = tl.load(srow + 6).to(tl.int32)
    d = tl.load(d_ptr + rows[:, None] * nb + (gh // 2)[None, :]).to(tl.float32)
    acc0 = _q6k_row(acc0, v0, v1, v2, v3, sc0, sc1, sc2, sc3, d, xq_ptr, d8_ptr, xs_ptr, K, gh, hh, tt, ok, 0, ROWS, DP4A)
    acc1 = _q6k_row(acc1, v0, v1, v2, v3, sc0, sc1, sc2, sc3, d, xq_ptr, d8_ptr, xs_ptr, K, gh, hh, tt, ok, 1, ROWS, DP4A)
    acc2 = _q6k_row(acc2, v0, v1, v2, v3, sc0, sc1, sc2, sc3, d, xq_ptr, d8_ptr, xs_ptr, K, gh, hh, tt, ok, 2, ROWS, DP4A)
    acc3 = _q6k_row(acc3, v0, v1, v2, v3, sc0, sc1, sc2, sc3, d, xq_ptr, d8_ptr, xs_ptr, K, gh, hh, tt, ok, 3, ROWS, DP4A)
    acc4 = _q6k_row(acc4, v0, v1, v2, v3, sc0, sc1, sc2, sc3, d, xq_ptr, d8_ptr, xs_ptr, K, gh, hh, tt, ok, 4, ROWS, DP4A)
    acc5 = _q6k_row(acc5, v0, v1, v2, v3, sc0, sc1, sc2, sc3, d, xq_ptr, d8_ptr, xs_ptr, K, gh, hh, tt, ok, 5, ROWS, DP4A)
    acc6 = _q6k_row(acc6, v0, v1, v2, v3, sc0, sc1, sc2, sc3, d, xq_ptr, d8_ptr, xs_ptr, K, gh, hh, tt, ok, 6, ROWS, DP4A)
    acc7 = _q6k_row(acc7, v0, v1, v2, v3, sc0, sc1, sc2, sc3, d, xq_ptr, d8_ptr, xs_ptr, K, gh, hh, tt, ok, 7, ROWS, DP4A)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


# Q8_0, per K step of BLOCKS blocks of 32 int8 codes (8 words): y += (d * d8) * sumi per block,
# as vec_dot_q8_0_q8_1.
@triton.jit
def _q80_row(acc, w, d, xq_ptr, d8_ptr, K, blk, t, ok, r: tl.constexpr, ROWS: tl.constexpr, DP4A: tl.constexpr):
    if r < ROWS:
        x = tl.load(xq_ptr + r * (K // 4) + blk[:, None] * 8 + t[None, :], mask=ok[:, None], other=0)
        d8 = tl.load(d8_ptr + r * (K // 32) + blk, mask=ok, other=0.0).to(tl.float32)[None, :]
        sumi = tl.sum(_dp4a(w, x[None, :, :], DP4A), axis=2)
        acc = tl.fma(d * d8, sumi.to(tl.float32), acc)
    return acc


@triton.jit
def _q80_step(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, qs_ptr, d_ptr, xq_ptr, d8_ptr,
              rows, kb, nb, kend, K, G: tl.constexpr, ROWS: tl.constexpr, DP4A: tl.constexpr):
    blk = kb + tl.arange(0, G)
    t = tl.arange(0, 8)
    ok = blk < kend
    blk = tl.where(ok, blk, 0)
    w = tl.load(qs_ptr + rows[:, None, None] * (nb * 8) + blk[None, :, None] * 8 + t[None, None, :],
                mask=ok[None, :, None], other=0)
    d = tl.load(d_ptr + rows[:, None] * nb + blk[None, :]).to(tl.float32)
    acc0 = _q80_row(acc0, w, d, xq_ptr, d8_ptr, K, blk, t, ok, 0, ROWS, DP4A)
    acc1 = _q80_row(acc1, w, d, xq_ptr, d8_ptr, K, blk, t, ok, 1, ROWS, DP4A)
    acc2 = _q80_row(acc2, w, d, xq_ptr, d8_ptr, K, blk, t, ok, 2, ROWS, DP4A)
    acc3 = _q80_row(acc3, w, d, xq_ptr, d8_ptr, K, blk, t, ok, 3, ROWS, DP4A)
    acc4 = _q80_row(acc4, w, d, xq_ptr, d8_ptr, K, blk, t, ok, 4, ROWS, DP4A)
    acc5 = _q80_row(acc5, w, d, xq_ptr, d8_ptr, K, blk, t, ok, 5, ROWS, DP4A)
    acc6 = _q80_row(acc6, w, d, xq_ptr, d8_ptr, K, blk, t, ok, 6, ROWS, DP4A)
    acc7 = _q80_row(acc7, w, d, xq_ptr, d8_ptr, K, blk, t, ok, 7, ROWS, DP4A)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


# Q4_0 / Q4_1 / Q5_0, per K step of BLOCKS blocks of 32 elements in 16 code bytes (4 words): word t
# holds elements 4t.. in its low nibbles (x word t) and 16 + 4t.. in its high ones (x word 4 + t);
# Q5_0's fifth bits are bits 4t.. and 16 + 4t.. of qh. The code offset (8, 16) or Q4_1's min
# multiplies ggml's fp32 sum of the block's x (Q8Act.s), as vec_dot_q4_0/q4_1/q5_0_q8_1 do; Q4_1
# takes d*d8 and m*s8 as fp16 products (ggml's __hmul2 where fast fp16 exists, as on the H200).
@triton.jit
def _q5_bits(hb):
    """Bits 0..3 of hb -> bit 4 of bytes 0..3."""
    return ((hb << 4) & 0x10) | ((hb << 11) & 0x1000) | ((hb << 18) & 0x100000) | ((hb << 25) & 0x10000000)


@triton.jit
def _q4x_row(acc, wl, wh, d, aux, xq_ptr, d8_ptr, s8_ptr, K, blk, t, ok,
             r: tl.constexpr, ROWS: tl.constexpr, VARIANT: tl.constexpr, DP4A: tl.constexpr):
    if r < ROWS:
        xrow = xq_ptr + r * (K // 4) + blk[:, None] * 8 + t[None, :]
        xl = tl.load(xrow, mask=ok[:, None], other=0)
        xh = tl.load(xrow + 4, mask=ok[:, None], other=0)
        sumi = tl.sum(_dp4a(wl, xl[None, :, :], DP4A) + _dp4a(wh, xh[None, :, :], DP4A), axis=2)
        d8h = tl.load(d8_ptr + r * (K // 32) + blk, mask=ok, other=0.0)[None, :]
        s8h = tl.load(s8_ptr + r * (K // 32) + blk, mask=ok, other=0.0)[None, :]
        if VARIANT == 1:
            acc += tl.fma(sumi.to(tl.float32), (d * d8h).to(tl.float32), (aux * s8h).to(tl.float32))
        else:  # explicit fmas: see _q4k_row
            off = 8.0 if VARIANT == 0 else 16.0
            inner = tl.fma(sumi.to(tl.float32), d8h.to(tl.float32), -(off * s8h.to(tl.float32)))
            acc = tl.fma(d.to(tl.float32), inner, acc)
    return acc


@triton.jit
def _q4x_step(acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, qs_ptr, d_ptr, aux_ptr, xq_ptr, d8_ptr, s8_ptr,
              rows, kb, nb, kend, K, G: tl.constexpr, ROWS: tl.constexpr, VARIANT: tl.constexpr, DP4A: tl.constexpr):
    # VARIANT 0: Q4_0, 1: Q4_1 (aux = m fp16), 2: Q5_0 (aux = qh int32)
    blk = kb + tl.arange(0, G)
    t = tl.arange(0, 4)
    ok = blk < kend
    blk = tl.where(ok, blk, 0)
    w = tl.load(qs_ptr + rows[:, None, None] * (nb * 4) + blk[None, :, None] * 4 + t[None, None, :],
                mask=ok[None, :, None], other=0)
    wl = w & 0x0F0F0F0F
    wh = (w >> 4) & 0x0F0F0F0F
    sidx = rows[:, None] * nb + blk[None, :]
    d = tl.load(d_ptr + sidx)  # fp16 (BN, G)
    aux = d
    if VARIANT == 1:
        aux = tl.load(aux_ptr + sidx)
    elif VARIANT == 2:
        qh = tl.load(aux_ptr + sidx)[:, :, None]  # int32 (BN, G, 1)
        wl |= _q5_bits(qh >> (t * 4)[None, None, :])
        wh |= _q5_bits(qh >> (16 + t * 4)[None, None, :])
    acc0 = _q4x_row(acc0, wl, wh, d, aux, xq_ptr, d8_ptr, s8_ptr, K, blk, t, ok, 0, ROWS, VARIANT, DP4A)
    acc1 = _q4x_row(acc1, wl, wh, d, aux, xq_ptr, d8_ptr, s8_ptr, K, blk, t, ok, 1, ROWS, VARIANT, DP4A)
    acc2 = _q4x_row(acc2, wl, wh, d, aux, xq_ptr, d8_ptr, s8_ptr, K, blk, t, ok, 2, ROWS, VARIANT, DP4A)
    acc3 = _q4x_row(acc3, wl, wh, d, aux, xq_ptr, d8_ptr, s8_ptr, K, blk, t, ok, 3, ROWS, VARIANT, DP4A)
    acc4 = _q4x_row(acc4, wl, wh, d, aux, xq_ptr, d8_ptr, s8_ptr, K, blk, t, ok, 4, ROWS, VARIANT, DP4A)
    acc5 = _q4x_row(acc5, wl, wh, d, aux, xq_ptr, d8_ptr, s8_ptr, K, blk, t, ok, 5, ROWS, VARIANT, DP4A)
    acc6 = _q4x_row(acc6, wl, wh, d, aux, xq_ptr, d8_ptr, s8_ptr, K, blk, t, ok, 6, ROWS, VARIANT, DP4A)
    acc7 = _q4x_row(acc7, wl, wh, d, aux, xq_ptr, d8_ptr, s8_ptr, K, blk, t, ok, 7, ROWS, VARIANT, DP4A)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7


@triton.jit
def _mmvq_kernel(p0, p1, p2, p3, xq_ptr, d8_ptr, xs_ptr, s8_ptr, y_ptr, N, K, stride_ym, part_ptr, ticket_ptr, split_blocks,
                 QT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr,
                 STAGES: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr, WIDE: tl.constexpr,
                 PDL: tl.constexpr, add_ptr, stride_addm, ADD: tl.constexpr):
    # G: Q4_K chunks / Q6_K quarters (BLOCKS * 4) or Q8_0 blocks (BLOCKS) per K step.
    # QT 0: Q4_K (p0 qs words, p1 scales, p2 dm), 1: Q6_K (p0 ql words, p1 qh words, p2 sc, p3 d),
    # 2: Q8_0 (p0 qs words, p1 d), 3/4/5: Q4_0/Q4_1/Q5_0 (p0 qs words, p1 d, p2 m or qh).
    # Split K as quant_gemv: program (pid, ks) covers blocks [ks*split_blocks, ...), the last of a
    # row tile's programs sums the partials in split order.
    pid = tl.program_id(0)
    ks = tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1)
    if WIDE:
        rows = rows.to(tl.int64)  # a plane of >= 2^31 words
    nb = K // BLOCK_K
    kstart = ks * split_blocks
    kend = tl.minimum(nb, kstart + split_blocks)
    pdl.wait(PDL)
    acc0 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc4 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc5 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc6 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    acc7 = tl.zeros((BLOCK_N, G), dtype=tl.float32)
    for kb in tl.range(kstart, kend, BLOCKS, num_stages=STAGES):
        if QT == 0:
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _q4k_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, p0, p1, p2, xq_ptr, d8_ptr, xs_ptr,
                rows, kb, nb, kend, K, G, ROWS, DP4A)
        elif QT == 1:
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _q6k_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, p0, p1, p2, p3, xq_ptr, d8_ptr, xs_ptr,
                rows, kb, nb, kend, K, G, ROWS, DP4A)
        elif QT == 2:
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _q80_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, p0, p1, xq_ptr, d8_ptr,
                rows, kb, nb, kend, K, G, ROWS, DP4A)
        else:
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7 = _q4x_step(
                acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, p0, p1, p2, xq_ptr, d8_ptr, s8_ptr,
                rows, kb, nb, kend, K, G, ROWS, QT - 3, DP4A)
    _finish_rows(y_ptr, stride_ym, part_ptr, ticket_ptr, pid, ks, N, rows, row_ok,
                 tl.sum(acc0, axis=1), tl.sum(acc1, axis=1), tl.sum(acc2, axis=1), tl.sum(acc3, axis=1),
                 tl.sum(acc4, axis=1), tl.sum(acc5, axis=1), tl.sum(acc6, axis=1), tl.sum(acc7, axis=1), ROWS, SPLIT,
                 add_ptr, stride_addm, ADD)


_PLANES = {"Q4_K": ("qs", "scales", "dm"), "Q6_K": ("ql", "qh", "sc", "d"), "Q8_0": ("qs", "d"),
           "Q4_0": ("qs", "d"), "Q4_1": ("qs", "d", "m"), "Q5_0": ("qs", "d", "qh")}
# planes read as int32 words (their rows are whole multiples of 4 bytes)
_WORDS = {"Q4_K": ("qs",), "Q6_K": ("ql", "qh"), "Q8_0": ("qs",), "Q4_0": ("qs",), "Q4_1": ("qs",), "Q5_0": ("qs",)}
_BLOCK = {"Q4_K": 256, "Q6_K": 256, "Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32}  # elements per GGUF block
_G_PER = {"Q4_K": 4, "Q6_K": 4, "Q8_0": 1, "Q4_0": 1, "Q4_1": 1, "Q5_0": 1}  # tile groups per block


def _fill_split(n: int, k: int, block_n: int, blocks: int, block_k: int, programs: int = 264) -> int:
    """The fewest power-of-two K splits (<= 8) giving `programs` programs (two per SM), or as many
    as the K steps allow."""
    tiles, steps, split = triton.cdiv(n, block_n), max(1, (k // block_k) // blocks), 1
    while tiles * split < programs and split < 8 and split * 2 <= steps:
        split *= 2
    return split


def mmvq_config(qtype: str, n: int, k: int) -> tuple[int, int, int, int, int, bool]:
    """(BLOCK_N, BLOCKS per K step, num_warps, num_stages, K splits, DP4A): the best of the H200
    sweeps by shape class (scripts/gpu_mmvq.py at ac3bdff and scripts/gpu_gemv_table.py --narrow
    in session 11, docs/performance.md). One
    warp per program and few rows: many programs in flight; wide Q4_K products 8 rows; the long-K
    downs over 1536 rows want K splits."""
    if _BLOCK[qtype] == 32:
        if n >= 32768:
            return (8, 8, 1, 1, 1, True)
        return (8, 16, 4, 1, _fill_split(n, k, 8, 16, 32), True)
    if 12288 <= n < 65536 and qtype == "Q4_K":
        return (8, 2, 1, 1, 1, True)
    if n < 4096 or n < k:
        # The narrow products (V, o, down; session 11's sweep, scripts/gpu_gemv_table.py --narrow):
        # latency-bound, so three cp.async stages per one-warp program; Q6_K with 2 rows and 4
        # blocks a step (down 2560x9728 19.5 -> 11.3 µs), long-K Q4_K with K splits.
        if qtype == "Q6_K":
            return (2, 4, 1, 3, 1, True)
        if k >= 6144:
            return (4, 2, 1, 3, 2 if n >= 2560 else 4, True)
        if n < k:
            return (4, 2, 1, 3, 1, True)
    return (4, 2, 1, 1, _fill_split(n, k, 4, 2, 256), True)


def mmvq_q8(xq: Q8Act, w: PlaneWeight, out: torch.Tensor | None = None, config=None,
            add: torch.Tensor | None = None) -> torch.Tensor:
    """y (M, N) float32 = the integer-dot product of a quantized x with W (one of MMVQ_TYPES);
    + `add` ((N,) or (M, N)) as y is stored (quant_gemv.epilogue_addend)."""
    if w.qtype not in MMVQ_TYPES:
        raise ValueError(f"No MMVQ kernel for {w.qtype} (have: {', '.join(MMVQ_TYPES)}).")
    m_rows, k = xq.qs.shape
    if k != w.k:
        raise ValueError(f"mmvq: x has K={k}, the weight wants K={w.k}.")
    if not 1 <= m_rows <= 8:
        raise ValueError(f"mmvq takes 1 to 8 rows, got {m_rows}.")
    dev = xq.qs.device
    if out is None:
        out = torch.empty((m_rows, w.n), dtype=torch.float32, device=dev)
    cfg = tuple(config) if config is not None else mmvq_config(w.qtype, w.n, w.k)
    block_n, blocks, warps, stages, split = cfg[:5]
    dp4a = bool(cfg[5]) if len(cfg) > 5 else True
    if INTERPRETED or dev.type != "cuda":
        dp4a = False  # inline PTX needs a compiled kernel; the portable dot gives the same integers
    tiles = triton.cdiv(w.n, block_n)
    nb = w.k // _BLOCK[w.qtype]
    split = max(1, min(split, triton.cdiv(nb, blocks))) if tiles <= TICKET_SLOTS else 1
    split_blocks = triton.cdiv(triton.cdiv(nb, split), blocks) * blocks
    split = triton.cdiv(nb, split_blocks)
    if split > 1:
        part = torch.empty((split, m_rows, w.n), dtype=torch.float32, device=dev)
        tickets = _tickets(dev)
    else:
        part = tickets = out  # unused
    planes = [w.planes[name].view(torch.int32) if name in _WORDS[w.qtype] else w.planes[name]
              for name in _PLANES[w.qtype]]
    planes += [planes[0]] * (4 - len(planes))
    wide = max(p.numel() for p in planes) >= 2**31
    _mmvq_kernel[(tiles, split)](
        *planes, xq.qs.view(torch.int32), xq.d, xq.isum, xq.s, out, w.n, w.k, out.stride(0), part, tickets, split_blocks,
        QT=MMVQ_TYPES.index(w.qtype), ROWS=m_rows, BLOCK_N=block_n, BLOCKS=blocks, STAGES=stages,
        BLOCK_K=_BLOCK[w.qtype], G=blocks * _G_PER[w.qtype], SPLIT=split, DP4A=dp4a, WIDE=wide,
        **epilogue_addend(add, m_rows, w.n, out), num_warps=warps, **pdl.launch(dev))
    return out


def mmvq(x: torch.Tensor, w: PlaneWeight, out: torch.Tensor | None = None, config=None,
         scratch: Q8Act | None = None, add: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ add) with x quantized to Q8_1 first (two launches). x (M, K) or (K,), M <= 8."""
    squeeze = x.ndim == 1
    y = mmvq_q8(quantize_q8_1(x, out=scratch), w, out=out, config=config, add=add)
    return y.reshape(w.n) if squeeze else y


def _weight_codes(w: PlaneWeight):
    """Integer codes and scales of the weight, grouped by the scale they share:
    Q8_0: q (N, nb, 32), d (N, nb);  Q4_0/Q4_1/Q5_0: q (N, nb, 32) 0..15 / 0..31, Q4_1's m as mn,
    d (N, nb) fp16;  Q4_K: q (N, nb, 8, 32) 0..15, sc/mn (N, nb, 8), d/dmin (N, nb);  Q6_K: q (N, nb, 16, 16)
    -32..31, sc (N, nb, 16), d (N, nb)."""
    n, p = w.n, w.planes
    nb = w.k // _BLOCK[w.qtype]
    if w.qtype == "Q8_0":
        return p["qs"].to(torch.int32).reshape(n, nb, 32), None, None, p["d"].float().reshape(n, nb), None
    if w.qtype in ("Q4_0", "Q4_1", "Q5_0"):  # codes without their offset (8, 16) or min: see mmvq_reference
        q = _nib(p["qs"], n, nb, 16).reshape(n, nb, 32)
        if w.qtype == "Q5_0":
            bits = torch.arange(32, dtype=torch.int32, device=q.device)
            q = q | (((p["qh"].reshape(n, nb, 1) >> bits) & 1) << 4)
        return q, None, p.get("m"), p["d"].reshape(n, nb), None
    if w.qtype == "Q4_K":
        dm = p["dm"].float().reshape(n, nb, 2)
        s = p["scales"].to(torch.int32).reshape(n, nb, 12)
        a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
        sc = torch.cat([a & 63, (c & 15) | ((a >> 2) & 48)], dim=2)
        mn = torch.cat([b & 63, (c >> 4) | ((b >> 2) & 48)], dim=2)
        return _nib(p["qs"], n, nb, 32).reshape(n, nb, 8, 32), sc, mn, dm[..., 0], dm[..., 1]
    lo = _nib(p["ql"], n, nb, 64).reshape(n, nb, 8, 32)
    qh = p["qh"].to(torch.int32).reshape(n, nb, 2, 1, 32)
    hi = ((qh >> torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=qh.device).view(1, 1, 1, 4, 1)) & 3)
    q = ((lo | (hi.reshape(n, nb, 8, 32) << 4)) - 32).reshape(n, nb, 16, 16)
    return q, p["sc"].to(torch.int32).reshape(n, nb, 16), None, p["d"].float().reshape(n, nb), None


def mmvq_reference(x: torch.Tensor, w: PlaneWeight, xq: Q8Act | None = None) -> torch.Tensor:
    """The same arithmetic in torch, float64: integer dot products per scale group (exact: float64
    holds every partial), then d * sum d8 * sumi * sc (- dmin * sum d8 * xsum * mn) -> (M, N)."""
    xq = xq if xq is not None else quantize_q8_1_reference(x)
    m_rows, k = xq.qs.shape
    q, sc, mn, d, dmin = _weight_codes(w)
    if w.qtype == "Q8_0":
        xc = xq.qs.double().reshape(m_rows, k // 32, 32)
        sumi = torch.einsum("nbj,mbj->mnb", q.double(), xc)
        return ((d.double()[None] * xq.d.double()[:, None]) * sumi).sum(-1)
    if w.qtype in ("Q4_0", "Q4_1", "Q5_0"):
        nb = k // 32
        sumi = torch.einsum("nbj,mbj->mnb", q.double(), xq.qs.double().reshape(m_rows, nb, 32))
        d8, s8 = xq.d[:, None], xq.s[:, None]  # fp16 (M, 1, nb)
        if w.qtype == "Q4_1":  # fp16 products, as ggml's __hmul2
            dd = (d[None].to(d8.device) * d8).double()
            ms = (mn.reshape(w.n, nb)[None] * s8).double()
            return (sumi * dd + ms).sum(-1)
        off = 8.0 if w.qtype == "Q4_0" else 16.0
        return (d.double()[None] * (sumi * d8.double() - off * s8.double())).sum(-1)
    nb = k // 256
    d8 = xq.d.double().reshape(m_rows, nb, 8)
    if w.qtype == "Q4_K":
        xc = xq.qs.double().reshape(m_rows, nb, 8, 32)
        sumi = torch.einsum("nbsj,mbsj->mnbs", q.double(), xc)
        xsum = xc.sum(-1)  # (M, nb, 8)
        t_d = (d8[:, None] * (sumi * sc.double()[None])).sum(-1)
        t_m = (d8[:, None] * (xsum[:, None] * mn.double()[None])).sum(-1)
        return (d.double()[None] * t_d - dmin.double()[None] * t_m).sum(-1)
    xc = xq.qs.double().reshape(m_rows, nb, 16, 16)
    sumi = torch.einsum("nbtj,mbtj->mnbt", q.double(), xc)
    d8t = d8.repeat_interleave(2, dim=2)  # per 16-element group
    return (d.double()[None] * (d8t[:, None] * sumi * sc.double()[None]).sum(-1)).sum(-1)
