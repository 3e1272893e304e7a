"""Decode matrix-vector products over quantized weights: y (M, N) = x (M, K) @ W^T, M <= 8.

Decode at batch 1 streams every weight byte once per token, so these kernels are built around
one rule: read each byte of W once, dequantize in registers, never write a dense copy.

Layout. W arrives as byte planes (planes.py): per row, the quant codes are one contiguous run,
the scales another. A program owns BLOCK_N output rows and walks K in steps of BLOCKS GGUF
blocks; at each step it loads a (BLOCK_N, chunks, 16|32) tile of code bytes -- the innermost
dim is contiguous in memory, so each thread issues 16-byte loads and a warp covers whole
sectors -- plus the few scale bytes of those blocks, rebuilds the fp32 weights exactly as
tallow/quant/reference.py does (same products, so the same weight values up to the compiler
contracting `d*q - m` into one fma), multiplies by the matching x elements (x is tiny and
stays in L1/L2) and accumulates elementwise in fp32. The cross-lane reduction happens once,
after the K loop.

Split-K. Where the row tiles alone do not fill the GPU (small matrices) or K is long, the
grid gets a second axis: program (tile, ks) walks only its share of K and stores a partial
row sum; an atomic ticket per row tile tells the last of its programs to finish, which adds
the partials in split order (0, 1, ...) and writes y. The order never depends on scheduling,
so results are deterministic and row r of an M-row product stays its one-row product. The
merging program resets its ticket, so the next launch (same stream) finds it at zero.

The nibble order of each type is not the element order (Q4_K: a 32-byte chunk holds elements
c*64+j in its low nibbles and c*64+32+j in its high ones), so instead of shuffling weights into
element order, each part of the tile loads x at the matching offsets: a sum over K does not
care about order.

M > 1 (speculative verification, short batches): one program reads and dequantizes its tile
once for all M <= 8 rows, keeping an accumulator per row updated by the same code for any M,
so each row is bit for bit its one-row product (decode and verification agree exactly).

Numerics: fp32 weights bit-identical to the reference's (up to fma contraction), fp32
products and sums; only the summation order differs from `x @ dequantize(W).T`, so the
relative error is a few fp32 ulps times sqrt(K).

Activations may be fp32 or fp16/bf16 (converted to fp32 on load); the output is fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ... import switches
from . import pdl
from .glu import _act
from .planes import PlaneWeight, dequantize_planes
from .rmsnorm import row_rstd

__all__ = ["quant_gemv", "quant_gemv_reference", "epilogue_addend", "gemv_config", "small_grid_split", "Prologue", "SUPPORTED"]

SUPPORTED = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")


# ------------------------------------------------------------------------------------------
# Prologues: the op before the product, folded into the x loads so it costs no launch of its
# own. x is tiny and every program walks all of K, so each program recomputing it is cheaper
# than a ~2.5 µs kernel at decode sizes (used where K is small; see gpu/linear.py).
#   PRO 0: x as given.
#   PRO 1: RMSNorm(x + a) * w   (a: the residual stream; the program of row tile 0 also writes
#          x + a to `s`, the new residual stream, for the next norm to read).
#   PRO 2: RMSNorm(x) * w.
#   PRO 3/4: SiLU/GELU(x[:K]) * x[K:2K]   (x: gate and up side by side; K = ffn).
# Same operations in the same order as rmsnorm.py and glu.py.
# ------------------------------------------------------------------------------------------

@triton.jit
def _prologue(x_row, a_row, s_row, K, eps, first, PRO: tl.constexpr, WRITE_SUM: tl.constexpr):
    rstd = 1.0
    if PRO == 1 or PRO == 2:
        rstd = row_rstd(x_row, a_row, s_row, K, eps, first, PRO == 1, WRITE_SUM, 1024)
    return rstd


@triton.jit
def _x(x_row, a_row, w_ptr, offs, mask, rstd, K, PRO: tl.constexpr):
    if PRO == 0:
        return tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
    elif PRO == 1 or PRO == 2:
        v = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        if PRO == 1:
            v += tl.load(a_row + offs, mask=mask, other=0.0).to(tl.float32)
        return (v * rstd) * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        g = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_row + K + offs, mask=mask, other=0.0).to(tl.float32)
        return _act(g, u, PRO - 3)


# ------------------------------------------------------------------------------------------
# Weight tiles, one function per quant type. Each rebuilds the fp32 weights of one K step of
# BLOCKS GGUF blocks for BLOCK_N rows as up to four tiles w0..w3 (BN, G, J) whose elements pair
# with x at xoff, xoff + S, xoff + 2S, xoff + 3S ((G, J) offsets, xmask masking a ragged tail).
# The kernel below multiplies them with each activation row.
# ------------------------------------------------------------------------------------------

@triton.jit
def _q4_k_scale_min(sbase, s_lo, s_hi, low):
    """The 6-bit (scale, min) of Q4_K sub-blocks s_lo and s_hi = s_lo + 1 from a block's 12 scale
    bytes at sbase (ggml's get_scale_min_k4); low: s_lo < 4, the same branch for both."""
    a_lo = tl.load(sbase + s_lo[None, :]).to(tl.int32)
    b_lo = tl.load(sbase + s_lo[None, :] + 4).to(tl.int32)
    c_lo = tl.load(sbase + tl.where(low, s_lo[None, :], s_lo[None, :] - 4)).to(tl.int32)
    a_hi = tl.load(sbase + s_hi[None, :]).to(tl.int32)
    b_hi = tl.load(sbase + s_hi[None, :] + 4).to(tl.int32)
    c_hi = tl.load(sbase + tl.where(low, s_hi[None, :], s_hi[None, :] - 4)).to(tl.int32)
    sc_lo = tl.where(low, a_lo & 63, (b_lo & 15) | ((c_lo >> 6) << 4))
    mn_lo = tl.where(low, b_lo & 63, (b_lo >> 4) | ((a_lo >> 6) << 4))
    sc_hi = tl.where(low, a_hi & 63, (b_hi & 15) | ((c_hi >> 6) << 4))
    mn_hi = tl.where(low, b_hi & 63, (b_hi >> 4) | ((a_hi >> 6) << 4))
    return sc_lo, mn_lo, sc_hi, mn_hi


# Q4_K: 256-element blocks; per block dm (d, dmin fp16), 12 bytes of 6-bit (scale, min) x 8,
# 128 bytes of nibbles in 4 chunks of 32 bytes: chunk c, byte j -> element c*64+j (low nibble),
# c*64+32+j (high nibble); sub-block (32 elements) 2c and 2c+1.
@triton.jit
def _q4_k_tiles(qs_ptr, sc_ptr, dm_ptr, rows, kb, nb, kend, G: tl.constexpr):
    g = tl.arange(0, G)  # G = BLOCKS * 4 chunks of 32 bytes per step
    j = tl.arange(0, 32)
    chunk = kb * 4 + g  # (G,) chunk index within the row
    ok = chunk < kend * 4
    chunk = tl.where(ok, chunk, 0)
    blk = chunk // 4
    q = tl.load(qs_ptr + rows[:, None, None] * (nb * 128) + chunk[None, :, None] * 32 + j[None, None, :],
                mask=ok[None, :, None], other=0).to(tl.int32)  # (BN, G, 32)
    # 6-bit scale/min of sub-blocks s_lo = 2*(c%4) and s_hi = s_lo + 1
    sbase = sc_ptr + rows[:, None] * (nb * 12) + blk[None, :] * 12  # (BN, G)
    s_lo = (chunk % 4) * 2
    s_hi = s_lo + 1
    d = tl.load(dm_ptr + rows[:, None] * (nb * 2) + blk[None, :] * 2).to(tl.float32)
    dmin = tl.load(dm_ptr + rows[:, None] * (nb * 2) + blk[None, :] * 2 + 1).to(tl.float32)
    # s_lo is 0,2 (< 4) or 4,6 (>= 4); s_hi likewise 1,3 or 5,7: same branch for both
    low = s_lo[None, :] < 4
    sc_lo, mn_lo, sc_hi, mn_hi = _q4_k_scale_min(sbase, s_lo, s_hi, low)
    dl_lo = d * sc_lo.to(tl.float32)
    ml_lo = dmin * mn_lo.to(tl.float32)
    dl_hi = d * sc_hi.to(tl.float32)
    ml_hi = dmin * mn_hi.to(tl.float32)
    w_lo = (q & 15).to(tl.float32) * dl_lo[:, :, None] - ml_lo[:, :, None]
    w_hi = (q >> 4).to(tl.float32) * dl_hi[:, :, None] - ml_hi[:, :, None]
    xoff = chunk[:, None] * 64 + j[None, :]  # (G, 32) element of the low nibble; the high one is +32
    return w_lo, w_hi, w_lo, w_lo, xoff, ok[:, None]


# Q6_K: 256-element blocks; ql 128 bytes, qh 64 bytes, 16 int8 scales, d fp16.
# Element e = half*128 + r*32 + t (half 0..1, r 0..3, t 0..31):
#   low 4 bits: ql[half*64 + (r%2)*32 + t], nibble r//2;  high 2 bits: qh[half*32 + t] >> 2r;
#   scale index e // 16 = half*8 + r*2 + t//16.
# The tile splits t = hh*16 + jj so one 16-element run shares a scale: index h = 2*g + hh with
# g = block*2 + half the "half-block" of the row.
@triton.jit
def _q6_k_tiles(ql_ptr, qh_ptr, sc_ptr, d_ptr, rows, kb, nb, kend, H: tl.constexpr):
    hidx = tl.arange(0, H)  # H = BLOCKS * 4 runs of 16 bytes per step
    jj = tl.arange(0, 16)
    h = kb * 4 + hidx
    ok = h < kend * 4
    h = tl.where(ok, h, 0)
    g = h // 2
    hh = h % 2
    boff = (g * 64 + hh * 16)[None, :, None] + jj[None, None, :]  # (1, H, 16)
    lrow = ql_ptr + rows[:, None, None] * (nb * 128)
    qa = tl.load(lrow + boff, mask=ok[None, :, None], other=0).to(tl.int32)  # r = 0, 2
    qb = tl.load(lrow + boff + 32, mask=ok[None, :, None], other=0).to(tl.int32)  # r = 1, 3
    qhv = tl.load(qh_ptr + rows[:, None, None] * (nb * 64) + (g * 32 + hh * 16)[None, :, None]
                  + jj[None, None, :], mask=ok[None, :, None], other=0).to(tl.int32)
    d = tl.load(d_ptr + rows[:, None] * nb + (g // 2)[None, :]).to(tl.float32)  # (BN, H)
    srow = sc_ptr + rows[:, None] * (nb * 16) + (g * 8 + hh)[None, :]
    dl0 = d * tl.load(srow).to(tl.float32)
    dl1 = d * tl.load(srow + 2).to(tl.float32)
    dl2 = d * tl.load(srow + 4).to(tl.float32)
    dl3 = d * tl.load(srow + 6).to(tl.float32)
    q0 = ((qa & 15) | ((qhv & 3) << 4)) - 32
    q1 = ((qb & 15) | (((qhv >> 2) & 3) << 4)) - 32
    q2 = ((qa >> 4) | (((qhv >> 4) & 3) << 4)) - 32
    q3 = ((qb >> 4) | (((qhv >> 6) & 3) << 4)) - 32
    xoff = (g * 128 + hh * 16)[:, None] + jj[None, :]  # (H, 16); r = 1..3 at +32, +64, +96
    return (dl0[:, :, None] * q0.to(tl.float32), dl1[:, :, None] * q1.to(tl.float32),
            dl2[:, :, None] * q2.to(tl.float32), dl3[:, :, None] * q3.to(tl.float32), xoff, ok[:, None])


# Q8_0: 32-element blocks; d fp16, 32 int8 codes in element order. w = q * d.
@triton.jit
def _q8_0_tiles(qs_ptr, d_ptr, rows, kb, nb, kend, BLOCKS: tl.constexpr):
    blk = kb + tl.arange(0, BLOCKS)
    j = tl.arange(0, 32)
    ok = blk < kend
    blk = tl.where(ok, blk, 0)
    q = tl.load(qs_ptr + rows[:, None, None] * (nb * 32) + blk[None, :, None] * 32 + j[None, None, :],
                mask=ok[None, :, None], other=0)
    d = tl.load(d_ptr + rows[:, None] * nb + blk[None, :]).to(tl.float32)
    w = q.to(tl.float32) * d[:, :, None]
    return w, w, w, w, blk[:, None] * 32 + j[None, :], ok[:, None]


# Q4_0 / Q4_1 / Q5_0: 32-element blocks, 16 code bytes: byte j -> element j (low nibble) and
# j+16 (high nibble). Q4_0: d*(q-8); Q4_1: d*q + m; Q5_0: d*((q | bit<<4) - 16), bit j of qh.
@triton.jit
def _q4_x_tiles(qs_ptr, d_ptr, aux_ptr, rows, kb, nb, kend, BLOCKS: tl.constexpr, VARIANT: tl.constexpr):
    # VARIANT 0: Q4_0, 1: Q4_1 (aux = m fp16), 2: Q5_0 (aux = qh int32)
    blk = kb + tl.arange(0, BLOCKS)
    jj = tl.arange(0, 16)
    ok = blk < kend
    blk = tl.where(ok, blk, 0)
    q = tl.load(qs_ptr + rows[:, None, None] * (nb * 16) + blk[None, :, None] * 16 + jj[None, None, :],
                mask=ok[None, :, None], other=0).to(tl.int32)
    sidx = rows[:, None] * nb + blk[None, :]
    d = tl.load(d_ptr + sidx).to(tl.float32)[:, :, None]
    lo = q & 15
    hi = q >> 4
    if VARIANT == 0:
        w_lo = d * (lo - 8).to(tl.float32)
        w_hi = d * (hi - 8).to(tl.float32)
    elif VARIANT == 1:
        mn = tl.load(aux_ptr + sidx).to(tl.float32)[:, :, None]
        w_lo = d * lo.to(tl.float32) + mn
        w_hi = d * hi.to(tl.float32) + mn
    else:
        qh = tl.load(aux_ptr + sidx)[:, :, None]
        b_lo = (qh >> jj[None, None, :]) & 1
        b_hi = (qh >> (jj[None, None, :] + 16)) & 1
        w_lo = d * ((lo | (b_lo << 4)) - 16).to(tl.float32)
        w_hi = d * ((hi | (b_hi << 4)) - 16).to(tl.float32)
    return w_lo, w_hi, w_lo, w_lo, blk[:, None] * 32 + jj[None, :], ok[:, None]


# ------------------------------------------------------------------------------------------
# The kernel: one program per BLOCK_N output rows, for all ROWS (1..8) activation rows at once,
# so a verification pass of speculative decoding reads and dequantizes each weight byte once
# for all its tokens. Row r has its own accumulator, updated by the same code whatever ROWS is
# (helpers below, unrolled by constexpr `r < ROWS`), so row r of a ROWS-row product is bit for
# bit the one-row product of x[r]: what makes verified drafts exact.
# ------------------------------------------------------------------------------------------

@triton.jit
def _row_rstd(x_ptr, a_ptr, s_ptr, stride_xm, stride_am, stride_sm, K, eps, first,
              r: tl.constexpr, ROWS: tl.constexpr, PRO: tl.constexpr, WRITE_SUM: tl.constexpr):
    rstd = 1.0
    if r < ROWS:
        rstd = _prologue(x_ptr + r * stride_xm, a_ptr + r * stride_am, s_ptr + r * stride_sm, K, eps, first,
                         PRO, WRITE_SUM)
    return rstd


@triton.jit
def _row_fma(acc, w0, w1, w2, w3, xoff, xmask, x_ptr, a_ptr, w_ptr, stride_xm, stride_am, rstd, K,
             r: tl.constexpr, ROWS: tl.constexpr, PRO: tl.constexpr, T: tl.constexpr, S: tl.constexpr):
    if r < ROWS:
        x_row = x_ptr + r * stride_xm
        a_row = a_ptr + r * stride_am
        t = w0 * _x(x_row, a_row, w_ptr, xoff, xmask, rstd, K, PRO)[None, :, :]
        if T > 1:
            t += w1 * _x(x_row, a_row, w_ptr, xoff + S, xmask, rstd, K, PRO)[None, :, :]
        if T > 2:
            t += w2 * _x(x_row, a_row, w_ptr, xoff + 2 * S, xmask, rstd, K, PRO)[None, :, :]
            t += w3 * _x(x_row, a_row, w_ptr, xoff + 3 * S, xmask, rstd, K, PRO)[None, :, :]
        acc += t
    return acc


@triton.jit
def _store_row(y_ptr, stride_ym, rows, row_ok, y, r: tl.constexpr, ROWS: tl.constexpr, add_ptr, stride_addm,
               ADD: tl.constexpr):
    if r < ROWS:
        if ADD:  # the epilogue's addend (a bias: stride 0), the same fp32 add a separate launch would make
            y = y + tl.load(add_ptr + r * stride_addm + rows, mask=row_ok, other=0.0)
        tl.store(y_ptr + r * stride_ym + rows, y, mask=row_ok)


@triton.jit
def _split_merge(part_ptr, y_ptr, stride_ym, N, rows, row_ok, r: tl.constexpr, ROWS: tl.constexpr,
                 SPLIT: tl.constexpr, add_ptr, stride_addm, ADD: tl.constexpr):
    # Split order, whichever program came last: the result does not depend on scheduling, and
    # row r of a ROWS-row product still equals its one-row product bit for bit. ".cg" reads
    # past L1 (not coherent across SMs) the partials other programs wrote.
    if r < ROWS:
        total = tl.load(part_ptr + r * N + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT):
            total += tl.load(part_ptr + (s * ROWS + r) * N + rows, mask=row_ok, other=0.0, cache_modifier=".cg")
        if ADD:
            total = total + tl.load(add_ptr + r * stride_addm + rows, mask=row_ok, other=0.0)
        tl.store(y_ptr + r * stride_ym + rows, total, mask=row_ok)


@triton.jit
def _store_rows(y_ptr, stride_ym, rows, row_ok, y0, y1, y2, y3, y4, y5, y6, y7, ROWS: tl.constexpr, add_ptr, stride_addm,
                ADD: tl.constexpr):
    _store_row(y_ptr, stride_ym, rows, row_ok, y0, 0, ROWS, add_ptr, stride_addm, ADD)
    _store_row(y_ptr, stride_ym, rows, row_ok, y1, 1, ROWS, add_ptr, stride_addm, ADD)
    _store_row(y_ptr, stride_ym, rows, row_ok, y2, 2, ROWS, add_ptr, stride_addm, ADD)
    _store_row(y_ptr, stride_ym, rows, row_ok, y3, 3, ROWS, add_ptr, stride_addm, ADD)
    _store_row(y_ptr, stride_ym, rows, row_ok, y4, 4, ROWS, add_ptr, stride_addm, ADD)
    _store_row(y_ptr, stride_ym, rows, row_ok, y5, 5, ROWS, add_ptr, stride_addm, ADD)
    _store_row(y_ptr, stride_ym, rows, row_ok, y6, 6, ROWS, add_ptr, stride_addm, ADD)
    _store_row(y_ptr, stride_ym, rows, row_ok, y7, 7, ROWS, add_ptr, stride_addm, ADD)


@triton.jit
def _finish_rows(y_ptr, stride_ym, part_ptr, ticket_ptr, pid, ks, N, rows, row_ok,
                 y0, y1, y2, y3, y4, y5, y6, y7, ROWS: tl.constexpr, SPLIT: tl.constexpr,
                 add_ptr, stride_addm, ADD: tl.constexpr):
    """A GEMV program's row sums y0..y7 (those below ROWS) into y; with K splits, into this
    split's partials part[ks, r, rows], then a ticket per row tile: the last of its programs to
    finish merges them in split order and resets the ticket for the next launch. ADD: y + the
    addend add[r, rows] as it is stored (a bias, stride_addm 0; another branch's output), after
    the split merge where there is one."""
    if SPLIT == 1:
        _store_rows(y_ptr, stride_ym, rows, row_ok, y0, y1, y2, y3, y4, y5, y6, y7, ROWS, add_ptr, stride_addm, ADD)
    else:
        _store_rows(part_ptr + ks * (ROWS * N), N, rows, row_ok, y0, y1, y2, y3, y4, y5, y6, y7, ROWS, add_ptr,
                    stride_addm, False)
    if SPLIT > 1:
        tl.debug_barrier()  # every thread's partial stored before the ticket releases them
        ticket = tl.atomic_add(ticket_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            _split_merge(part_ptr, y_ptr, stride_ym, N, rows, row_ok, 0, ROWS, SPLIT, add_ptr, stride_addm, ADD)
            _split_merge(part_ptr, y_ptr, stride_ym, N, rows, row_ok, 1, ROWS, SPLIT, add_ptr, stride_addm, ADD)
            _split_merge(part_ptr, y_ptr, stride_ym, N, rows, row_ok, 2, ROWS, SPLIT, add_ptr, stride_addm, ADD)
            _split_merge(part_ptr, y_ptr, stride_ym, N, rows, row_ok, 3, ROWS, SPLIT, add_ptr, stride_addm, ADD)
            _split_merge(part_ptr, y_ptr, stride_ym, N, rows, row_ok, 4, ROWS, SPLIT, add_ptr, stride_addm, ADD)
            _split_merge(part_ptr, y_ptr, stride_ym, N, rows, row_ok, 5, ROWS, SPLIT, add_ptr, stride_addm, ADD)
            _split_merge(part_ptr, y_ptr, stride_ym, N, rows, row_ok, 6, ROWS, SPLIT, add_ptr, stride_addm, ADD)
            _split_merge(part_ptr, y_ptr, stride_ym, N, rows, row_ok, 7, ROWS, SPLIT, add_ptr, stride_addm, ADD)
            tl.atomic_xchg(ticket_ptr + pid, 0, sem="relaxed", scope="gpu")  # ready for the next launch


@triton.jit
def _tiles(p0, p1, p2, p3, rows, kb, nb, kend, QT: tl.constexpr, G: tl.constexpr):
    if QT == 0:
        return _q4_k_tiles(p0, p1, p2, rows, kb, nb, kend, G)
    elif QT == 1:
        return _q6_k_tiles(p0, p1, p2, p3, rows, kb, nb, kend, G)
    elif QT == 2:
        return _q8_0_tiles(p0, p1, rows, kb, nb, kend, G)
    else:
        return _q4_x_tiles(p0, p1, p2, rows, kb, nb, kend, G, QT - 3)


@triton.jit
def _gemv_kernel(x_ptr, p0, p1, p2, p3, y_ptr, N, K, stride_xm, stride_ym,
                 a_ptr, w_ptr, s_ptr, stride_am, stride_sm, eps, part_ptr, ticket_ptr, split_blocks,
                 PRO: tl.constexpr, WRITE_SUM: tl.constexpr,
                 QT: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr,
                 STAGES: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr, J: tl.constexpr,
                 T: tl.constexpr, S: tl.constexpr, SPLIT: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr,
                 add_ptr, stride_addm, ADD: tl.constexpr):
    # QT 0: Q4_K, 1: Q6_K, 2: Q8_0, 3/4/5: Q4_0/Q4_1/Q5_0. BLOCK_K: elements per GGUF block.
    # Axis 1 splits K (SPLIT > 1): program (pid, ks) covers GGUF blocks [ks*split_blocks,
    # (ks+1)*split_blocks) and the last of a row tile's SPLIT programs to finish sums their
    # partials in split order (see _split_merge).
    pid = tl.program_id(0)
    ks = tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)  # clamp: loads stay unmasked along rows
    nb = K // BLOCK_K
    kstart = ks * split_blocks
    kend = tl.minimum(nb, kstart + split_blocks)
    if PREFETCH:
        # Each step's weights are loaded one step ahead, the first before the wait for the
        # previous kernel (pdl.py): no kernel writes weights, so with PDL their fetch overlaps
        # that kernel's tail. (Past kend the tiles are masked: no bytes are read.)
        n0, n1, n2, n3, noff, nm = _tiles(p0, p1, p2, p3, rows, kstart, nb, kend, QT, G)
    pdl.wait(PDL)
    first = (pid == 0) & (ks == 0)  # the program that writes the prologue's residual sum
    r0 = _row_rstd(x_ptr, a_ptr, s_ptr, stride_xm, stride_am, stride_sm, K, eps, first, 0, ROWS, PRO, WRITE_SUM)
    r1 = _row_rstd(x_ptr, a_ptr, s_ptr, stride_xm, stride_am, stride_sm, K, eps, first, 1, ROWS, PRO, WRITE_SUM)
    r2 = _row_rstd(x_ptr, a_ptr, s_ptr, stride_xm, stride_am, stride_sm, K, eps, first, 2, ROWS, PRO, WRITE_SUM)
    r3 = _row_rstd(x_ptr, a_ptr, s_ptr, stride_xm, stride_am, stride_sm, K, eps, first, 3, ROWS, PRO, WRITE_SUM)
    r4 = _row_rstd(x_ptr, a_ptr, s_ptr, stride_xm, stride_am, stride_sm, K, eps, first, 4, ROWS, PRO, WRITE_SUM)
    r5 = _row_rstd(x_ptr, a_ptr, s_ptr, stride_xm, stride_am, stride_sm, K, eps, first, 5, ROWS, PRO, WRITE_SUM)
    r6 = _row_rstd(x_ptr, a_ptr, s_ptr, stride_xm, stride_am, stride_sm, K, eps, first, 6, ROWS, PRO, WRITE_SUM)
    r7 = _row_rstd(x_ptr, a_ptr, s_ptr, stride_xm, stride_am, stride_sm, K, eps, first, 7, ROWS, PRO, WRITE_SUM)
    acc0 = tl.zeros((BLOCK_N, G, J), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, G, J), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, G, J), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, G, J), dtype=tl.float32)
    acc4 = tl.zeros((BLOCK_N, G, J), dtype=tl.float32)
    acc5 = tl.zeros((BLOCK_N, G, J), dtype=tl.float32)
    acc6 = tl.zeros((BLOCK_N, G, J), dtype=tl.float32)
    acc7 = tl.zeros((BLOCK_N, G, J), dtype=tl.float32)
    for kb in tl.range(kstart, kend, BLOCKS, num_stages=STAGES):
        if PREFETCH:
            w0, w1, w2, w3, xoff, xm = n0, n1, n2, n3, noff, nm
            n0, n1, n2, n3, noff, nm = _tiles(p0, p1, p2, p3, rows, kb + BLOCKS, nb, kend, QT, G)
        else:
            w0, w1, w2, w3, xoff, xm = _tiles(p0, p1, p2, p3, rows, kb, nb, kend, QT, G)
        acc0 = _row_fma(acc0, w0, w1, w2, w3, xoff, xm, x_ptr, a_ptr, w_ptr, stride_xm, stride_am, r0, K, 0, ROWS, PRO, T, S)
        acc1 = _row_fma(acc1, w0, w1, w2, w3, xoff, xm, x_ptr, a_ptr, w_ptr, stride_xm, stride_am, r1, K, 1, ROWS, PRO, T, S)
        acc2 = _row_fma(acc2, w0, w1, w2, w3, xoff, xm, x_ptr, a_ptr, w_ptr, stride_xm, stride_am, r2, K, 2, ROWS, PRO, T, S)
        acc3 = _row_fma(acc3, w0, w1, w2, w3, xoff, xm, x_ptr, a_ptr, w_ptr, stride_xm, stride_am, r3, K, 3, ROWS, PRO, T, S)
        acc4 = _row_fma(acc4, w0, w1, w2, w3, xoff, xm, x_ptr, a_ptr, w_ptr, stride_xm, stride_am, r4, K, 4, ROWS, PRO, T, S)
        acc5 = _row_fma(acc5, w0, w1, w2, w3, xoff, xm, x_ptr, a_ptr, w_ptr, stride_xm, stride_am, r5, K, 5, ROWS, PRO, T, S)
        acc6 = _row_fma(acc6, w0, w1, w2, w3, xoff, xm, x_ptr, a_ptr, w_ptr, stride_xm, stride_am, r6, K, 6, ROWS, PRO, T, S)
        acc7 = _row_fma(acc7, w0, w1, w2, w3, xoff, xm, x_ptr, a_ptr, w_ptr, stride_xm, stride_am, r7, K, 7, ROWS, PRO, T, S)
    _finish_rows(y_ptr, stride_ym, part_ptr, ticket_ptr, pid, ks, N, rows, row_ok,
                 tl.sum(tl.sum(acc0, axis=2), axis=1), tl.sum(tl.sum(acc1, axis=2), axis=1),
                 tl.sum(tl.sum(acc2, axis=2), axis=1), tl.sum(tl.sum(acc3, axis=2), axis=1),
                 tl.sum(tl.sum(acc4, axis=2), axis=1), tl.sum(tl.sum(acc5, axis=2), axis=1),
                 tl.sum(tl.sum(acc6, axis=2), axis=1), tl.sum(tl.sum(acc7, axis=2), axis=1), ROWS, SPLIT,
                 add_ptr, stride_addm, ADD)


# Per type: kernel code, elements per GGUF block, and the tile layout (G per BLOCKS, J, terms T
# at stride S) that its tile function returns.
_LAYOUT = {"Q4_K": (0, 256, 4, 32, 2, 32), "Q6_K": (1, 256, 4, 16, 4, 32), "Q8_0": (2, 32, 1, 32, 1, 0),
           "Q4_0": (3, 32, 1, 16, 2, 16), "Q4_1": (4, 32, 1, 16, 2, 16), "Q5_0": (5, 32, 1, 16, 2, 16)}
_PLANES = {"Q4_K": ("qs", "scales", "dm"), "Q6_K": ("ql", "qh", "sc", "d"), "Q8_0": ("qs", "d"),
           "Q4_0": ("qs", "d"), "Q4_1": ("qs", "d", "m"), "Q5_0": ("qs", "d", "qh")}


# ------------------------------------------------------------------------------------------

def gemv_config(qtype: str, n: int, k: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_N, BLOCKS per K step, num_warps, num_stages, K splits) for a shape, from the H200
    sweeps in docs/performance.md (2026-11-30, widened 2026-11-29, split-K 2026-12-01).
    num_stages > 1 lets Triton's pipeliner prefetch the next steps' bytes with cp.async. Many
    rows (lm head) want wide row tiles; a long K or a grid smaller than the GPU wants K splits.
    Splitting costs each extra program its fixed part (address setup, the cross-warp reduction,
    the partial's store and the merge), so it loses wherever the grid is already large: the
    split-K sweep measured it slower on every qwen3-4b shape but the long-K Q6_K down."""
    if qtype in ("Q4_K", "Q6_K"):
        if n >= 32768:
            cfg = (32, 2, 8, 1, 1)
        elif qtype == "Q6_K" and k >= 8192:
            cfg = (8, 2, 4, 1, 4)
        elif n >= 4096 and k <= 4096:
            cfg = (8, 2, 4, 3, 1)
        else:
            cfg = (4, 4, 4, 3, 1)
    elif n >= 32768:
        cfg = (32, 2, 8, 1, 1)
    elif k >= 4096:
        cfg = (4, 8, 4, 1, 4) if qtype == "Q8_0" else (8, 8, 4, 1, 4)
    else:
        cfg = (8, 8, 4, 1, small_grid_split(qtype, n, k, 8, 8))
    if not switches.enabled("TALLOW_GEMV_SPLITK"):
        cfg = cfg[:4] + (1,)
    return cfg


SMALL_GRID = 132  # the H200's SMs: a grid of fewer row tiles leaves SMs idle, so split K


def small_grid_split(qtype: str, n: int, k: int, block_n: int, blocks: int) -> int:
    """As many K splits as the program has K steps (at most 8) when the row tiles alone do not
    fill the GPU (smollm2's q+k+v, o and down: 72-120 tiles); else none."""
    if triton.cdiv(n, block_n) >= SMALL_GRID:
        return 1
    return max(1, min(8, triton.cdiv(k // _LAYOUT[qtype][1], blocks)))


_TICKETS: dict = {}
TICKET_SLOTS = 1 << 16  # one int32 per row tile; zero between launches (the merging program resets its own)


def _tickets(device: torch.device) -> torch.Tensor:
    """Per device, allocated (zeroed) once, outside any graph capture if the first split call is
    eager. Launches on one stream run one after another, so all GEMVs share the slots."""
    t = _TICKETS.get(device)
    if t is None:
        t = _TICKETS[device] = torch.zeros(TICKET_SLOTS, dtype=torch.int32, device=device)
    return t


@dataclass
class Prologue:
    """The op folded into a GEMV's x loads (see `_prologue`): kind "norm" (RMSNorm of x, plus
    `residual` when given, times `weight`; `sum_out` receives x + residual) or "swiglu"/"geglu"
    (x holds gate and up side by side, K = ffn)."""

    kind: str
    weight: torch.Tensor | None = None
    eps: float = 0.0
    residual: torch.Tensor | None = None
    sum_out: torch.Tensor | None = None

    @property
    def code(self) -> int:
        if self.kind == "norm":
            return 1 if self.residual is not None else 2
        return {"swiglu": 3, "geglu": 4}[self.kind]


def quant_gemv(x: torch.Tensor, w: PlaneWeight, out: torch.Tensor | None = None,
               config: tuple[int, int, int, int] | None = None, prologue: Prologue | None = None,
               add: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T. x float32/float16/bfloat16 (M, K) or (K,) with M <= 8 -> float32 (M, N).

    `out` (float32 (M, N), unit last stride) lets a CUDA-graph caller keep a static output buffer.
    With a `prologue`, the product is over prologue(x) instead (x is (M, 2K) for a GLU). `add`
    (float32 (N,) or (M, N)): y + add, added as y is stored (epilogue_addend)."""
    if w.qtype not in SUPPORTED:
        raise ValueError(f"No Triton GEMV for {w.qtype}.")
    squeeze = x.ndim == 1
    x2 = x.reshape(1, -1) if squeeze else x
    pro = prologue.code if prologue is not None else 0
    width = 2 * w.k if pro >= 3 else w.k
    if x2.ndim != 2 or x2.shape[1] != width:
        raise ValueError(f"quant_gemv: x has shape {tuple(x.shape)}, the weight wants K={w.k}.")
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m_rows = x2.shape[0]
    if not 1 <= m_rows <= 8:
        raise ValueError(f"quant_gemv takes 1 to 8 rows, got {m_rows}.")
    if out is None:
        out = torch.empty((m_rows, w.n), dtype=torch.float32, device=x2.device)
    a = prologue.residual if pro == 1 else x2
    wt = prologue.weight if pro in (1, 2) else x2
    sum_out = prologue.sum_out if pro == 1 and prologue.sum_out is not None else None
    s_t = sum_out if sum_out is not None else x2
    cfg = tuple(config) if config is not None else gemv_config(w.qtype, w.n, w.k)
    block_n, blocks, warps, stages = cfg[:4]
    split = cfg[4] if len(cfg) > 4 else 1
    qt, block_k, g_per, j, terms, stride = _LAYOUT[w.qtype]
    tiles = triton.cdiv(w.n, block_n)
    nb = w.k // block_k
    split = max(1, min(split, triton.cdiv(nb, blocks))) if tiles <= TICKET_SLOTS else 1
    split_blocks = triton.cdiv(triton.cdiv(nb, split), blocks) * blocks  # whole K steps per split
    split = triton.cdiv(nb, split_blocks)  # no empty split
    if split > 1:
        part = torch.empty((split, m_rows, w.n), dtype=torch.float32, device=x2.device)
        tickets = _tickets(x2.device)
    else:
        part = tickets = out  # unused
    planes = [w.planes[name] for name in _PLANES[w.qtype]]
    planes += [planes[0]] * (4 - len(planes))  # unused pointer slots
    _gemv_kernel[(tiles, split)](
        x2, *planes, out, w.n, w.k, x2.stride(0), out.stride(0), a, wt, s_t, a.stride(0), s_t.stride(0),
        float(prologue.eps) if prologue is not None else 0.0, part, tickets, split_blocks,
        PRO=pro, WRITE_SUM=sum_out is not None,
        QT=qt, ROWS=m_rows, BLOCK_N=block_n, BLOCKS=blocks, STAGES=stages, BLOCK_K=block_k,
        G=blocks * g_per, J=j, T=terms, S=stride, SPLIT=split, PREFETCH=switches.enabled("TALLOW_GEMV_PREFETCH"),
        **epilogue_addend(add, m_rows, w.n, out), num_warps=warps, **pdl.launch(x2.device))
    return out.reshape(w.n) if squeeze else out


def epilogue_addend(add: torch.Tensor | None, m_rows: int, n: int, out: torch.Tensor) -> dict:
    """A GEMV launch's add_ptr, stride_addm and ADD arguments: `add` (N,) (a bias, every row) or
    (m_rows, N) float32 with a unit last stride, or None (out stands in as an unused pointer)."""
    if add is None:
        return dict(add_ptr=out, stride_addm=0, ADD=False)
    if add.dtype != torch.float32 or add.shape[-1] != n or add.stride(-1) != 1 or add.dim() > 2 \
            or (add.dim() == 2 and add.shape[0] != m_rows):
        raise ValueError(f"GEMV epilogue: the addend {tuple(add.shape)} {add.dtype} does not fit y ({m_rows}, {n}).")
    return dict(add_ptr=add, stride_addm=add.stride(0) if add.dim() == 2 and m_rows > 1 else 0, ADD=True)


def quant_gemv_reference(x: torch.Tensor, w: PlaneWeight) -> torch.Tensor:
    """The slow exact path: dequantize W to fp32, fp32 matmul (float64 accumulate is not
    needed at these sizes; fp32 is what the kernel is held to)."""
    return x.float() @ dequantize_planes(w).to(x.device).T
