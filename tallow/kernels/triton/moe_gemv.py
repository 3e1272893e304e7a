"""Routed-expert decode GEMV: one launch per projection over every (token, chosen expert) pair.

A GGUF stores each projection of a layer's experts as one 3-D tensor (ggml [K, rows, experts]):
expert e's matrix is rows e*R .. e*R + R - 1 of the stacked (experts * R, K) weight. The GPU
keeps it so (byte planes for the k-quants and Q8_0, planes.py; the raw blocks for FP4), and the
kernel reads the expert id of its pair from a device tensor: program (tile, p) computes rows
tile*BLOCK_N.. of expert ids[p]'s matrix against x row p // X_DIV (X_DIV = k for gate/up, whose
input is the token's row; 1 for down, whose input is the pair's own GLU output). Nothing is
decided on the host, so a decode step with routed experts is captured in the CUDA graph, and only
the chosen experts' bytes are read.

The weight tiles are quant_gemv's (same dequantization, same fp32 products) and fp4_gemv's row
dot; per pair one accumulator, so a pair's output does not depend on the other pairs of the
launch (decode and a verification pass agree bit for bit).

`fp4_dequantize_to` writes a stacked FP4 weight as bf16 for the expert-grouped prefill
(kernels/gpu/moe.py), as dequant.py does for the plane types.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .fp4_gemv import NVFP4, _LAYOUT as _FP4_LAYOUT, _e2m1_doubled, _fp4_row_dot, _ue4m3_half
from .planes import PlaneWeight, dequantize_planes
from .quant_gemv import _LAYOUT, _PLANES, _q4_k_tiles, _q4_x_tiles, _q6_k_tiles, _q8_0_tiles, gemv_config

__all__ = ["ExpertWeights", "moe_gemv", "moe_gemv_reference", "fp4_dequantize_to", "fp4_dequantize_reference"]


@dataclass
class ExpertWeights:
    """One projection of all experts, stacked: (n_experts * rows, k) as byte planes (`planes`,
    a quant_gemv type), as raw FP4 blocks (`raw` uint8 (n_experts * rows, row_bytes), `qtype` 39
    or 40), or dense (`dense` (n_experts, rows, k) fp32/bf16) for the other types."""

    n_experts: int
    rows: int
    k: int
    planes: PlaneWeight | None = None
    raw: torch.Tensor | None = None
    qtype: int = 0
    dense: torch.Tensor | None = None

    @property
    def kind(self) -> str:
        if self.planes is not None:
            return f"triton_{self.planes.qtype.lower()}"
        return "triton_nvfp4" if self.raw is not None and self.qtype == NVFP4 else (
            "triton_mxfp4" if self.raw is not None else "dense")

    @property
    def nbytes(self) -> int:
        if self.planes is not None:
            return self.planes.nbytes
        t = self.raw if self.raw is not None else self.dense
        return t.numel() * t.element_size()

    @property
    def has_kernel(self) -> bool:
        return self.planes is not None or self.raw is not None


@triton.jit
def _moe_gemv_kernel(x_ptr, ids_ptr, p0, p1, p2, p3, y_ptr, N, K, stride_xm, stride_ym, X_DIV,
                     QT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr,
                     BLOCK_K: tl.constexpr, G: tl.constexpr, J: tl.constexpr, T: tl.constexpr, S: tl.constexpr):
    # QT as quant_gemv: 0 Q4_K, 1 Q6_K, 2 Q8_0, 3/4/5 Q4_0/Q4_1/Q5_0. N: one expert's rows.
    pid = tl.program_id(0)
    p = tl.program_id(1)
    e = tl.load(ids_ptr + p).to(tl.int64)
    local = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = local < N
    local = tl.minimum(local, N - 1).to(tl.int64)
    rows = e * N + local  # rows of the stacked weight
    nb = K // BLOCK_K
    x_row = x_ptr + (p // X_DIV).to(tl.int64) * stride_xm
    acc = tl.zeros((BLOCK_N, G, J), dtype=tl.float32)
    for kb in tl.range(0, nb, BLOCKS, num_stages=STAGES):
        if QT == 0:
            w0, w1, w2, w3, xoff, xm = _q4_k_tiles(p0, p1, p2, rows, kb, nb, nb, G)
        elif QT == 1:
            w0, w1, w2, w3, xoff, xm = _q6_k_tiles(p0, p1, p2, p3, rows, kb, nb, nb, G)
        elif QT == 2:
            w0, w1, w2, w3, xoff, xm = _q8_0_tiles(p0, p1, rows, kb, nb, nb, G)
        else:
            w0, w1, w2, w3, xoff, xm = _q4_x_tiles(p0, p1, p2, rows, kb, nb, nb, G, QT - 3)
        t = w0 * tl.load(x_row + xoff, mask=xm, other=0.0).to(tl.float32)[None, :, :]
        if T > 1:
            t += w1 * tl.load(x_row + xoff + S, mask=xm, other=0.0).to(tl.float32)[None, :, :]
        if T > 2:
            t += w2 * tl.load(x_row + xoff + 2 * S, mask=xm, other=0.0).to(tl.float32)[None, :, :]
            t += w3 * tl.load(x_row + xoff + 3 * S, mask=xm, other=0.0).to(tl.float32)[None, :, :]
        acc += t
    tl.store(y_ptr + p.to(tl.int64) * stride_ym + local, tl.sum(tl.sum(acc, axis=2), axis=1), mask=row_ok)


@triton.jit
def _moe_fp4_kernel(x_ptr, ids_ptr, w_ptr, y_ptr, N, K, stride_xm, stride_ym, X_DIV,
                    NV: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    p = tl.program_id(1)
    e = tl.load(ids_ptr + p).to(tl.int64)
    local = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = local < N
    local = tl.minimum(local, N - 1).to(tl.int64)
    acc = _fp4_row_dot(x_ptr + (p // X_DIV).to(tl.int64) * stride_xm, w_ptr, e * N + local, K, NV, BLOCK_N)
    tl.store(y_ptr + p.to(tl.int64) * stride_ym + local, acc, mask=row_ok)


def moe_gemv(x: torch.Tensor, w: ExpertWeights, ids: torch.Tensor, x_div: int,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """y[p] = x[p // x_div] @ W_{ids[p]}^T for every pair p: x (M, K) float, ids (P,) integer
    expert ids on the device (M * x_div == P). Returns float32 (P, w.rows)."""
    if not w.has_kernel:
        raise ValueError("moe_gemv: this expert weight has no Triton kernel (dense).")
    p_count = ids.numel()
    if x.ndim != 2 or x.shape[1] != w.k or x.shape[0] * x_div != p_count:
        raise ValueError(f"moe_gemv: x {tuple(x.shape)} and {p_count} pairs do not match K={w.k}, x_div={x_div}.")
    if x.stride(1) != 1:
        x = x.contiguous()
    ids = ids.reshape(-1)
    if out is None:
        out = torch.empty((p_count, w.rows), dtype=torch.float32, device=x.device)
    if w.planes is not None:
        name = w.planes.qtype
        block_n, blocks, warps, stages = gemv_config(name, w.rows, w.k)[:4]
        qt, block_k, g_per, j, terms, stride = _LAYOUT[name]
        planes = [w.planes.planes[f] for f in _PLANES[name]]
        planes += [planes[0]] * (4 - len(planes))
        _moe_gemv_kernel[(triton.cdiv(w.rows, block_n), p_count)](
            x, ids, *planes, out, w.rows, w.k, x.stride(0), out.stride(0), x_div,
            QT=qt, BLOCK_N=block_n, BLOCKS=blocks, STAGES=stages, BLOCK_K=block_k, G=blocks * g_per, J=j,
            T=terms, S=stride, num_warps=warps)
    else:
        block_n = 16
        _moe_fp4_kernel[(triton.cdiv(w.rows, block_n), p_count)](
            x, ids, w.raw, out, w.rows, w.k, x.stride(0), out.stride(0), x_div, NV=w.qtype == NVFP4,
            BLOCK_N=block_n, num_warps=4)
    return out


def expert_matrices(w: ExpertWeights, ids: torch.Tensor) -> torch.Tensor:
    """float32 (P, rows, k): the matrices of experts ids (P,), gathered and dequantized in torch on
    their device (planes.dequantize_planes, quant/fp4.py): the reference, and TALLOW_MOE_TRITON=0."""
    ids = ids.reshape(-1).long()
    p_count = ids.numel()
    if w.dense is not None:
        return w.dense[ids].float()
    if w.planes is not None:
        gathered = {f: t.view(w.n_experts, w.rows, -1)[ids].reshape(p_count * w.rows, -1)
                    for f, t in w.planes.planes.items()}
        return dequantize_planes(PlaneWeight(w.planes.qtype, p_count * w.rows, w.k, gathered)).view(p_count, w.rows, w.k)
    from ...quant.fp4 import dequantize_mxfp4, dequantize_nvfp4

    block, size = _FP4_LAYOUT[w.qtype]
    blocks = w.raw.view(w.n_experts, w.rows, -1)[ids].reshape(-1, size)
    fn = dequantize_nvfp4 if w.qtype == NVFP4 else dequantize_mxfp4
    return fn(blocks).view(p_count, w.rows, w.k)


def moe_gemv_reference(x: torch.Tensor, w: ExpertWeights, ids: torch.Tensor, x_div: int) -> torch.Tensor:
    """moe_gemv in torch: the chosen experts' matrices dequantized exactly, fp32 products."""
    ids = ids.reshape(-1)
    xs = x.float().repeat_interleave(x_div, dim=0) if x_div > 1 else x.float()
    return torch.bmm(expert_matrices(w, ids), xs.unsqueeze(-1)).squeeze(-1)


# ------------------------------------------------------------------------------------------
# FP4 -> bf16 (dense (N, K)), for the grouped prefill: one program per BLOCK_N rows x one block.

@triton.jit
def _fp4_dequant_kernel(w_ptr, out_ptr, N, K, NV: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    b = tl.program_id(1)
    dst = out_ptr.dtype.element_ty
    if NV:
        nb = K // 64
        s = tl.arange(0, 4)
        j = tl.arange(0, 8)
        base = w_ptr + rows * (nb * 36) + b * 36
        scale = _ue4m3_half(tl.load(base[:, None] + s[None, :]).to(tl.int32))[:, :, None]
        q = tl.load(base[:, None, None] + 4 + s[None, :, None] * 8 + j[None, None, :]).to(tl.int32)
        o = out_ptr + rows[:, None, None] * K + b * 64 + s[None, :, None] * 16 + j[None, None, :]
        m = row_ok[:, None, None]
        tl.store(o, (_e2m1_doubled(q & 15) * scale).to(dst), mask=m)
        tl.store(o + 8, (_e2m1_doubled(q >> 4) * scale).to(dst), mask=m)
    else:
        nb = K // 32
        j = tl.arange(0, 16)
        base = w_ptr + rows * (nb * 17) + b * 17
        e = tl.load(base).to(tl.int32)
        scale = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23).to(tl.float32, bitcast=True)[:, None]
        q = tl.load(base[:, None] + 1 + j[None, :]).to(tl.int32)
        o = out_ptr + rows[:, None] * K + b * 32 + j[None, :]
        m = row_ok[:, None]
        tl.store(o, (_e2m1_doubled(q & 15) * scale).to(dst), mask=m)
        tl.store(o + 16, (_e2m1_doubled(q >> 4) * scale).to(dst), mask=m)


def fp4_dequantize_to(raw: torch.Tensor, qtype: int, k: int, out: torch.Tensor) -> torch.Tensor:
    """raw uint8 (N, row_bytes) FP4 rows of k values -> out (N, k) (bf16/fp32), exact (every FP4
    value times its scale is a bf16 number)."""
    block, _ = _FP4_LAYOUT[int(qtype)]
    n = raw.shape[0]
    block_n = 16
    _fp4_dequant_kernel[(triton.cdiv(n, block_n), k // block)](raw, out, n, k, NV=int(qtype) == NVFP4,
                                                               BLOCK_N=block_n, num_warps=4)
    return out


def fp4_dequantize_reference(raw: torch.Tensor, qtype: int, k: int) -> torch.Tensor:
    from ...quant.fp4 import dequantize_mxfp4, dequantize_nvfp4

    _, size = _FP4_LAYOUT[int(qtype)]
    fn = dequantize_nvfp4 if int(qtype) == NVFP4 else dequantize_mxfp4
    return fn(raw.reshape(-1, size)).reshape(raw.shape[0], k)

