"""Rotary position embedding of one decode token's q and k heads, at a position read from a
device tensor, with the optional per-head RMSNorm before it (qwen3 / gemma3 q_norm, k_norm) and
the KV-cache write after it, all in one launch.

Styles (ggml): 'norm' rotates adjacent pairs (2i, 2i+1); 'neox' rotates (i, i + rot/2). Only the
first `rot_dim` dims rotate (partial rotary); the rest pass through. cos/sin: precomputed fp32
tables (n_ctx, rot_dim/2), row = position, built by the caller exactly as the CPU path builds
them, so both sides rotate by the same numbers.

Outputs: q_out (n_heads, D) fp32; k goes to `k_out` (n_kv, D) or, with `k_cache`
(n_kv, n_ctx, D), straight into the cache row at the position (converted to the cache dtype);
`v` (n_kv, D) is copied into `v_cache` at the same row when given, RMS-normed without a weight
first with `v_norm` (gemma4). With k None only q is computed (gemma4's shared-KV layers, which
read an earlier layer's cache). One program per head.
Graph-safe: the position is read in the kernel; nothing is allocated when outputs are given.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl

__all__ = ["rope", "rope_reference"]


@triton.jit
def _rope_row(src, nw, dst, cos_ptr, sin_ptr, pos, D, ROT_HALF, eps, stab,
              NEOX: tl.constexpr, NORM: tl.constexpr, BLOCK_D: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    x = tl.load(src + d, mask=dm, other=0.0).to(tl.float32)
    i = tl.arange(0, BLOCK_D // 2)
    im = i < ROT_HALF
    if NEOX:
        i1 = i
        i2 = i + ROT_HALF
    else:
        i1 = 2 * i
        i2 = 2 * i + 1
    x1 = tl.load(src + i1, mask=im, other=0.0).to(tl.float32)
    x2 = tl.load(src + i2, mask=im, other=0.0).to(tl.float32)
    if NORM:
        scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
        x1 = (x1 * scale) * tl.load(nw + i1, mask=im, other=0.0)
        x2 = (x2 * scale) * tl.load(nw + i2, mask=im, other=0.0)
        x = (x * scale) * tl.load(nw + d, mask=dm, other=0.0)
    c = tl.load(cos_ptr + pos * stab + i, mask=im, other=1.0)
    s = tl.load(sin_ptr + pos * stab + i, mask=im, other=0.0)
    ety = dst.dtype.element_ty
    tl.store(dst + d, x.to(ety), mask=dm & (d >= 2 * ROT_HALF))  # pass-through dims
    tl.store(dst + i1, (x1 * c - x2 * s).to(ety), mask=im)
    tl.store(dst + i2, (x2 * c + x1 * s).to(ety), mask=im)


@triton.jit
def _rope_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, qn_ptr, kn_ptr, qo_ptr, ko_ptr, vo_ptr,
                 NQ, D, ROT_HALF, eps, sq, sk, sv, sqo, sko_h, sko_t, svo_h, svo_t, stab, sqr, skr, svr, sqor,
                 NEOX: tl.constexpr, QNORM: tl.constexpr, KNORM: tl.constexpr, COPY_V: tl.constexpr,
                 VNORM: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    pdl.wait(PDL)
    h = tl.program_id(0)
    r = tl.program_id(1)  # token row (several consecutive tokens: speculative verification)
    q_ptr += r * sqr
    k_ptr += r * skr
    v_ptr += r * svr
    qo_ptr += r * sqor
    pos = tl.load(pos_ptr + r).to(tl.int64)
    slot = tl.load(slot_ptr + r).to(tl.int64)  # the cache row: pos, or pos % ring for a ring buffer
    if h < NQ:
        _rope_row(q_ptr + h * sq, qn_ptr, qo_ptr + h * sqo, cos_ptr, sin_ptr, pos, D, ROT_HALF, eps, stab,
                  NEOX, QNORM, BLOCK_D)
    else:
        kh = h - NQ
        _rope_row(k_ptr + kh * sk, kn_ptr, ko_ptr + kh * sko_h + slot * sko_t, cos_ptr, sin_ptr, pos, D, ROT_HALF,
                  eps, stab, NEOX, KNORM, BLOCK_D)
        if COPY_V:
            d = tl.arange(0, BLOCK_D)
            dm = d < D
            vv = tl.load(v_ptr + kh * sv + d, mask=dm, other=0.0)
            if VNORM:
                vv = vv.to(tl.float32)
                vv = vv * (1.0 / tl.sqrt(tl.sum(vv * vv, axis=0) / D + eps))
            tl.store(vo_ptr + kh * svo_h + slot * svo_t + d, vv.to(vo_ptr.dtype.element_ty), mask=dm)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
         style: str = "neox", rot_dim: int | None = None, q_out: torch.Tensor | None = None,
         k_out: torch.Tensor | None = None, k_cache: torch.Tensor | None = None, v: torch.Tensor | None = None,
         v_cache: torch.Tensor | None = None, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
         eps: float = 1e-6, slot: torch.Tensor | None = None, v_norm: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """q (n_heads, D), k (n_kv, D) (last dims contiguous); pos int32 (1,) on the device; `slot`
    (1,) the cache row to write (default: pos). Returns (q_out, k_out or k_cache).
    R consecutive tokens in one launch: q (R, n_heads, D), k and v (R, n_kv, D), pos and slot
    (R,); each row is computed as a one-token call computes it (k_out is not taken then).
    k None: q alone (returns (q_out, None))."""
    rows = q.shape[0] if q.dim() == 3 else 1
    q3 = q.reshape(rows, *q.shape[-2:])
    nq, d = q3.shape[1:]
    q_only = k is None
    k3 = q3 if q_only else k.reshape(rows, *k.shape[-2:])
    nk = 0 if q_only else k3.shape[1]
    rot = d if rot_dim is None else rot_dim
    if rot % 2 or rot > d or cos.shape[1] * 2 != rot:
        raise ValueError(f"rope: rot_dim {rot}, head_dim {d}, tables {tuple(cos.shape)} do not fit.")
    if q_out is None:
        q_out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    qo3 = q_out.reshape(rows, nq, d)
    to_cache = k_cache is not None
    if q_only:
        ko, sko_h, sko_t = q_out, 0, 0
    elif to_cache:
        ko, sko_h, sko_t = k_cache, k_cache.stride(0), k_cache.stride(1)
    else:
        if rows > 1:
            raise ValueError("rope: several token rows write their keys into a cache (k_cache).")
        if k_out is None:
            k_out = torch.empty((nk, d), dtype=torch.float32, device=q.device)
        ko, sko_h, sko_t = k_out, k_out.stride(0), 0
    copy_v = v is not None and v_cache is not None
    v3 = v.reshape(rows, *v.shape[-2:]) if copy_v else q3
    vo = v_cache if copy_v else q_out
    _rope_kernel[(nq + nk, rows)](
        q3, k3, v3, cos, sin, pos, pos if slot is None else slot, q_norm if q_norm is not None else q, k_norm if k_norm is not None else q,
        qo3, ko, vo, nq, d, rot // 2, float(eps), q3.stride(1), k3.stride(1), v3.stride(1) if copy_v else 0,
        qo3.stride(1), sko_h, sko_t, vo.stride(0) if copy_v else 0, vo.stride(1) if copy_v else 0, cos.stride(0),
        q3.stride(0), k3.stride(0), v3.stride(0), qo3.stride(0),
        NEOX=style == "neox", QNORM=q_norm is not None, KNORM=k_norm is not None, COPY_V=copy_v, VNORM=v_norm,
        BLOCK_D=triton.next_power_of_2(d), num_warps=1 if d <= 128 else 2, **pdl.launch(q.device))
    return q_out, None if q_only else ko


def rope_reference(x: torch.Tensor, cos_row: torch.Tensor, sin_row: torch.Tensor, style: str = "neox",
                   rot_dim: int | None = None, norm: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """x (H, D) fp32 -> rotated (optionally per-head RMS-normed first); cos_row/sin_row (rot/2,)."""
    x = x.float().clone()
    if norm is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm.float()
    d = x.shape[1]
    rot = d if rot_dim is None else rot_dim
    half = rot // 2
    if style == "neox":
        a, b = x[:, :half].clone(), x[:, half:rot].clone()
        x[:, :half], x[:, half:rot] = a * cos_row - b * sin_row, b * cos_row + a * sin_row
    else:
        a, b = x[:, 0:rot:2].clone(), x[:, 1:rot:2].clone()
        x[:, 0:rot:2], x[:, 1:rot:2] = a * cos_row - b * sin_row, b * cos_row + a * sin_row
    return x
