"""Prefill matrix products with the dequantization inside the tensor-core loop:
y (M, N) = x (M, K) @ W^T for M from ~16 to thousands, W as byte planes (planes.py).

Prefill is bound by matrix throughput, not bytes, so the weight tile is dequantized once per
(BLOCK_M x BLOCK_N) output tile in registers, rounded to the activation dtype (fp16 or bf16)
and fed to `tl.dot` (wgmma/mma on the tensor cores) with fp32 accumulation. The alternative,
dequantize the whole weight to a scratch buffer (dequant.py) and call cuBLAS, costs a write and
a read of 2 bytes per weight per call; scripts/gpu_bench_kernels.py measures both.

Tile order. As in quant_gemv.py, the codes of a step are loaded as (BLOCK_N, chunks, run)
bytes in storage order and the matching activations are gathered at the element offsets of
that order (a sum over K does not care about order); the 3-D weight tile is reshaped to 2-D
for the dot. Per type and step:
  Q4_K: CH 32-byte chunks -> two dots (low nibbles, high nibbles) of K = CH*32
  Q6_K: HG half-blocks of 128 elements -> four dots (r = 0..3) of K = HG*32
  Q8_0: B blocks of 32 -> one dot of K = B*32 (storage order is element order)

Numerics: the weight is exactly the reference's fp32 value rounded once to fp16/bf16 (about
2^-11 / 2^-8 relative), the activations likewise; fp32 accumulation. Relative error vs the
fp32 reference: ~5e-4 (fp16), ~4e-3 (bf16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .planes import PlaneWeight

__all__ = ["quant_gemm", "gemm_config", "SUPPORTED"]

SUPPORTED = ("Q4_K", "Q6_K", "Q8_0")


@triton.jit
def _tile_rows_cols(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # grouped ordering: GROUP_M row tiles share a column tile while it is hot in L2
    pid = tl.program_id(0)
    n_m = tl.cdiv(M, BLOCK_M)
    n_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * n_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(n_m - first_m, GROUP_M)
    pm = first_m + (pid % per_group) % size_m
    pn = (pid % per_group) // size_m
    return pm, pn


@triton.jit
def _q4_k_gemm_kernel(x_ptr, qs_ptr, sc_ptr, dm_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CH: tl.constexpr, GROUP_M: tl.constexpr):
    pm, pn = _tile_rows_cols(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    xm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    xm_ok = xm < M
    xm = tl.minimum(xm, M - 1).to(tl.int64)
    rows = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    nb = K // 256
    g = tl.arange(0, CH)
    j = tl.arange(0, 32)
    cc = tl.arange(0, CH * 32)  # column of the 2-D tile: chunk cc // 32, byte cc % 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c0 in range(0, nb * 4, CH):  # CH divides 4, so a step never straddles a row end
        chunk = c0 + g
        blk = chunk // 4
        q = tl.load(qs_ptr + rows[:, None, None] * (nb * 128) + chunk[None, :, None] * 32 + j[None, None, :]).to(tl.int32)
        sbase = sc_ptr + rows[:, None] * (nb * 12) + blk[None, :] * 12
        s_lo = (chunk % 4) * 2
        s_hi = s_lo + 1
        d = tl.load(dm_ptr + rows[:, None] * (nb * 2) + blk[None, :] * 2).to(tl.float32)
        dmin = tl.load(dm_ptr + rows[:, None] * (nb * 2) + blk[None, :] * 2 + 1).to(tl.float32)
        low = s_lo[None, :] < 4
        a_lo = tl.load(sbase + s_lo[None, :]).to(tl.int32)
        b_lo = tl.load(sbase + s_lo[None, :] + 4).to(tl.int32)
        c_lo = tl.load(sbase + tl.where(low, s_lo[None, :], s_lo[None, :] - 4)).to(tl.int32)
        a_hi = tl.load(sbase + s_hi[None, :]).to(tl.int32)
        b_hi = tl.load(sbase + s_hi[None, :] + 4).to(tl.int32)
        c_hi = tl.load(sbase + tl.where(low, s_hi[None, :], s_hi[None, :] - 4)).to(tl.int32)
        dl_lo = d * tl.where(low, a_lo & 63, (b_lo & 15) | ((c_lo >> 6) << 4)).to(tl.float32)
        ml_lo = dmin * tl.where(low, b_lo & 63, (b_lo >> 4) | ((a_lo >> 6) << 4)).to(tl.float32)
        dl_hi = d * tl.where(low, a_hi & 63, (b_hi & 15) | ((c_hi >> 6) << 4)).to(tl.float32)
        ml_hi = dmin * tl.where(low, b_hi & 63, (b_hi >> 4) | ((a_hi >> 6) << 4)).to(tl.float32)
        w_lo = (q & 15).to(tl.float32) * dl_lo[:, :, None] - ml_lo[:, :, None]
        w_hi = (q >> 4).to(tl.float32) * dl_hi[:, :, None] - ml_hi[:, :, None]
        w_lo = tl.reshape(w_lo, (BLOCK_N, CH * 32)).to(x_ptr.dtype.element_ty)
        w_hi = tl.reshape(w_hi, (BLOCK_N, CH * 32)).to(x_ptr.dtype.element_ty)
        xoff = (c0 + cc // 32) * 64 + cc % 32  # element of each low-nibble column
        x_lo = tl.load(x_ptr + xm[:, None] * stride_xm + xoff[None, :])
        x_hi = tl.load(x_ptr + xm[:, None] * stride_xm + xoff[None, :] + 32)
        acc = tl.dot(x_lo, tl.trans(w_lo), acc)
        acc = tl.dot(x_hi, tl.trans(w_hi), acc)
    tl.store(y_ptr + xm[:, None] * stride_ym + rows[None, :], acc, mask=xm_ok[:, None] & row_ok[None, :])


@triton.jit
def _q6_k_gemm_kernel(x_ptr, ql_ptr, qh_ptr, sc_ptr, d_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HG: tl.constexpr, GROUP_M: tl.constexpr):
    pm, pn = _tile_rows_cols(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    xm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    xm_ok = xm < M
    xm = tl.minimum(xm, M - 1).to(tl.int64)
    rows = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    nb = K // 256
    H: tl.constexpr = HG * 2
    hidx = tl.arange(0, H)
    jj = tl.arange(0, 16)
    cc = tl.arange(0, HG * 32)  # column: half-block cc // 32, t = cc % 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    dt = x_ptr.dtype.element_ty
    for g0 in range(0, nb * 2, HG):  # HG divides 2
        h = g0 * 2 + hidx
        g = h // 2
        hh = h % 2
        boff = (g * 64 + hh * 16)[None, :, None] + jj[None, None, :]
        lrow = ql_ptr + rows[:, None, None] * (nb * 128)
        qa = tl.load(lrow + boff).to(tl.int32)
        qb = tl.load(lrow + boff + 32).to(tl.int32)
        qhv = tl.load(qh_ptr + rows[:, None, None] * (nb * 64) + (g * 32 + hh * 16)[None, :, None]
                      + jj[None, None, :]).to(tl.int32)
        d = tl.load(d_ptr + rows[:, None] * nb + (g // 2)[None, :]).to(tl.float32)
        srow = sc_ptr + rows[:, None] * (nb * 16) + (g * 8 + hh)[None, :]
        xrow = x_ptr + xm[:, None] * stride_xm + ((g0 + cc // 32) * 128 + cc % 32)[None, :]
        for r in tl.static_range(4):
            src = qa if r % 2 == 0 else qb
            lo4 = (src & 15) if r < 2 else (src >> 4)
            q = (lo4 | (((qhv >> (2 * r)) & 3) << 4)) - 32
            dl = d * tl.load(srow + 2 * r).to(tl.float32)
            w = tl.reshape(dl[:, :, None] * q.to(tl.float32), (BLOCK_N, HG * 32)).to(dt)
            xv = tl.load(xrow + r * 32)
            acc = tl.dot(xv, tl.trans(w), acc)
    tl.store(y_ptr + xm[:, None] * stride_ym + rows[None, :], acc, mask=xm_ok[:, None] & row_ok[None, :])


@triton.jit
def _q8_0_gemm_kernel(x_ptr, qs_ptr, d_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, B: tl.constexpr, GROUP_M: tl.constexpr):
    pm, pn = _tile_rows_cols(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    xm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    xm_ok = xm < M
    xm = tl.minimum(xm, M - 1).to(tl.int64)
    rows = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    nb = K // 32
    bi = tl.arange(0, B)
    j = tl.arange(0, 32)
    kk = tl.arange(0, B * 32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for b0 in range(0, nb, B):
        blk = b0 + bi
        ok = blk < nb
        blk = tl.where(ok, blk, 0)
        q = tl.load(qs_ptr + rows[:, None, None] * K + blk[None, :, None] * 32 + j[None, None, :],
                    mask=ok[None, :, None], other=0)
        d = tl.load(d_ptr + rows[:, None] * nb + blk[None, :]).to(tl.float32)
        w = tl.reshape(q.to(tl.float32) * d[:, :, None], (BLOCK_N, B * 32)).to(x_ptr.dtype.element_ty)
        k_ok = b0 * 32 + kk < K
        xv = tl.load(x_ptr + xm[:, None] * stride_xm + b0 * 32 + kk[None, :], mask=k_ok[None, :], other=0.0)
        acc = tl.dot(xv, tl.trans(w), acc)
    tl.store(y_ptr + xm[:, None] * stride_ym + rows[None, :], acc, mask=xm_ok[:, None] & row_ok[None, :])


def gemm_config(qtype: str, m: int, n: int, k: int) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, step, num_warps, num_stages); step = CH chunks (Q4_K), HG half-blocks
    (Q6_K) or B blocks (Q8_0). The best of the H200 sweep (docs/performance.md, 2026-11-30);
    note that on that sweep dequant-to-scratch + cuBLAS was 3-4x faster from M = 512 up."""
    if qtype == "Q4_K":
        return (64, 128, 4, 4, 3) if m <= 64 else (128, 128, 2, 8, 3)
    if qtype == "Q6_K":  # HG=2 with 3 stages and 128-wide tiles needs > 228 KB of shared memory
        return (64, 64, 1, 4, 3) if m <= 64 else (128, 64, 1, 4, 3)
    return (64, 128, 4, 4, 3) if m <= 64 else (128, 128, 4, 8, 3)


def quant_gemm(x: torch.Tensor, w: PlaneWeight, out: torch.Tensor | None = None,
               config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """y = x @ W^T with the weight dequantized in the tensor-core loop.

    x fp16 or bf16 (M, K) (the weight is rounded to x's dtype); returns float32 (M, N)."""
    if w.qtype not in SUPPORTED:
        raise ValueError(f"No fused Triton GEMM for {w.qtype}; use dequant.py + torch.matmul.")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"quant_gemm wants fp16 or bf16 activations, got {x.dtype}.")
    if x.ndim != 2 or x.shape[1] != w.k:
        raise ValueError(f"quant_gemm: x has shape {tuple(x.shape)}, the weight wants K={w.k}.")
    if x.stride(1) != 1:
        x = x.contiguous()
    m = x.shape[0]
    if out is None:
        out = torch.empty((m, w.n), dtype=torch.float32, device=x.device)
    bm, bn, step, warps, stages = config or gemm_config(w.qtype, m, w.n, w.k)
    grid = (triton.cdiv(m, bm) * triton.cdiv(w.n, bn),)
    p = w.planes
    args = (m, w.n, w.k, x.stride(0), out.stride(0))
    common = dict(BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, num_warps=warps, num_stages=stages)
    if w.qtype == "Q4_K":
        _q4_k_gemm_kernel[grid](x, p["qs"], p["scales"], p["dm"], out, *args, CH=step, **common)
    elif w.qtype == "Q6_K":
        _q6_k_gemm_kernel[grid](x, p["ql"], p["qh"], p["sc"], p["d"], out, *args, HG=step, **common)
    else:
        _q8_0_gemm_kernel[grid](x, p["qs"], p["d"], out, *args, B=step, **common)
    return out
