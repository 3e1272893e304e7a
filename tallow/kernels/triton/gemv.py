"""Decode matrix-vector products, second generation: y (M, N) = x (M, K) @ W^T, M <= 8.

What bounded quant_gemv.py (the first generation) was not bytes but instructions: its offsets
went through `tl.where`, so Triton could not prove them 16-byte aligned and loaded every code
byte with its own 1-byte load, then spent ~8 more instructions per weight unpacking, converting
and scaling it (SASS of the Q4_K kernel: ~36 instructions per weight per thread, ~140 loads per
32 weights). This module is built to a budget of ~3 instructions per weight:

* Codes are read as int32 words (16-byte vector loads, offsets written so Triton's alignment
  analysis sees multiples of 4 words; tails are masked, never clamped with `where`).
* int -> float without a conversion instruction: a 4-bit code q shifted into mantissa bits
  19..22 and OR-ed with the bits of 1.0 *is* the float 1 + q/16 (6-bit Q6_K codes: 1 + q/64 at
  bits 17..22; Q8_0's signed bytes: 1 + (q+128)/256 at bits 15..22, the sign flipped by the
  same LOP3). One shift and one LOP3 per weight, then one FFMA with x.
* The sub-block scale is applied once per sub-block, not per weight: per word we sum
  f*x over its codes, and the offset hidden in f (the 1, and -32 / -8 / -16 / the Q4_K min)
  folds into a per-sub-block term  c * sum(x over the sub-block). The sums of x per 16
  elements (`sx`) are the same for every row, so they are computed once per call by the prep
  kernel (or by the kernel that produced x: rmsnorm.py and glu.py can write them).
* x in code order. A word holds codes of elements that are not adjacent (Q4_K: byte j of a
  32-byte chunk holds elements j and j+32), so x is gathered once per call into "planes":
  xp[f * (K/F) + word] = x[element of field f of that word] (F fields per word), which makes
  every x load of the kernel a contiguous 16-byte vector too. `layout_perm` gives the gather
  index per type; `gemv_prep` (or a producer kernel) writes xp and sx.

Summed per sub-block: y = sum_s [ a_s * sum_{w in s} (f_w * x_w) + b_s * sx_s ] with, per type,
  Q4_K (w = d*sc*q - dmin*m):   a = 16*d*sc,  b = -(16*d*sc + dmin*m)
  Q6_K (w = d*sc*(q - 32)):     a = 64*d*sc,  b = -96*d*sc
  Q8_0 (w = d*q):               a = 256*d,    b = -384*d
  Q4_0 (w = d*(q - 8)):         a = 16*d,     b = -24*d
  Q4_1 (w = d*q + m):           a = 16*d,     b = m - 16*d
  Q5_0 (w = d*(q - 16), 5-bit): a = 32*d,     b = -48*d
Numerics: f*x is exact up to one fp32 rounding, but f carries an offset of 1 so the partial
sum cancels against sx by a factor of ~2-3: the result differs from fp32 `x @ W.T` by a few
fp32 ulps times sqrt(K) -- the tests hold it to 4e-6 relative.

Measured on the H200 (docs/performance.md, 2026-12-01): the instruction cut did not pay on
mid-size shapes -- both this and quant_gemv.py are latency-bound (under one wave of programs,
14-30% occupancy); this one wins where the grid is large (vocab projections) and on tiny shapes.

M > 1: one program per (row tile, m), m fastest, as in quant_gemv.py.
Graph safety: no host syncs; `gemv` allocates only when `out`/`prep` are not given.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .planes import PlaneWeight, dequantize_planes

__all__ = ["SUPPORTED", "FIELDS", "layout_perm", "GemvInput", "gemv_prep", "gemv", "gemv_multi",
           "concat_weights", "gemv_reference", "gemv_config"]

SUPPORTED = ("Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0")
FIELDS = {"Q4_K": 8, "Q6_K": 16, "Q8_0": 4, "Q4_0": 8, "Q4_1": 8, "Q5_0": 8}
# the x-gather layout of each type (Q4_0, Q4_1 and Q5_0 share one)
LAYOUT = {"Q4_K": "Q4_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0", "Q4_0": "Q4_x", "Q4_1": "Q4_x", "Q5_0": "Q4_x"}


@functools.lru_cache(maxsize=64)
def _perm_cpu(layout: str, k: int) -> torch.Tensor:
    """int32 (K,): xp[f * (K/F) + word] = x[perm[...]]."""
    if layout == "Q4_K":  # word = chunk*8 + i; field = h*4 + b; element = chunk*64 + 32h + 4i + b
        w = torch.arange(k // 8)
        f = torch.arange(8)
        h, b = f // 4, f % 4
        e = (w // 8 * 64 + 4 * (w % 8))[None, :] + (32 * h + b)[:, None]
    elif layout == "Q4_x":  # word = block*4 + i; field = h*4 + b; element = block*32 + 16h + 4i + b
        w = torch.arange(k // 8)
        f = torch.arange(8)
        h, b = f // 4, f % 4
        e = (w // 4 * 32 + 4 * (w % 4))[None, :] + (16 * h + b)[:, None]
    elif layout == "Q8_0":  # word w, field b: element 4w + b
        w = torch.arange(k // 4)
        e = (4 * w)[None, :] + torch.arange(4)[:, None]
    elif layout == "Q6_K":  # unit = g*8 + i (g: 128-element half block); field = s*8 + h*4 + b
        u = torch.arange(k // 16)
        f = torch.arange(16)
        s, h, b = f // 8, (f // 4) % 2, f % 4
        e = (u // 8 * 128 + 4 * (u % 8))[None, :] + ((2 * h + s) * 32 + b)[:, None]
    else:
        raise ValueError(layout)
    return e.reshape(-1).to(torch.int32)


def layout_perm(qtype: str, k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    return _perm_dev(LAYOUT[qtype], k, str(torch.device(device)))


@functools.lru_cache(maxsize=64)
def _perm_dev(layout: str, k: int, device: str) -> torch.Tensor:
    return _perm_cpu(layout, k).to(device)


class GemvInput:
    """x prepared for the GEMV kernels: xp (M, L*K) fp32 in the code order of each of L layouts,
    and sx (M, K/16) fp32 sums of x over 16 consecutive elements. Static buffers: make one per
    activation vector of the decode step and reuse it (CUDA graphs)."""

    def __init__(self, m: int, k: int, qtypes, device) -> None:
        self.m, self.k = m, k
        self.layouts = []
        for q in qtypes:
            if LAYOUT[q] not in self.layouts:
                self.layouts.append(LAYOUT[q])
        self.perm = torch.cat([_perm_dev(l, k, str(torch.device(device))) for l in self.layouts])
        self.xp = torch.empty((m, len(self.layouts) * k), dtype=torch.float32, device=device)
        self.sx = torch.empty((m, k // 16), dtype=torch.float32, device=device)

    def plane(self, qtype: str) -> torch.Tensor:
        i = self.layouts.index(LAYOUT[qtype])
        return self.xp[:, i * self.k:(i + 1) * self.k]


@triton.jit
def _prep_kernel(x_ptr, perm_ptr, xp_ptr, sx_ptr, K, P, stride_xm, stride_pm, stride_sm, BLOCK: tl.constexpr):
    m = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pm = j < P
    src = tl.load(perm_ptr + j, mask=pm, other=0)
    v = tl.load(x_ptr + m * stride_xm + src, mask=pm, other=0.0).to(tl.float32)
    tl.store(xp_ptr + m * stride_pm + j, v, mask=pm)
    R: tl.constexpr = BLOCK // 16
    r = tl.program_id(1) * R + tl.arange(0, R)
    e = r[:, None] * 16 + tl.arange(0, 16)[None, :]
    xv = tl.load(x_ptr + m * stride_xm + e, mask=e < K, other=0.0).to(tl.float32)
    tl.store(sx_ptr + m * stride_sm + r, tl.sum(xv, axis=1), mask=r < K // 16)


def gemv_prep(x: torch.Tensor, prep: GemvInput) -> GemvInput:
    """Fill prep.xp / prep.sx from x (M, K) (fp32/fp16/bf16, last dim contiguous). One launch."""
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    P = prep.perm.numel()
    block = 1024
    _prep_kernel[(x2.shape[0], triton.cdiv(P, block))](x2, prep.perm, prep.xp, prep.sx, prep.k, P, x2.stride(0),
                                                       prep.xp.stride(0), prep.sx.stride(0), BLOCK=block,
                                                       num_warps=4)
    return prep


# ------------------------------------------------------------------------------------------
# bit tricks: a field of `w` at bit SH moved to mantissa bit TO (mask MASK at the target)
# ------------------------------------------------------------------------------------------

@triton.jit
def _mv(w, SH: tl.constexpr, TO: tl.constexpr, MASK: tl.constexpr):
    if SH <= TO:
        t = w << (TO - SH)
    else:
        t = w >> (SH - TO)
    return t & MASK


@triton.jit
def _bits(w, SH: tl.constexpr, TO: tl.constexpr, MASK: tl.constexpr, C: tl.constexpr, ASM: tl.constexpr):
    """((w shifted so bit SH lands on bit TO) & MASK) ^ C as a float (C's bits: the exponent of 1.0,
    plus Q8_0's sign flip). With ASM, one shift and one 3-input LOP3 (ptxas otherwise emits two
    logic ops: and, then or, for want of a second immediate)."""
    if ASM:
        z = w * 0  # constants as operands (splats, folded to immediates / hoisted registers)
        if SH <= TO:
            r = tl.inline_asm_elementwise("{ .reg .b32 t; shl.b32 t, $1, $2; lop3.b32 $0, t, $3, $4, 0x6A; }",
                                          "=r,r,r,r,r", [w, z + (TO - SH), z + MASK, z + C], dtype=tl.int32,
                                          is_pure=True, pack=1)
        else:
            r = tl.inline_asm_elementwise("{ .reg .b32 t; shr.u32 t, $1, $2; lop3.b32 $0, t, $3, $4, 0x6A; }",
                                          "=r,r,r,r,r", [w, z + (SH - TO), z + MASK, z + C], dtype=tl.int32,
                                          is_pure=True, pack=1)
    else:
        r = _mv(w, SH, TO, MASK) ^ C
    return r.to(tl.float32, bitcast=True)


@triton.jit
def _f4(w, SH: tl.constexpr, ASM: tl.constexpr = False):
    """nibble at bit SH -> 1 + q/16"""
    return _bits(w, SH, 19, 0x780000, 0x3F800000, ASM)


# ------------------------------------------------------------------------------------------
# Q4_K: tile (BN, CH chunks of 32 bytes = 8 words). Word i of chunk c, byte b: low nibble ->
# element c*64 + 4i + b (sub-block 2*(c%4) of its block), high -> +32 (sub-block 2*(c%4)+1).
# ------------------------------------------------------------------------------------------

@triton.jit
def _q4_k_kernel(xp_ptr, sx_ptr, qs_ptr, sc_ptr, dm_ptr, y_ptr, N, NB, M, XS4, stride_pm, stride_sm, stride_ym,
                 BN: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr, ASM: tl.constexpr):
    pid = tl.program_id(0)
    m = pid % M
    rows = (pid // M) * BN + tl.arange(0, BN)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    CH: tl.constexpr = BLOCKS * 4
    ch = tl.arange(0, CH)
    i = tl.arange(0, 8)
    XS = XS4 * 4
    xrow = xp_ptr + m * stride_pm
    sxrow = sx_ptr + m * stride_sm
    qrow = qs_ptr + rows[:, None, None] * (NB * 32)
    srow = sc_ptr + rows[:, None] * (NB * 3)
    drow = dm_ptr + rows[:, None] * (NB * 2)
    acc = tl.zeros((BN, CH, 8), dtype=tl.float32)
    acc2 = tl.zeros((BN, CH), dtype=tl.float32)
    for kb in tl.range(0, NB, BLOCKS, num_stages=STAGES):
        c = kb * 4 + ch  # chunk index in the row
        cok = c < NB * 4
        word = c[:, None] * 8 + i[None, :]  # (CH, 8)
        w = tl.load(qrow + word[None, :, :], mask=cok[None, :, None], other=0)
        blk = c // 4
        cc = c % 4
        # scales: 3 words per block; sub-blocks j = 2cc, 2cc+1 are the byte pair at 16*(cc%2)
        sm = cok[None, :]
        s0 = tl.load(srow + blk[None, :] * 3, mask=sm, other=0)
        s1 = tl.load(srow + blk[None, :] * 3 + 1, mask=sm, other=0)
        s2 = tl.load(srow + blk[None, :] * 3 + 2, mask=sm, other=0)
        sh = ((cc % 2) * 16)[None, :]
        a = s0 >> sh
        b = s1 >> sh
        cw = s2 >> sh
        low = (cc < 2)[None, :]
        scp = tl.where(low, a & 0x3F3F, (cw & 0x0F0F) | ((a >> 2) & 0x3030))
        mnp = tl.where(low, b & 0x3F3F, ((cw >> 4) & 0x0F0F) | ((b >> 2) & 0x3030))
        d = tl.load(drow + blk[None, :] * 2, mask=sm, other=0.0).to(tl.float32)
        dmin = tl.load(drow + blk[None, :] * 2 + 1, mask=sm, other=0.0).to(tl.float32)
        a_lo = d * ((scp & 0xFF) * 16).to(tl.float32)
        a_hi = d * ((scp >> 8) * 16).to(tl.float32)
        m_lo = dmin * (mnp & 0xFF).to(tl.float32)
        m_hi = dmin * (mnp >> 8).to(tl.float32)
        sx_lo = tl.load(sxrow + c * 4, mask=cok, other=0.0) + tl.load(sxrow + c * 4 + 1, mask=cok, other=0.0)
        sx_hi = tl.load(sxrow + c * 4 + 2, mask=cok, other=0.0) + tl.load(sxrow + c * 4 + 3, mask=cok, other=0.0)
        acc2 -= (a_lo + m_lo) * sx_lo[None, :] + (a_hi + m_hi) * sx_hi[None, :]
        xm = cok[:, None]
        xw = xrow + word
        p_lo = _f4(w, 0, ASM) * tl.load(xw, mask=xm, other=0.0)[None, :, :]
        p_lo += _f4(w, 8, ASM) * tl.load(xw + XS, mask=xm, other=0.0)[None, :, :]
        p_lo += _f4(w, 16, ASM) * tl.load(xw + 2 * XS, mask=xm, other=0.0)[None, :, :]
        p_lo += _f4(w, 24, ASM) * tl.load(xw + 3 * XS, mask=xm, other=0.0)[None, :, :]
        p_hi = _f4(w, 4, ASM) * tl.load(xw + 4 * XS, mask=xm, other=0.0)[None, :, :]
        p_hi += _f4(w, 12, ASM) * tl.load(xw + 5 * XS, mask=xm, other=0.0)[None, :, :]
        p_hi += _f4(w, 20, ASM) * tl.load(xw + 6 * XS, mask=xm, other=0.0)[None, :, :]
        p_hi += _f4(w, 28, ASM) * tl.load(xw + 7 * XS, mask=xm, other=0.0)[None, :, :]
        acc += a_lo[:, :, None] * p_lo + a_hi[:, :, None] * p_hi
    y = tl.sum(tl.sum(acc, axis=2), axis=1) + tl.sum(acc2, axis=1)
    tl.store(y_ptr + m * stride_ym + rows, y, mask=row_ok)


# ------------------------------------------------------------------------------------------
# Q6_K: units (g, i) with g a 128-element half block, i 0..7 split as (ih, il) = (i//4, i%4).
# ql word g*16 + s*8 + i, qh word g*8 + i; for field (s, h, b): r = 2h + s, element
# g*128 + r*32 + 4i + b, low nibble at bit 8b+4h of the ql word, high 2 bits at 8b+2r of the
# qh word, scale index g*8 + 2r + ih.
# ------------------------------------------------------------------------------------------

@triton.jit
def _q6_part(wl, wh, xw, XS, xm, S: tl.constexpr, H: tl.constexpr, ASM: tl.constexpr):
    """sum over the 4 bytes b of one (s, h) field group: the four 6-bit codes are first merged
    into the bytes of one word (low nibble | 2 high bits << 4), then each is moved to mantissa
    bits 17..22 of 1.0 -> 1 + q/64."""
    R: tl.constexpr = 2 * H + S
    F: tl.constexpr = S * 8 + H * 4
    z = ((wl >> (4 * H)) & 0x0F0F0F0F) | (_mv(wh, 2 * R, 4, 0x30303030))
    p = _bits(z, 0, 17, 0x7E0000, 0x3F800000, ASM) * tl.load(xw + F * XS, mask=xm, other=0.0)[None, :, :, :]
    p += _bits(z, 8, 17, 0x7E0000, 0x3F800000, ASM) * tl.load(xw + (F + 1) * XS, mask=xm, other=0.0)[None, :, :, :]
    p += _bits(z, 16, 17, 0x7E0000, 0x3F800000, ASM) * tl.load(xw + (F + 2) * XS, mask=xm, other=0.0)[None, :, :, :]
    p += _bits(z, 24, 17, 0x7E0000, 0x3F800000, ASM) * tl.load(xw + (F + 3) * XS, mask=xm, other=0.0)[None, :, :, :]
    return p


@triton.jit
def _q6_k_kernel(xp_ptr, sx_ptr, ql_ptr, qh_ptr, sc_ptr, d_ptr, y_ptr, N, NB, M, XS4, stride_pm, stride_sm,
                 stride_ym, BN: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr, ASM: tl.constexpr):
    pid = tl.program_id(0)
    m = pid % M
    rows = (pid // M) * BN + tl.arange(0, BN)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    G: tl.constexpr = BLOCKS * 2
    gi = tl.arange(0, G)
    ih = tl.arange(0, 2)
    il = tl.arange(0, 4)
    XS = XS4 * 4
    xrow = xp_ptr + m * stride_pm
    sxrow = sx_ptr + m * stride_sm
    lrow = ql_ptr + rows[:, None, None, None] * (NB * 32)
    hrow = qh_ptr + rows[:, None, None, None] * (NB * 16)
    srow = sc_ptr + rows[:, None, None] * (NB * 16)
    drow = d_ptr + rows[:, None, None] * NB
    acc = tl.zeros((BN, G, 2, 4), dtype=tl.float32)
    acc2 = tl.zeros((BN, G, 2), dtype=tl.float32)
    for kb in tl.range(0, NB, BLOCKS, num_stages=STAGES):
        g = kb * 2 + gi
        gok = g < NB * 2
        i8 = ih[:, None] * 4 + il[None, :]  # (2, 4)
        wm = gok[None, :, None, None]
        loff = (g[:, None, None] * 16 + i8[None, :, :])[None, :, :, :]
        wl0 = tl.load(lrow + loff, mask=wm, other=0)
        wl1 = tl.load(lrow + loff + 8, mask=wm, other=0)
        wh = tl.load(hrow + (g[:, None, None] * 8 + i8[None, :, :])[None, :, :, :], mask=wm, other=0)
        sm = gok[None, :, None]
        d = tl.load(drow + (g // 2)[None, :, None], mask=sm, other=0.0).to(tl.float32) * 64.0  # (BN, G, 1)
        sidx = (g[:, None] * 8 + ih[None, :])[None, :, :]  # (1, G, 2) scale index for r = 0
        d0 = d * tl.load(srow + sidx, mask=sm, other=0).to(tl.float32)
        d1 = d * tl.load(srow + sidx + 2, mask=sm, other=0).to(tl.float32)
        d2 = d * tl.load(srow + sidx + 4, mask=sm, other=0).to(tl.float32)
        d3 = d * tl.load(srow + sidx + 6, mask=sm, other=0).to(tl.float32)
        xidx = (g[:, None] * 8 + ih[None, :])
        xsm = gok[:, None]
        sx0 = tl.load(sxrow + xidx, mask=xsm, other=0.0)[None, :, :]
        sx1 = tl.load(sxrow + xidx + 2, mask=xsm, other=0.0)[None, :, :]
        sx2 = tl.load(sxrow + xidx + 4, mask=xsm, other=0.0)[None, :, :]
        sx3 = tl.load(sxrow + xidx + 6, mask=xsm, other=0.0)[None, :, :]
        acc2 -= 1.5 * (d0 * sx0 + d1 * sx1 + d2 * sx2 + d3 * sx3)
        xw = xrow + (g[:, None, None] * 8 + i8[None, :, :])
        xm = gok[:, None, None]
        acc += d0[:, :, :, None] * _q6_part(wl0, wh, xw, XS, xm, 0, 0, ASM)  # r = 0
        acc += d1[:, :, :, None] * _q6_part(wl1, wh, xw, XS, xm, 1, 0, ASM)  # r = 1
        acc += d2[:, :, :, None] * _q6_part(wl0, wh, xw, XS, xm, 0, 1, ASM)  # r = 2
        acc += d3[:, :, :, None] * _q6_part(wl1, wh, xw, XS, xm, 1, 1, ASM)  # r = 3
    y = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1) + tl.sum(tl.sum(acc2, axis=2), axis=1)
    tl.store(y_ptr + m * stride_ym + rows, y, mask=row_ok)


# ------------------------------------------------------------------------------------------
# Q8_0: tile (BN, BLOCKS, 8 words); byte b of word w is element 4w + b, a signed code.
# ------------------------------------------------------------------------------------------

@triton.jit
def _f8(w, SH: tl.constexpr, ASM: tl.constexpr = False):
    """signed byte at bit SH -> 1 + (q + 128)/256 (the XOR flips the sign bit into an offset)"""
    return _bits(w, SH, 15, 0x7F8000, 0x3FC00000, ASM)


@triton.jit
def _q8_0_kernel(xp_ptr, sx_ptr, qs_ptr, d_ptr, y_ptr, N, NB, M, XS4, stride_pm, stride_sm, stride_ym,
                 BN: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr, ASM: tl.constexpr):
    pid = tl.program_id(0)
    m = pid % M
    rows = (pid // M) * BN + tl.arange(0, BN)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    bi = tl.arange(0, BLOCKS)
    i = tl.arange(0, 8)
    XS = XS4 * 4
    xrow = xp_ptr + m * stride_pm
    sxrow = sx_ptr + m * stride_sm
    qrow = qs_ptr + rows[:, None, None] * (NB * 8)
    drow = d_ptr + rows[:, None] * NB
    acc = tl.zeros((BN, BLOCKS, 8), dtype=tl.float32)
    acc2 = tl.zeros((BN, BLOCKS), dtype=tl.float32)
    for kb in tl.range(0, NB, BLOCKS, num_stages=STAGES):
        blk = kb + bi
        bok = blk < NB
        word = blk[:, None] * 8 + i[None, :]
        w = tl.load(qrow + word[None, :, :], mask=bok[None, :, None], other=0)
        d = tl.load(drow + blk[None, :], mask=bok[None, :], other=0.0).to(tl.float32) * 256.0
        sx = tl.load(sxrow + blk * 2, mask=bok, other=0.0) + tl.load(sxrow + blk * 2 + 1, mask=bok, other=0.0)
        acc2 -= 1.5 * d * sx[None, :]
        xw = xrow + word
        xm = bok[:, None]
        p = _f8(w, 0, ASM) * tl.load(xw, mask=xm, other=0.0)[None, :, :]
        p += _f8(w, 8, ASM) * tl.load(xw + XS, mask=xm, other=0.0)[None, :, :]
        p += _f8(w, 16, ASM) * tl.load(xw + 2 * XS, mask=xm, other=0.0)[None, :, :]
        p += _f8(w, 24, ASM) * tl.load(xw + 3 * XS, mask=xm, other=0.0)[None, :, :]
        acc += d[:, :, None] * p
    y = tl.sum(tl.sum(acc, axis=2), axis=1) + tl.sum(acc2, axis=1)
    tl.store(y_ptr + m * stride_ym + rows, y, mask=row_ok)


# ------------------------------------------------------------------------------------------
# Q4_0 / Q4_1 / Q5_0: tile (BN, BLOCKS, 4 words); word i, byte b: low nibble -> element
# 4i + b of the block, high -> 16 + 4i + b. Q5_0's fifth bit: bit (element) of qh.
# ------------------------------------------------------------------------------------------

@triton.jit
def _f5(w, qhi, SH: tl.constexpr, E: tl.constexpr):
    """5-bit code: nibble at bit SH of w, fifth bit at bit E of qhi -> 1 + q/32"""
    return (_mv(w, SH, 18, 0x3C0000) | _mv(qhi, E, 22, 0x400000) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _q4_x_kernel(xp_ptr, sx_ptr, qs_ptr, d_ptr, aux_ptr, y_ptr, N, NB, M, XS4, stride_pm, stride_sm, stride_ym,
                 VARIANT: tl.constexpr, BN: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr, ASM: tl.constexpr):
    # VARIANT 0: Q4_0, 1: Q4_1 (aux = m fp16), 2: Q5_0 (aux = qh int32)
    pid = tl.program_id(0)
    m = pid % M
    rows = (pid // M) * BN + tl.arange(0, BN)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    bi = tl.arange(0, BLOCKS)
    i = tl.arange(0, 4)
    XS = XS4 * 4
    xrow = xp_ptr + m * stride_pm
    sxrow = sx_ptr + m * stride_sm
    qrow = qs_ptr + rows[:, None, None] * (NB * 4)
    drow = rows[:, None] * NB
    acc = tl.zeros((BN, BLOCKS, 4), dtype=tl.float32)
    acc2 = tl.zeros((BN, BLOCKS), dtype=tl.float32)
    for kb in tl.range(0, NB, BLOCKS, num_stages=STAGES):
        blk = kb + bi
        bok = blk < NB
        word = blk[:, None] * 4 + i[None, :]
        w = tl.load(qrow + word[None, :, :], mask=bok[None, :, None], other=0)
        bm = bok[None, :]
        d = tl.load(d_ptr + drow + blk[None, :], mask=bm, other=0.0).to(tl.float32)
        sx = tl.load(sxrow + blk * 2, mask=bok, other=0.0) + tl.load(sxrow + blk * 2 + 1, mask=bok, other=0.0)
        xw = xrow + word
        xm = bok[:, None]
        x0 = tl.load(xw, mask=xm, other=0.0)[None, :, :]
        x1 = tl.load(xw + XS, mask=xm, other=0.0)[None, :, :]
        x2 = tl.load(xw + 2 * XS, mask=xm, other=0.0)[None, :, :]
        x3 = tl.load(xw + 3 * XS, mask=xm, other=0.0)[None, :, :]
        x4 = tl.load(xw + 4 * XS, mask=xm, other=0.0)[None, :, :]
        x5 = tl.load(xw + 5 * XS, mask=xm, other=0.0)[None, :, :]
        x6 = tl.load(xw + 6 * XS, mask=xm, other=0.0)[None, :, :]
        x7 = tl.load(xw + 7 * XS, mask=xm, other=0.0)[None, :, :]
        if VARIANT == 2:
            qh = tl.load(aux_ptr + drow + blk[None, :], mask=bm, other=0)
            qhi = qh[:, :, None] >> (4 * i)[None, None, :]  # bit 4i + b + 16h -> bit b + 16h
            p = _f5(w, qhi, 0, 0) * x0 + _f5(w, qhi, 8, 1) * x1 + _f5(w, qhi, 16, 2) * x2 + _f5(w, qhi, 24, 3) * x3
            p += _f5(w, qhi, 4, 16) * x4 + _f5(w, qhi, 12, 17) * x5 + _f5(w, qhi, 20, 18) * x6
            p += _f5(w, qhi, 28, 19) * x7
            acc += (32.0 * d)[:, :, None] * p
            acc2 -= 48.0 * d * sx[None, :]
        else:
            p = _f4(w, 0, ASM) * x0 + _f4(w, 8, ASM) * x1 + _f4(w, 16, ASM) * x2 + _f4(w, 24, ASM) * x3
            p += _f4(w, 4, ASM) * x4 + _f4(w, 12, ASM) * x5 + _f4(w, 20, ASM) * x6 + _f4(w, 28, ASM) * x7
            acc += (16.0 * d)[:, :, None] * p
            if VARIANT == 0:
                acc2 -= 24.0 * d * sx[None, :]
            else:
                mn = tl.load(aux_ptr + drow + blk[None, :], mask=bm, other=0.0).to(tl.float32)
                acc2 += (mn - 16.0 * d) * sx[None, :]
    y = tl.sum(tl.sum(acc, axis=2), axis=1) + tl.sum(acc2, axis=1)
    tl.store(y_ptr + m * stride_ym + rows, y, mask=row_ok)


# ------------------------------------------------------------------------------------------

def gemv_config(qtype: str, n: int, k: int) -> tuple[int, int, int, int]:
    """(BN rows, BLOCKS per step, num_warps, num_stages): the best of the H200 sweep of
    2026-12-01 (docs/performance.md). ncu on Q4_K 9728x2560: these kernels are latency-bound
    (25% achieved occupancy, DRAM 13% busy, grid under one wave): the next sweep should try
    small BN with long K steps (more programs in flight) and split-K for N <= 2560."""
    if qtype in ("Q4_K", "Q6_K"):
        if n >= 32768:
            return (32, 2, 4, 1)
        if n >= 16384:
            return (32, 1, 4, 1)
        if k <= 1536:
            return (16, 1, 4, 1)
        return (16, 2, 4, 3)
    if n >= 32768:
        return (16, 4, 4, 1)
    if n >= 4096:
        return (16, 8, 4, 1)
    if n >= 2048:
        return (16, 4, 4, 1)
    return (8, 16, 4, 3)


def _use_asm() -> bool:
    """Inline PTX only on a real GPU (the interpreter cannot run it); TALLOW_TRITON_GEMV_ASM=0
    falls back to plain Triton bit ops (same values, one more logic op per weight)."""
    return os.environ.get("TRITON_INTERPRET") != "1" and os.environ.get("TALLOW_TRITON_GEMV_ASM", "1") != "0"


_BLOCK = {"Q4_K": 256, "Q6_K": 256, "Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32}


def gemv(x: torch.Tensor | None, w: PlaneWeight, out: torch.Tensor | None = None, prep: GemvInput | None = None,
         config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """y = x @ W^T, float32 (M, N) (or (N,) for 1-D x). x (M, K) or (K,), M <= 8.

    `prep`: a GemvInput already filled for this x (by gemv_prep, rmsnorm or a GLU kernel); then
    x may be None and nothing but the GEMV is launched. Without it, a prep is made and filled
    here (two launches, and an allocation: not for CUDA graphs)."""
    if w.qtype not in SUPPORTED:
        raise ValueError(f"No Triton GEMV for {w.qtype}.")
    if prep is None:
        if x is None:
            raise ValueError("gemv needs x or a filled prep.")
        x2 = x.reshape(1, -1) if x.ndim == 1 else x
        if x2.shape[1] != w.k:
            raise ValueError(f"gemv: x has shape {tuple(x.shape)}, the weight wants K={w.k}.")
        prep = gemv_prep(x2.contiguous(), GemvInput(x2.shape[0], w.k, (w.qtype,), x2.device))
    if prep.k != w.k:
        raise ValueError(f"gemv: prep is for K={prep.k}, the weight has K={w.k}.")
    squeeze = x is not None and x.ndim == 1
    m_rows = prep.m
    if out is None:
        out = torch.empty((m_rows, w.n), dtype=torch.float32, device=prep.xp.device)
    out2 = out.reshape(m_rows, w.n) if out.ndim == 1 else out
    bn, blocks, warps, stages = config or gemv_config(w.qtype, w.n, w.k)
    xp = prep.plane(w.qtype)
    nb = w.k // _BLOCK[w.qtype]
    grid = (triton.cdiv(w.n, bn) * m_rows,)
    args = (w.n, nb, m_rows, w.k // FIELDS[w.qtype] // 4, xp.stride(0), prep.sx.stride(0), out2.stride(0))
    kw = dict(BN=bn, BLOCKS=blocks, STAGES=stages, ASM=_use_asm(), num_warps=warps)
    p = w.planes
    i32 = torch.int32
    if w.qtype == "Q4_K":
        _q4_k_kernel[grid](xp, prep.sx, p["qs"].view(i32), p["scales"].view(i32), p["dm"], out2, *args, **kw)
    elif w.qtype == "Q6_K":
        _q6_k_kernel[grid](xp, prep.sx, p["ql"].view(i32), p["qh"].view(i32), p["sc"], p["d"], out2, *args, **kw)
    elif w.qtype == "Q8_0":
        _q8_0_kernel[grid](xp, prep.sx, p["qs"].view(i32), p["d"], out2, *args, **kw)
    else:
        variant = {"Q4_0": 0, "Q4_1": 1, "Q5_0": 2}[w.qtype]
        aux = p["d"] if variant == 0 else (p["m"] if variant == 1 else p["qh"])
        _q4_x_kernel[grid](xp, prep.sx, p["qs"].view(i32), p["d"], aux, out2, *args, VARIANT=variant, **kw)
    return out.reshape(w.n) if squeeze and out.ndim == 2 else out


def concat_weights(ws: list[PlaneWeight]) -> PlaneWeight:
    """Several weights of one type sharing an input (Q, K, V; gate, up) as one weight of
    sum(N) rows: one GEMV launch computes all of them (slice the output by rows). A copy, made
    once at load time."""
    q, k = ws[0].qtype, ws[0].k
    if any(w.qtype != q or w.k != k for w in ws):
        raise ValueError("concat_weights: all weights must have the same type and K.")
    planes = {name: torch.cat([w.planes[name] for w in ws], dim=0) for name in ws[0].planes}
    return PlaneWeight(q, sum(w.n for w in ws), k, planes)


def gemv_multi(x: torch.Tensor | None, ws: list[PlaneWeight], outs: list[torch.Tensor] | None = None,
               prep: GemvInput | None = None) -> list[torch.Tensor]:
    """Several weights (any mix of types) over one input: one prep (all layouts at once, unless
    `prep` is given already filled) and one GEMV launch per weight. Concatenate same-type
    weights with concat_weights first to get one launch per type group."""
    if prep is None:
        x2 = x.reshape(1, -1) if x.ndim == 1 else x
        prep = gemv_prep(x2.contiguous(), GemvInput(x2.shape[0], ws[0].k, tuple(w.qtype for w in ws), x2.device))
    outs = outs or [None] * len(ws)
    return [gemv(x if prep is None else None, w, out=o, prep=prep) for w, o in zip(ws, outs)]


def gemv_reference(x: torch.Tensor, w: PlaneWeight) -> torch.Tensor:
    """fp32 x @ dequantize(W)^T."""
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    return x2.float() @ dequantize_planes(w).to(x.device).T
