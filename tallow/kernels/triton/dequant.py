"""Byte planes -> dense fp16/bf16 weight (N, K), for the dequant-to-scratch prefill path.

The prefill strategy: write the weight once in the activation dtype into a scratch buffer
(reused by every layer, sized for the largest weight) and let cuBLAS run the product. It costs
2 bytes written + 2 read per weight per call on top of the quantized read, which a long enough
prompt amortizes; a fused dequant-in-the-tensor-core-loop kernel measured slower and was removed
(docs/performance.md has the numbers); scripts/gpu_bench_kernels.py (section prefill) times it.

Each program dequantizes a (BLOCK_N rows x one step) tile exactly as the reference does
(fp32 value, rounded once to the output dtype) and stores it in element order. Q4_K, Q6_K,
Q8_0, Q4_0, Q4_1 and Q5_0 have Triton kernels; other types fall back to the torch plane
dequantization.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .planes import PlaneWeight, dequantize_planes

__all__ = ["dequantize_to", "scratch_matmul"]


@triton.jit
def _q4_k_dequant_kernel(qs_ptr, sc_ptr, dm_ptr, w_ptr, N, K, BLOCK_N: tl.constexpr):
    # one program: BLOCK_N rows x one 256-element block
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    b = tl.program_id(1)
    nb = K // 256
    c = tl.arange(0, 4)
    j = tl.arange(0, 32)
    q = tl.load(qs_ptr + rows[:, None, None] * (nb * 128) + b * 128 + c[None, :, None] * 32 + j[None, None, :]).to(tl.int32)
    sbase = sc_ptr + rows[:, None] * (nb * 12) + b * 12
    d = tl.load(dm_ptr + rows * (nb * 2) + b * 2).to(tl.float32)[:, None]
    dmin = tl.load(dm_ptr + rows * (nb * 2) + b * 2 + 1).to(tl.float32)[:, None]
    s_lo = (c * 2)[None, :]
    s_hi = s_lo + 1
    low = s_lo < 4
    a_lo = tl.load(sbase + s_lo).to(tl.int32)
    b_lo = tl.load(sbase + s_lo + 4).to(tl.int32)
    c_lo = tl.load(sbase + tl.where(low, s_lo, s_lo - 4)).to(tl.int32)
    a_hi = tl.load(sbase + s_hi).to(tl.int32)
    b_hi = tl.load(sbase + s_hi + 4).to(tl.int32)
    c_hi = tl.load(sbase + tl.where(low, s_hi, s_hi - 4)).to(tl.int32)
    dl_lo = d * tl.where(low, a_lo & 63, (b_lo & 15) | ((c_lo >> 6) << 4)).to(tl.float32)
    ml_lo = dmin * tl.where(low, b_lo & 63, (b_lo >> 4) | ((a_lo >> 6) << 4)).to(tl.float32)
    dl_hi = d * tl.where(low, a_hi & 63, (b_hi & 15) | ((c_hi >> 6) << 4)).to(tl.float32)
    ml_hi = dmin * tl.where(low, b_hi & 63, (b_hi >> 4) | ((a_hi >> 6) << 4)).to(tl.float32)
    w_lo = (q & 15).to(tl.float32) * dl_lo[:, :, None] - ml_lo[:, :, None]
    w_hi = (q >> 4).to(tl.float32) * dl_hi[:, :, None] - ml_hi[:, :, None]
    out = w_ptr + rows[:, None, None] * K + b * 256 + c[None, :, None] * 64 + j[None, None, :]
    mask = row_ok[:, None, None]
    tl.store(out, w_lo.to(w_ptr.dtype.element_ty), mask=mask)
    tl.store(out + 32, w_hi.to(w_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _q6_k_dequant_kernel(ql_ptr, qh_ptr, sc_ptr, d_ptr, w_ptr, N, K, BLOCK_N: tl.constexpr):
    # one program: BLOCK_N rows x one 256-element block, as 2 halves x 2 runs of 16 x 4 parts r
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    b = tl.program_id(1)
    nb = K // 256
    h = tl.arange(0, 4)  # (half, hh)
    jj = tl.arange(0, 16)
    g = b * 2 + h // 2
    hh = h % 2
    boff = (g * 64 + hh * 16)[None, :, None] + jj[None, None, :]
    lrow = ql_ptr + rows[:, None, None] * (nb * 128)
    qa = tl.load(lrow + boff).to(tl.int32)
    qb = tl.load(lrow + boff + 32).to(tl.int32)
    qhv = tl.load(qh_ptr + rows[:, None, None] * (nb * 64) + (g * 32 + hh * 16)[None, :, None] + jj[None, None, :]).to(tl.int32)
    d = tl.load(d_ptr + rows * nb + b).to(tl.float32)[:, None]
    srow = sc_ptr + rows[:, None] * (nb * 16) + (g * 8 + hh)[None, :]
    out = w_ptr + rows[:, None, None] * K + (g * 128 + hh * 16)[None, :, None] + jj[None, None, :]
    mask = row_ok[:, None, None]
    for r in tl.static_range(4):
        src = qa if r % 2 == 0 else qb
        lo4 = (src & 15) if r < 2 else (src >> 4)
        q = (lo4 | (((qhv >> (2 * r)) & 3) << 4)) - 32
        dl = d * tl.load(srow + 2 * r).to(tl.float32)
        tl.store(out + r * 32, (dl[:, :, None] * q.to(tl.float32)).to(w_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _q8_0_dequant_kernel(qs_ptr, d_ptr, w_ptr, N, K, BLOCK_N: tl.constexpr, B: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    nb = K // 32
    blk = tl.program_id(1) * B + tl.arange(0, B)
    ok = blk < nb
    blk = tl.where(ok, blk, 0)
    j = tl.arange(0, 32)
    off = rows[:, None, None] * K + blk[None, :, None] * 32 + j[None, None, :]
    q = tl.load(qs_ptr + off)
    d = tl.load(d_ptr + rows[:, None] * nb + blk[None, :]).to(tl.float32)
    tl.store(w_ptr + off, (q.to(tl.float32) * d[:, :, None]).to(w_ptr.dtype.element_ty),
             mask=row_ok[:, None, None] & ok[None, :, None])


@triton.jit
def _q4_x_dequant_kernel(qs_ptr, d_ptr, aux_ptr, w_ptr, N, K, VARIANT: tl.constexpr, BLOCK_N: tl.constexpr,
                         B: tl.constexpr):
    """Q4_0 (VARIANT 0: d*(q-8)), Q4_1 (1: d*q + m, aux = m) and Q5_0 (2: d*((q | hi<<4) - 16),
    aux = qh bits). Byte j of a block holds element j (low nibble) and j+16 (high nibble)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    nb = K // 32
    blk = tl.program_id(1) * B + tl.arange(0, B)
    ok = blk < nb
    blk = tl.where(ok, blk, 0)
    j = tl.arange(0, 16)
    q = tl.load(qs_ptr + rows[:, None, None] * (nb * 16) + blk[None, :, None] * 16 + j[None, None, :]).to(tl.int32)
    lo = q & 15
    hi = q >> 4
    d = tl.load(d_ptr + rows[:, None] * nb + blk[None, :]).to(tl.float32)[:, :, None]
    if VARIANT == 0:
        v_lo = d * (lo - 8).to(tl.float32)
        v_hi = d * (hi - 8).to(tl.float32)
    elif VARIANT == 1:
        m = tl.load(aux_ptr + rows[:, None] * nb + blk[None, :]).to(tl.float32)[:, :, None]
        v_lo = d * lo.to(tl.float32) + m
        v_hi = d * hi.to(tl.float32) + m
    else:
        qh = tl.load(aux_ptr + rows[:, None] * nb + blk[None, :])[:, :, None]
        lo = lo | (((qh >> j[None, None, :]) & 1) << 4)
        hi = hi | (((qh >> (j[None, None, :] + 16)) & 1) << 4)
        v_lo = d * (lo - 16).to(tl.float32)
        v_hi = d * (hi - 16).to(tl.float32)
    out = w_ptr + rows[:, None, None] * K + blk[None, :, None] * 32 + j[None, None, :]
    mask = row_ok[:, None, None] & ok[None, :, None]
    tl.store(out, v_lo.to(w_ptr.dtype.element_ty), mask=mask)
    tl.store(out + 16, v_hi.to(w_ptr.dtype.element_ty), mask=mask)


def dequantize_to(w: PlaneWeight, dtype: torch.dtype = torch.float16, out: torch.Tensor | None = None,
                  block_n: int = 16) -> torch.Tensor:
    """Dense (N, K) weight in `dtype` (into `out`, e.g. a shared scratch buffer, if given)."""
    if out is None:
        out = torch.empty((w.n, w.k), dtype=dtype, device=w.device)
    elif out.shape != (w.n, w.k) or not out.is_contiguous():
        raise ValueError(f"dequantize_to: out must be contiguous ({w.n}, {w.k}), got {tuple(out.shape)}.")
    p = w.planes
    if w.qtype == "Q4_K":
        _q4_k_dequant_kernel[(triton.cdiv(w.n, block_n), w.k // 256)](p["qs"], p["scales"], p["dm"], out, w.n, w.k,
                                                                     BLOCK_N=block_n, num_warps=4)
    elif w.qtype == "Q6_K":
        _q6_k_dequant_kernel[(triton.cdiv(w.n, block_n), w.k // 256)](p["ql"], p["qh"], p["sc"], p["d"], out, w.n,
                                                                     w.k, BLOCK_N=block_n, num_warps=4)
    elif w.qtype == "Q8_0":
        blocks = 8
        _q8_0_dequant_kernel[(triton.cdiv(w.n, block_n), triton.cdiv(w.k // 32, blocks))](
            p["qs"], p["d"], out, w.n, w.k, BLOCK_N=block_n, B=blocks, num_warps=4)
    elif w.qtype in ("Q4_0", "Q4_1", "Q5_0"):
        variant = {"Q4_0": 0, "Q4_1": 1, "Q5_0": 2}[w.qtype]
        aux = p["d"] if variant == 0 else (p["m"] if variant == 1 else p["qh"])
        blocks = 8
        _q4_x_dequant_kernel[(triton.cdiv(w.n, block_n), triton.cdiv(w.k // 32, blocks))](
            p["qs"], p["d"], aux, out, w.n, w.k, VARIANT=variant, BLOCK_N=block_n, B=blocks, num_warps=4)
    else:
        out.copy_(dequantize_planes(w))
    return out


def scratch_matmul(x: torch.Tensor, w: PlaneWeight, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T via a dense copy of W in x's dtype and torch.matmul (cuBLAS); float32 (M, N).
    `scratch`: a flat buffer of at least N*K elements of x's dtype, reused across layers."""
    buf = None if scratch is None else scratch[: w.n * w.k].view(w.n, w.k)
    dense = dequantize_to(w, x.dtype, out=buf)
    return torch.matmul(x, dense.T).float()
