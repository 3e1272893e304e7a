"""Routed experts' prefill product: the (token, slot) pairs sorted by expert, one launch per
projection that reads each touched expert's quantized bytes once and multiplies on tensor cores.

The earlier grouped prefill dequantized every expert of a layer to bf16 in a scratch buffer and ran
torch._grouped_mm over it: 2 bytes written and read per weight of all 128 experts whatever the
prompt's length (1.2 GB a layer on Qwen3-30B-A3B). Here the weight tile is rebuilt in registers,
exactly as dequant.py / fp4_dequantize_to write it (fp32 value rounded once to bf16), and x's rows
are rounded to bf16 as that path did, so only the fp32 accumulation order differs from it.

Layout (`group_pairs`): `order` the pairs sorted by expert (stable, so pair order within an
expert), `offsets[e]` where expert e's run starts (E + 1 entries), and each expert's run cut into
blocks of BLOCK_M pairs: `bstart[e]` the first block of expert e, `bcum[e]` one past its last.
The grid has cdiv(P, BLOCK_M) + min(E, P) blocks (every expert adds at most one partial block),
a bound known on the host without reading the routing, so nothing waits for the host and a
prefill chunk stays one CUDA graph; blocks past the last expert's end return at once. A program
finds its expert by counting the experts whose blocks end at or before it (one vector load).

x rows: GATHER reads row order[s] // X_DIV for sorted position s; otherwise row s (the bank passes
x gathered in expert order and rounded to bf16 already -- one launch -- so the tiles are plain
loads into the tensor cores). Output rows: SCATTER writes pair order[s] (down: back in pair order
for the weighted sum), otherwise row s.
Switch: TALLOW_MOE_GROUPED_PREFILL=0 (kernels/gpu/moe.py) takes the dequantize-all path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import INTERPRETED
from .fp4_gemv import NVFP4, _e2m1_doubled, _ue4m3_half
from .moe_gemv import ExpertWeights, expert_matrices

__all__ = ["GroupedPairs", "group_pairs", "moe_grouped", "moe_grouped_ok", "moe_grouped_reference", "grouped_block_m"]

_QT = {"Q4_K": 0, "Q6_K": 1, "Q8_0": 2}  # plane types with a tile here; NVFP4 raw blocks: 3


def moe_grouped_ok(w: ExpertWeights) -> bool:
    """Whether this stacked expert weight has a grouped tensor-core kernel here."""
    return (w.planes is not None and w.planes.qtype in _QT) or (w.raw is not None and w.qtype == NVFP4)


@dataclass
class GroupedPairs:
    order: torch.Tensor  # (P,) int64: pair indices sorted by expert
    offsets: torch.Tensor  # (E + 1,) int32
    bstart: torch.Tensor  # (E,) int32: first block of each expert
    bcum: torch.Tensor  # (E,) int32: one past each expert's last block
    block_m: int
    max_blocks: int


def grouped_block_m(w: ExpertWeights, pairs: int, n_experts: int) -> int:
    """Pairs a block (tl.dot wants 16 at least): 16 for the plane types, and for NVFP4 up to 16 pairs
    an expert on average, else 32 (the H200 sweep of scripts/gpu_moe_grouped.py, docs/performance.md
    session 17: 16-pair blocks of 2 warps fastest for the K-quants and Q8_0 at 33 and 512 tokens)."""
    return 16 if w.raw is None or pairs <= 16 * n_experts else 32


def group_pairs(flat_ids: torch.Tensor, n_experts: int, block_m: int | None = None) -> GroupedPairs:
    """The sort and the block table of the (pairs,) expert ids, by device ops only (no host sync)."""
    p = flat_ids.numel()
    bm = block_m or 16
    order = torch.argsort(flat_ids, stable=True)
    # (torch.bincount reads its input's max on the host: a sync a prefill graph cannot capture)
    counts = torch.zeros(n_experts, dtype=torch.int32, device=flat_ids.device).index_add_(
        0, flat_ids, torch.ones_like(flat_ids, dtype=torch.int32))
    offsets = torch.nn.functional.pad(torch.cumsum(counts, 0, dtype=torch.int32), (1, 0))
    blocks = (counts + (bm - 1)) // bm
    bcum = torch.cumsum(blocks, 0, dtype=torch.int32)
    return GroupedPairs(order, offsets, bcum - blocks, bcum, bm, triton.cdiv(p, bm) + min(n_experts, p))


@triton.jit
def _bytes4(v0, v1, v2, v3):
    """Four (BN, W) tiles, the values of byte k of W words -> (BN, 4W) in byte order (4w + k)."""
    return tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), (v0.shape[0], 4 * v0.shape[1]))


@triton.jit
def _q4k_tiles(p0, p1, p2, rows, b, c, nb, w):
    """Q4_K super-block b, 64-element chunk c: the (BN, 32) tiles of elements 64c + j (low nibbles,
    sub-block 2c) and 64c + 32 + j (high, 2c + 1), fp32 as dequant.py computes them. The 32 code
    bytes a row are read as 8 words (w): a thread holds a few rows, not one byte of each."""
    q = tl.load(p2 + rows[:, None] * (nb * 32) + b * 32 + c * 8 + w[None, :])  # int32 words
    d = tl.load(p0 + rows * (nb * 2) + b * 2).to(tl.float32)
    dmin = tl.load(p0 + rows * (nb * 2) + b * 2 + 1).to(tl.float32)
    sb = p1 + rows * (nb * 12) + b * 12
    dl0, ml0 = _q4k_sub(sb, 2 * c, d, dmin)
    dl1, ml1 = _q4k_sub(sb, 2 * c + 1, d, dmin)
    lo = _bytes4(((q & 15).to(tl.float32) * dl0[:, None] - ml0[:, None]),
                 (((q >> 8) & 15).to(tl.float32) * dl0[:, None] - ml0[:, None]),
                 (((q >> 16) & 15).to(tl.float32) * dl0[:, None] - ml0[:, None]),
                 (((q >> 24) & 15).to(tl.float32) * dl0[:, None] - ml0[:, None]))
    hi = _bytes4((((q >> 4) & 15).to(tl.float32) * dl1[:, None] - ml1[:, None]),
                 (((q >> 12) & 15).to(tl.float32) * dl1[:, None] - ml1[:, None]),
                 (((q >> 20) & 15).to(tl.float32) * dl1[:, None] - ml1[:, None]),
                 (((q >> 28) & 15).to(tl.float32) * dl1[:, None] - ml1[:, None]))
    return lo, hi


@triton.jit
def _q4k_sub(sb, s, d, dmin):
    """Sub-block s's (d * scale, dmin * min): sub-blocks 0..3 keep their 6-bit scale and min in
    bytes s and s + 4; 4..7 their low 4 bits in byte s + 4, the high 2 in the top bits of bytes
    s - 4 (scale) and s (min)."""
    low = s < 4
    a = tl.load(sb + s).to(tl.int32)
    bb = tl.load(sb + s + 4).to(tl.int32)
    c = tl.load(sb + tl.where(low, s, s - 4)).to(tl.int32)
    sc = tl.where(low, a & 63, (bb & 15) | ((c >> 6) << 4))
    mn = tl.where(low, bb & 63, (bb >> 4) | ((a >> 6) << 4))
    return d * sc.to(tl.float32), dmin * mn.to(tl.float32)


@triton.jit
def _q6k_tile(ql, qh, sc_ptr, d, rows, b, nb, g, r, w, HIGH: tl.constexpr):
    """Q6_K super-block b, half g, part r (+ 2 if HIGH: the code bytes' high nibbles): the
    (BN, 32) tile of elements 128g + 32r + j, from the (BN, 8) words of the 32-byte ql and qh runs."""
    sc = tl.load(sc_ptr + rows[:, None] * (nb * 16) + b * 16 + g * 8 + 2 * r + 4 * HIGH + w[None, :] // 4).to(tl.float32)
    dl = d[:, None] * sc
    sh: tl.constexpr = 4 * HIGH
    v0 = ((((ql >> sh) & 15) | (((qh >> (2 * r + sh)) & 3) << 4)) - 32).to(tl.float32) * dl
    v1 = ((((ql >> (8 + sh)) & 15) | (((qh >> (8 + 2 * r + sh)) & 3) << 4)) - 32).to(tl.float32) * dl
    v2 = ((((ql >> (16 + sh)) & 15) | (((qh >> (16 + 2 * r + sh)) & 3) << 4)) - 32).to(tl.float32) * dl
    v3 = ((((ql >> (24 + sh)) & 15) | (((qh >> (24 + 2 * r + sh)) & 3) << 4)) - 32).to(tl.float32) * dl
    return _bytes4(v0, v1, v2, v3)


@triton.jit
def _nvfp4_tile(q, scale, SH: tl.constexpr):
    """The (BN, 32) tile of an NVFP4 block's nibbles at bit SH of each code byte (0: low, 4: high),
    in code-byte order, from its (BN, 8) code words and their sub-blocks' scales."""
    return _bytes4(_e2m1_doubled((q >> SH) & 15) * scale, _e2m1_doubled((q >> (8 + SH)) & 15) * scale,
                   _e2m1_doubled((q >> (16 + SH)) & 15) * scale, _e2m1_doubled((q >> (24 + SH)) & 15) * scale)


@triton.jit
def _bf16(v, EMU: tl.constexpr):
    """v rounded to bf16 (to nearest even). EMU (Triton's interpreter, whose casts truncate and
    whose bf16 dot is wrong): the same rounding by bit operations, kept in fp32."""
    if EMU:
        b = v.to(tl.int32, bitcast=True)
        return ((b + 0x7FFF + ((b >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
    else:
        return v.to(tl.bfloat16)


@triton.jit
def _mma(x, w, acc, EMU: tl.constexpr):
    """acc + x @ w^T: bf16 tensor cores, or (EMU) exact fp32 products of the same bf16 values."""
    if EMU:
        return tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    else:
        return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _xtile(x_ptr, xrow, col, m_ok, EMU: tl.constexpr):
    """(BM, 32) x rows `xrow` (element offsets), columns `col`, in bf16 as the dequantize-all path rounded
    them (x bf16 already, as the bank passes it: the load feeds the tensor cores as it is)."""
    v = tl.load(x_ptr + xrow[:, None] + col[None, :], mask=m_ok[:, None], other=0.0)
    return _bf16(v.to(tl.float32), EMU) if EMU else v.to(tl.bfloat16)


@triton.jit
def _moe_grouped_kernel(x_ptr, p0, p1, p2, p3, order_ptr, off_ptr, bstart_ptr, bcum_ptr, y_ptr, sc_ptr,
                        N, K, E, stride_xm, stride_ym, X_DIV, PART_ROWS, QT: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, E_POW2: tl.constexpr, GATHER: tl.constexpr, SCATTER: tl.constexpr,
                        PARTS: tl.constexpr, EMU: tl.constexpr):
    blk = tl.program_id(0)
    ev = tl.arange(0, E_POW2)
    ends = tl.load(bcum_ptr + ev, mask=ev < E, other=0x7FFFFFFF)
    e = tl.sum((ends <= blk).to(tl.int32))  # the expert whose blocks hold this one
    if e >= E:
        return  # past the last block of the routing
    start = tl.load(off_ptr + e) + (blk - tl.load(bstart_ptr + e)) * BLOCK_M
    end = tl.load(off_ptr + e + 1)
    s = start + tl.arange(0, BLOCK_M)
    m_ok = s < end
    s = tl.minimum(s, end - 1)
    if GATHER:
        xrow = (tl.load(order_ptr + s) // X_DIV).to(tl.int32) * stride_xm
    else:
        xrow = s * stride_xm
    local = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = local < N
    rows = tl.minimum(local, N - 1)  # rows of expert e's matrix: each plane's pointer moved to its first row
    first = e.to(tl.int64) * N  # (int64: 128 experts' planes may pass 2^31 bytes; offsets within one do not)
    j = tl.arange(0, 32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if QT == 0:  # Q4_K (dm, scales, qs), a 64-element chunk an iteration
        nb = K // 256
        p0 += first * (nb * 2)
        p1 += first * (nb * 12)
        p2 += first * (nb * 32)  # qs as int32 words
        w = tl.arange(0, 8)
        for u in range(nb * 4):
            b = u // 4
            c = u % 4
            lo, hi = _q4k_tiles(p0, p1, p2, rows, b, c, nb, w)
            acc = _mma(_xtile(x_ptr, xrow, b * 256 + c * 64 + j, m_ok, EMU), _bf16(lo, EMU), acc, EMU)
            acc = _mma(_xtile(x_ptr, xrow, b * 256 + c * 64 + 32 + j, m_ok, EMU), _bf16(hi, EMU), acc, EMU)
    elif QT == 1:  # Q6_K (ql, qh as words, sc, d): an iteration one 32-byte run of ql, parts r and r + 2
        nb = K // 256
        p0 += first * (nb * 32)
        p1 += first * (nb * 16)
        p2 += first * (nb * 16)
        p3 += first * nb
        w = tl.arange(0, 8)
        for u in range(nb * 4):
            b = u // 4
            g = (u // 2) % 2
            r = u % 2
            d = tl.load(p3 + rows * nb + b).to(tl.float32)
            ql = tl.load(p0 + rows[:, None] * (nb * 32) + b * 32 + g * 16 + r * 8 + w[None, :])
            qh = tl.load(p1 + rows[:, None] * (nb * 16) + b * 16 + g * 8 + w[None, :])
            col = b * 256 + g * 128 + r * 32 + j
            acc = _mma(_xtile(x_ptr, xrow, col, m_ok, EMU), _bf16(_q6k_tile(ql, qh, p2, d, rows, b, nb, g, r, w, 0), EMU), acc, EMU)
            acc = _mma(_xtile(x_ptr, xrow, col + 64, m_ok, EMU), _bf16(_q6k_tile(ql, qh, p2, d, rows, b, nb, g, r, w, 1), EMU), acc, EMU)
    elif QT == 2:  # Q8_0 (d, qs as words)
        nb = K // 32
        p0 += first * nb
        p1 += first * (K // 4)
        w = tl.arange(0, 8)
        for b in range(nb):
            q = tl.load(p1 + rows[:, None] * (K // 4) + b * 8 + w[None, :])
            dd = tl.load(p0 + rows * nb + b).to(tl.float32)[:, None]
            tile = _bytes4(((q << 24) >> 24).to(tl.float32) * dd, ((q << 16) >> 24).to(tl.float32) * dd,
                           ((q << 8) >> 24).to(tl.float32) * dd, (q >> 24).to(tl.float32) * dd)
            acc = _mma(_xtile(x_ptr, xrow, b * 32 + j, m_ok, EMU), _bf16(tile, EMU), acc, EMU)
    else:  # NVFP4 raw blocks as 9 words: the 4 UE4M3 scale bytes, then 8 code words (code byte t:
        # element 16 * (t // 8) + t % 8 at its low nibble, + 8 at its high one)
        nb = K // 64
        p0 += first * (nb * 9)
        w = tl.arange(0, 8)
        col = 16 * (j // 8) + j % 8
        for b in range(nb):
            base = p0 + rows * (nb * 9) + b * 9
            scale = _ue4m3_half((tl.load(base)[:, None] >> (8 * (w[None, :] // 2))) & 255)  # each code word's sub-block scale
            q = tl.load(base[:, None] + 1 + w[None, :])
            acc = _mma(_xtile(x_ptr, xrow, b * 64 + col, m_ok, EMU), _bf16(_nvfp4_tile(q, scale, 0), EMU), acc, EMU)
            acc = _mma(_xtile(x_ptr, xrow, b * 64 + 8 + col, m_ok, EMU), _bf16(_nvfp4_tile(q, scale, 4), EMU), acc, EMU)
    if PARTS > 0:  # the expert's scale of the part (gate / up) each output column lies in
        acc = acc * tl.load(sc_ptr + e * PARTS + rows // PART_ROWS)[None, :]
    if SCATTER:
        yrow = tl.load(order_ptr + s).to(tl.int64)
    else:
        yrow = s.to(tl.int64)
    tl.store(y_ptr + yrow[:, None] * stride_ym + local[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])


def moe_grouped_config(pairs_per_block: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages): 64 output rows a program, a warp per 8 pairs of the block
    (ptxas -v for sm_90a, every type: no spills; 128 rows spill; the H200 sweep's best, session 17)."""
    return 64, max(2, pairs_per_block // 8), 2


def moe_grouped(x: torch.Tensor, w: ExpertWeights, gp: GroupedPairs, x_div: int, out: torch.Tensor, gather: bool,
                scatter: bool, scale: torch.Tensor | None = None, config=None) -> torch.Tensor:
    """out[row] = x's bf16 row times the pair's expert's bf16 matrix (fp32 sums) for every pair:
    x rows order[s] // x_div (gather) or s; out rows order[s] (scatter) or s, s the sorted position.
    `scale` (n_experts, parts) fp32 as moe_mmvq's: each output column times its expert's part scale."""
    if not moe_grouped_ok(w):
        raise ValueError(f"moe_grouped: no grouped kernel for this expert weight ({w.kind}).")
    if x.shape[1] != w.k or x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError(f"moe_grouped: x {tuple(x.shape)} (K={w.k}) and out must be row-major.")
    parts = 0 if scale is None else scale.shape[1]
    sc = scale if scale is not None else out
    block_n, warps, stages = tuple(config) if config is not None else moe_grouped_config(gp.block_m)
    grid = (gp.max_blocks, triton.cdiv(w.rows, block_n))
    if w.raw is not None:
        qt, planes = 3, [w.raw.view(torch.int32)] * 4  # rows of 36-byte blocks: whole words
    else:
        qt = _QT[w.planes.qtype]
        names = {0: ("dm", "scales", "qs"), 1: ("ql", "qh", "sc", "d"), 2: ("d", "qs")}[qt]
        planes = [w.planes.planes[n] for n in names]
        words = {0: (2,), 1: (0, 1), 2: (1,)}[qt]  # the code planes, read as int32 words
        planes = [t.view(torch.int32) if i in words else t for i, t in enumerate(planes)]
        planes += [planes[0]] * (4 - len(planes))
    _moe_grouped_kernel[grid](x, *planes, gp.order, gp.offsets, gp.bstart, gp.bcum, out, sc, w.rows, w.k, w.n_experts,
                              x.stride(0), out.stride(0), x_div, w.rows // max(parts, 1), QT=qt, BLOCK_M=gp.block_m,
                              BLOCK_N=block_n, E_POW2=triton.next_power_of_2(w.n_experts), GATHER=gather,
                              SCATTER=scatter, PARTS=parts, EMU=INTERPRETED, num_warps=warps, num_stages=stages)
    return out


def moe_grouped_reference(x: torch.Tensor, w: ExpertWeights, ids: torch.Tensor, x_div: int,
                          scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per pair in pair order: x row p // x_div in bf16 times expert ids[p]'s matrix dequantized to
    bf16, in float64 -> float32 (P, rows); times `scale` as moe_grouped applies it."""
    ids = ids.reshape(-1)
    xs = x.bfloat16().double().repeat_interleave(x_div, dim=0) if x_div > 1 else x.bfloat16().double()
    y = torch.bmm(expert_matrices(w, ids).bfloat16().double(), xs.unsqueeze(-1)).squeeze(-1)
    if scale is not None:
        parts = scale.shape[1]
        y = (y.view(y.shape[0], parts, -1) * scale[ids.long()].double().view(-1, parts, 1)).view_as(y)
    return y.float()
