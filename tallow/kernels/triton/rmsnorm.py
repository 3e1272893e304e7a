"""RMSNorm for decode and prefill rows, optionally fused with the residual add before it.

    s = x (+ residual)          -> written to `sum_out` when given (the new residual stream)
    y = s * rsqrt(mean(s^2) + eps) * w     (ggml's order: the normed value times the weight)

`rmsnorm_add` is the other order, a norm after a branch joining the stream (gemma4's per-layer
input, its post-norms): out = (residual + rmsnorm(x) * w) * scale, scale a (1,) device tensor
or none, and optionally the next norm of out in the same launch.

One program per row. Rows up to ONE_PASS_MAX wide are held in registers (one load of every
input, all issued at once; TALLOW_NORM_ONE_PASS=0: the loop below): a decode row is a single
program, so each extra pass over global memory is a full memory latency on the step's critical
path. Wider rows loop in 1024-element chunks, two passes (the second from L1/L2) or three with
the second norm. Graph-safe: no allocation when `out` (and `sum_out`) are given.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import switches
from . import pdl

ONE_PASS_MAX = 8192  # elements: 16 warps x 16 per thread for each live row vector

__all__ = ["rmsnorm", "rmsnorm_reference", "rmsnorm_add", "rmsnorm_add_reference"]


@triton.jit
def row_rstd(x_row, res_row, sum_row, D, eps, write, HAS_RES: tl.constexpr, WRITE_SUM: tl.constexpr,
             BLOCK: tl.constexpr):
    """1 / RMS of one row x (+ residual), writing the sum to sum_row where `write` holds (the
    GEMV prologues in quant_gemv.py share this pass, so both norms round alike)."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(0, D, BLOCK):
        e = off + tl.arange(0, BLOCK)
        msk = e < D
        v = tl.load(x_row + e, mask=msk, other=0.0).to(tl.float32)
        if HAS_RES:
            v += tl.load(res_row + e, mask=msk, other=0.0).to(tl.float32)
            if WRITE_SUM:
                tl.store(sum_row + e, v, mask=msk & write)
        acc += v * v
    return 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + eps)


@triton.jit
def _rstd(v, D, eps):
    """1 / RMS of a row held whole in registers (zeros past D)."""
    return 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / D + eps)


def _geometry(d: int) -> tuple[int, int, bool]:
    """(BLOCK, num_warps, ONE_PASS) for rows of d elements."""
    whole = triton.next_power_of_2(max(d, 16))
    if whole <= ONE_PASS_MAX and switches.enabled("TALLOW_NORM_ONE_PASS"):
        return whole, max(4, min(16, whole // 256)), True
    return min(1024, whole), 4, False


@triton.jit
def _rmsnorm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, sum_ptr, D, eps, sxm, srm, sym, ssm,
                    HAS_RES: tl.constexpr, WRITE_SUM: tl.constexpr, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr,
                    PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    if ONE_PASS:  # the whole row in registers (BLOCK >= D)
        e = tl.arange(0, BLOCK)
        msk = e < D
        w = tl.load(w_ptr + e, mask=msk, other=0.0).to(tl.float32)
        v = tl.load(x_ptr + row * sxm + e, mask=msk, other=0.0).to(tl.float32)
        if HAS_RES:
            v += tl.load(res_ptr + row * srm + e, mask=msk, other=0.0).to(tl.float32)
            if WRITE_SUM:
                tl.store(sum_ptr + row * ssm + e, v, mask=msk)
        tl.store(y_ptr + row * sym + e, (v * _rstd(v, D, eps)) * w, mask=msk)
        return
    rstd = row_rstd(x_ptr + row * sxm, res_ptr + row * srm, sum_ptr + row * ssm, D, eps, True,
                    HAS_RES, WRITE_SUM, BLOCK)
    for off in range(0, D, BLOCK):
        e = off + tl.arange(0, BLOCK)
        msk = e < D
        v = tl.load(x_ptr + row * sxm + e, mask=msk, other=0.0).to(tl.float32)
        if HAS_RES:
            v += tl.load(res_ptr + row * srm + e, mask=msk, other=0.0).to(tl.float32)
        y = (v * rstd) * tl.load(w_ptr + e, mask=msk, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * sym + e, y, mask=msk)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None,
            residual: torch.Tensor | None = None, sum_out: torch.Tensor | None = None) -> torch.Tensor:
    """y = rmsnorm(x (+ residual)) * weight, float32 (M, D) (or (D,)). With `residual`, the sum is
    written to `sum_out`, which must not alias x or `residual`: the second pass re-reads both."""
    squeeze = x.ndim == 1
    x2 = x.reshape(1, -1) if squeeze else x
    m, d = x2.shape
    if out is None:
        out = torch.empty((m, d), dtype=torch.float32, device=x.device)
    o2 = out.reshape(m, d)
    r2 = residual.reshape(m, d) if residual is not None else x2
    s2 = sum_out.reshape(m, d) if sum_out is not None else o2
    block, warps, one_pass = _geometry(d)
    _rmsnorm_kernel[(m,)](x2, r2, weight, o2, s2, d, float(eps), x2.stride(0), r2.stride(0), o2.stride(0),
                          s2.stride(0), HAS_RES=residual is not None, WRITE_SUM=sum_out is not None,
                          BLOCK=block, ONE_PASS=one_pass, num_warps=warps, **pdl.launch(x.device))
    return out


@triton.jit
def _norm_add_row(v, r, w, scale_ptr, D, eps, HAS_SCALE: tl.constexpr):
    """A whole row's (r + rmsnorm(v) * w) * scale, fp32 (the one-pass norm-after-join, here and in
    mmvq._rmsnorm_add_q8_kernel)."""
    y = (v * _rstd(v, D, eps)) * w
    y += r
    if HAS_SCALE:
        y = y * tl.load(scale_ptr).to(tl.float32)
    return y


@triton.jit
def _rmsnorm_add_kernel(x_ptr, res_ptr, w_ptr, scale_ptr, y_ptr, w2_ptr, h_ptr, D, eps, sxm, srm, sym, shm,
                        HAS_SCALE: tl.constexpr, NORM2: tl.constexpr, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr,
                        PDL: tl.constexpr):
    pdl.wait(PDL)
    row = tl.program_id(0)
    if ONE_PASS:  # the whole row in registers (BLOCK >= D), every input loaded up front
        e = tl.arange(0, BLOCK)
        msk = e < D
        w = tl.load(w_ptr + e, mask=msk, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + row * srm + e, mask=msk, other=0.0).to(tl.float32)
        v = tl.load(x_ptr + row * sxm + e, mask=msk, other=0.0).to(tl.float32)
        y = _norm_add_row(v, r, w, scale_ptr, D, eps, HAS_SCALE)
        tl.store(y_ptr + row * sym + e, y, mask=msk)
        if NORM2:
            w2 = tl.load(w2_ptr + e, mask=msk, other=0.0).to(tl.float32)
            tl.store(h_ptr + row * shm + e, (y * _rstd(y, D, eps)) * w2, mask=msk)
        return
    rstd = row_rstd(x_ptr + row * sxm, x_ptr, x_ptr, D, eps, False, False, False, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for off in range(0, D, BLOCK):
        e = off + tl.arange(0, BLOCK)
        msk = e < D
        v = tl.load(x_ptr + row * sxm + e, mask=msk, other=0.0).to(tl.float32)
        y = (v * rstd) * tl.load(w_ptr + e, mask=msk, other=0.0).to(tl.float32)
        y += tl.load(res_ptr + row * srm + e, mask=msk, other=0.0).to(tl.float32)
        if HAS_SCALE:
            y = y * tl.load(scale_ptr).to(tl.float32)
        tl.store(y_ptr + row * sym + e, y, mask=msk)
        acc += y * y
    if NORM2:  # the next norm over the new stream, read back from where this program wrote it
        tl.debug_barrier()
        rstd2 = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + eps)
        for off in range(0, D, BLOCK):
            e = off + tl.arange(0, BLOCK)
            msk = e < D
            y = tl.load(y_ptr + row * sym + e, mask=msk, other=0.0)
            h = (y * rstd2) * tl.load(w2_ptr + e, mask=msk, other=0.0).to(tl.float32)
            tl.store(h_ptr + row * shm + e, h, mask=msk)


def rmsnorm_add(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor,
                scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
                next_weight: torch.Tensor | None = None):
    """(residual + rmsnorm(x) * weight) * scale, float32 (M, D); scale (1,) or None. `out` may
    be `residual` itself (each element is read before it is written, by the same program).
    With `next_weight`, also that stream's own RMSNorm times next_weight: returns (out, normed)."""
    m, d = x.shape
    if out is None:
        out = torch.empty((m, d), dtype=torch.float32, device=x.device)
    h = torch.empty((m, d), dtype=torch.float32, device=x.device) if next_weight is not None else out
    block, warps, one_pass = _geometry(d)
    _rmsnorm_add_kernel[(m,)](x, residual, weight, scale if scale is not None else weight, out,
                              next_weight if next_weight is not None else weight, h, d, float(eps),
                              x.stride(0), residual.stride(0), out.stride(0), h.stride(0),
                              HAS_SCALE=scale is not None, NORM2=next_weight is not None, BLOCK=block,
                              ONE_PASS=one_pass, num_warps=warps, **pdl.launch(x.device))
    return out if next_weight is None else (out, h)


def rmsnorm_add_reference(x, weight, eps, residual, scale=None, next_weight=None):
    y = residual.float() + x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    y = y if scale is None else y * scale.float()
    if next_weight is None:
        return y
    return y, y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps) * next_weight.float()


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """(y, s): fp32 torch, s = x + residual (or x)."""
    s = x.float() + (residual.float() if residual is not None else 0.0)
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y, s
