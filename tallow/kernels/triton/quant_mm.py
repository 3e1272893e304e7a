"""Short-prompt products over quantized weights: y (M, N) = x (M, K) @ W^T for 8 < M <= 64.

A short prefill (a 33-token prompt) sits between the two other paths: the decode GEMV reads the
weight once but computes at most 8 rows per read, and dequantize-to-scratch + cuBLAS pays 2
bytes written and 2 read per weight element on top of the quantized read — for a 4-bit weight
that is 8x the bytes the product needs. Here each program owns BLOCK_N output rows and all M
activation rows, walks K once, rebuilds each (BLOCK_N, 32) piece of the weight in registers and
feeds it to the tensor cores (`tl.dot`, bf16 in, fp32 accumulate), so every weight byte is read
once and nothing dense is written.

No reshape of the tile is needed: each 32-element run of a block's codes maps to 32 consecutive
elements of K (Q4_K: chunk c's low nibbles are elements 64c..64c+31 of the super-block, its high
nibbles 64c+32..64c+63; Q6_K: run r of half g is elements 128g+32r..+31), and the sub-block
scale is one value per row for a run (Q6_K: two, one per 16 elements). So the matching x columns
are a contiguous (M, 32) load.

Numerics: the weight is the reference's fp32 value rounded once to bf16 (the scratch path's
`dequantize_to(..., bfloat16)`); activations are rounded to bf16 as the scratch path does;
products and sums in fp32. Results equal the scratch path's up to summation order and its
final bf16 rounding of y (here y stays fp32).

Switch: TALLOW_QUANT_MM=0 sends these prompts through dequantize + cuBLAS (kernels/gpu/linear.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .planes import PlaneWeight, dequantize_planes

__all__ = ["quant_mm", "quant_mm_reference", "SUPPORTED", "MAX_ROWS"]

SUPPORTED = ("Q4_K", "Q6_K")
MAX_ROWS = 64


@triton.jit
def _dot(xs, w, acc, EXACT: tl.constexpr):
    # EXACT: fp32 operands, no tensor-core rounding -- the layout check of the tests (Triton's
    # interpreter computes bf16 dots wrongly and truncates bf16 casts, so it cannot check the
    # production rounding; the GPU test does).
    if EXACT:
        return tl.dot(xs, tl.trans(w), acc, input_precision="ieee")
    return tl.dot(xs.to(tl.bfloat16), tl.trans(w.to(tl.bfloat16)), acc)


@triton.jit
def _q4_k_mm_kernel(x_ptr, qs_ptr, sc_ptr, dm_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    j = tl.arange(0, 32)
    nb = K // 256
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(0, nb):
        d = tl.load(dm_ptr + rows * (nb * 2) + b * 2).to(tl.float32)
        dmin = tl.load(dm_ptr + rows * (nb * 2) + b * 2 + 1).to(tl.float32)
        sbase = sc_ptr + rows * (nb * 12) + b * 12
        for c in tl.static_range(4):
            q = tl.load(qs_ptr + rows[:, None] * (nb * 128) + b * 128 + c * 32 + j[None, :]).to(tl.int32)
            for half in tl.static_range(2):
                s = 2 * c + half  # sub-block of 32 elements
                if s < 4:
                    sc = tl.load(sbase + s).to(tl.int32) & 63
                    mn = tl.load(sbase + s + 4).to(tl.int32) & 63
                else:
                    hi_a = tl.load(sbase + s - 4).to(tl.int32)
                    hi_b = tl.load(sbase + s).to(tl.int32)
                    lo = tl.load(sbase + s + 4).to(tl.int32)
                    sc = (lo & 15) | ((hi_a >> 6) << 4)
                    mn = (lo >> 4) | ((hi_b >> 6) << 4)
                nib = (q & 15) if half == 0 else (q >> 4)
                w = nib.to(tl.float32) * (d * sc.to(tl.float32))[:, None] - (dmin * mn.to(tl.float32))[:, None]
                xs = tl.load(x_ptr + m[:, None] * stride_xm + b * 256 + c * 64 + half * 32 + j[None, :],
                             mask=m_ok[:, None], other=0.0)
                acc = _dot(xs, w, acc, EXACT)
    out = y_ptr + m[:, None] * stride_ym + rows[None, :]
    tl.store(out, acc, mask=m_ok[:, None] & row_ok[None, :])


@triton.jit
def _q6_k_mm_kernel(x_ptr, ql_ptr, qh_ptr, sc_ptr, d_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    j = tl.arange(0, 32)
    nb = K // 256
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b in range(0, nb):
        d = tl.load(d_ptr + rows * nb + b).to(tl.float32)
        for g in tl.static_range(2):  # halves of 128 elements
            lrow = ql_ptr + rows[:, None] * (nb * 128) + b * 128 + g * 64 + j[None, :]
            qa = tl.load(lrow).to(tl.int32)
            qb = tl.load(lrow + 32).to(tl.int32)
            qh = tl.load(qh_ptr + rows[:, None] * (nb * 64) + b * 64 + g * 32 + j[None, :]).to(tl.int32)
            for r in tl.static_range(4):  # runs of 32 elements: 128g + 32r ..
                src = qa if r % 2 == 0 else qb
                low4 = (src & 15) if r < 2 else (src >> 4)
                q = (low4 | (((qh >> (2 * r)) & 3) << 4)) - 32
                # scale of elements 16i..16i+15 of the half: sc[8g + i]; run r covers i = 2r, 2r+1
                sc = tl.load(sc_ptr + rows[:, None] * (nb * 16) + b * 16 + g * 8 + 2 * r + j[None, :] // 16).to(tl.float32)
                w = (d[:, None] * sc) * q.to(tl.float32)
                xs = tl.load(x_ptr + m[:, None] * stride_xm + b * 256 + g * 128 + r * 32 + j[None, :],
                             mask=m_ok[:, None], other=0.0)
                acc = _dot(xs, w, acc, EXACT)
    out = y_ptr + m[:, None] * stride_ym + rows[None, :]
    tl.store(out, acc, mask=m_ok[:, None] & row_ok[None, :])


def _config(m: int, n: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): all rows in one tile (tl.dot needs at least 16)."""
    block_m = max(16, triton.next_power_of_2(m))
    return block_m, 64, 4, 3


def quant_mm(x: torch.Tensor, w: PlaneWeight, out: torch.Tensor | None = None,
             config: tuple[int, int, int, int] | None = None, exact: bool = False) -> torch.Tensor:
    """y = x @ W^T, x (M, K) float32/bf16 with M <= MAX_ROWS, W Q4_K or Q6_K planes -> float32 (M, N)
    (into `out` if given: (M, N) float32, unit last stride). exact: fp32 products (tests)."""
    m, k = x.shape
    if w.qtype not in SUPPORTED or m > MAX_ROWS or k != w.k:
        raise ValueError(f"quant_mm: {w.qtype} ({w.n}x{w.k}) with x {tuple(x.shape)} is not supported.")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty((m, w.n), dtype=torch.float32, device=x.device)
    block_m, block_n, warps, stages = config or _config(m, w.n)
    grid = (triton.cdiv(w.n, block_n),)
    p = w.planes
    if w.qtype == "Q4_K":
        _q4_k_mm_kernel[grid](x, p["qs"], p["scales"], p["dm"], out, m, w.n, w.k, x.stride(0), out.stride(0),
                              BLOCK_M=block_m, BLOCK_N=block_n, EXACT=exact, num_warps=warps,
                              num_stages=stages)
    else:
        _q6_k_mm_kernel[grid](x, p["ql"], p["qh"], p["sc"], p["d"], out, m, w.n, w.k, x.stride(0), out.stride(0),
                              BLOCK_M=block_m, BLOCK_N=block_n, EXACT=exact, num_warps=warps,
                              num_stages=stages)
    return out


def quant_mm_reference(x: torch.Tensor, w: PlaneWeight) -> torch.Tensor:
    """The scratch path's arithmetic without its final rounding: bf16 weight and activations, fp32 sums."""
    dense = dequantize_planes(w).to(torch.bfloat16).float()
    return x.to(torch.bfloat16).float() @ dense.T
