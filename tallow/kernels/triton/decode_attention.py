"""Split-K flash-decoding attention for one query token (GQA, optional sliding window).

Shapes: q (n_heads, head_dim) fp32/fp16/bf16; K and V caches (n_kv_heads, n_ctx, head_dim) fp16
(or bf16), last dim contiguous; `seq_len` an int32 tensor of one element ON THE DEVICE: the
number of valid positions, the current token's included. Because the length is read inside
the kernel, the launch (grid, arguments) is the same at every step, so the call can be
captured once in a CUDA graph and replayed as the cache grows.

Why split-K. One program per head would give a qwen3-4b decode step 8 programs (one per KV
head) for 132 SMs: the KV read would crawl at a few percent of bandwidth. Here the grid is
(n_kv_heads, n_splits) with n_splits fixed at launch (default: enough programs for ~4 per SM),
and each program takes an equal share of the *current* span [start, seq_len) -- computed in
the kernel from the device length -- so all SMs stream KV at any depth. Each program handles
all query heads of its KV head (GQA: K/V bytes are read once, not once per query head), as a
(16 x head_dim) @ (head_dim x BLOCK_T) tensor-core product; the group is padded to 16 rows.
Each split writes its unnormalized partial output with its running max and sum; a second small
kernel merges the splits (log-sum-exp weights). Empty splits (short contexts) write max=-inf
and weigh nothing.

Numerics: q is rounded to the cache dtype for the QK product (as llama.cpp's CUDA flash
attention does with an f16 cache), scores and softmax in fp32 (exp2 with log2(e) folded into
the scale), probabilities rounded to fp16 for the PV product, fp32 accumulation. Relative error
against the fp32 reference is ~1e-3.

Ring buffers and quantized caches: position p is read from slot p % n_slots, so a sliding-window
layer's ring (n_slots = window + chunk - 1 < context) and a plain cache (n_slots >= context, p
< n_slots) take the same code; the span [start, seq_len) never exceeds n_slots. int8 and fp8
e4m3 caches carry one fp32 scale per (head, slot); each K/V tile is dequantized in registers to
fp16 (code * scale) before the same two tensor-core products.

Pipelining: with TALLOW_ATTN_PIPELINE (default) the key loop runs two stages deep, so the next
K/V tiles are in flight while the current ones are multiplied (at depth a split walks hundreds of
keys, a serial memory latency per tile otherwise).

Sliding window: key position p is visible iff p < seq_len and (window == 0 or
p >= seq_len - window), i.e. llama.cpp's rule `pos_q - pos_k < window` with pos_q = seq_len - 1.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ... import switches
from . import pdl

from ...memory.kv_format import storage_is_scaled

__all__ = ["decode_attention", "decode_attention_reference", "default_splits"]

_LOG2E = 1.4426950408889634
# The merge's tile while a short span's splits fit it (TALLOW_ATTN_LIVE_MERGE): up to 2048 keys at 64 a split.
LIVE_ROWS = 32


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, len_ptr, part_ptr, ml_ptr,
                  stride_qr, stride_qh, n_heads, stride_kh, stride_kt, stride_vh, stride_vt, stride_sh,
                  qk_scale, window, n_splits, ring,
                  GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_T: tl.constexpr, SCALED: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
                  SKIP_EMPTY: tl.constexpr, LIVE_MERGE: tl.constexpr):
    pdl.wait(PDL)
    kvh = tl.program_id(0)
    s = tl.program_id(1)
    r = tl.program_id(2)  # query row: consecutive tokens, row r sees one more key than row r - 1
    L = tl.load(len_ptr).to(tl.int32) + r
    start = tl.where(window > 0, tl.maximum(L - window, 0), 0)
    per = tl.cdiv(tl.cdiv(L - start, n_splits), BLOCK_T) * BLOCK_T
    lo = start + s * per
    hi = tl.minimum(lo + per, L)

    gi = tl.arange(0, GP)
    head = kvh * GROUP + gi
    hmask = gi < GROUP
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    q_mask = hmask[:, None] & dmask[None, :]
    if LIVE_MERGE:
        q_mask = q_mask & (hi > lo)  # an empty split never uses q (the key loop does not run)
    q = tl.load(q_ptr + r.to(tl.int64) * stride_qr + head[:, None] * stride_qh + dd[None, :], mask=q_mask, other=0.0)
    if SCALED:
        q = q.to(tl.float16)  # int8/fp8 codes are exact in fp16; their scales multiply the scores
    else:
        q = q.to(k_ptr.dtype.element_ty)  # (GP, BLOCK_D)

    m_i = tl.full((GP,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((GP,), dtype=tl.float32)
    acc = tl.zeros((GP, BLOCK_D), dtype=tl.float32)
    tt = tl.arange(0, BLOCK_T)
    k_base = k_ptr + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + kvh.to(tl.int64) * stride_vh
    for t0 in tl.range(lo, hi, BLOCK_T, num_stages=STAGES):
        t = t0 + tt
        tmask = t < hi
        slot = (t % ring).to(tl.int64)  # a ring buffer holds position t in slot t % ring
        kv_mask = tmask[:, None] & dmask[None, :]
        k = tl.load(k_base + slot[:, None] * stride_kt + dd[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + slot[:, None] * stride_vt + dd[None, :], mask=kv_mask, other=0.0)
        if SCALED:
            # Dequantize the tile in registers to fp16 (what an f16 cache of these values holds).
            k_sc = tl.load(ks_ptr + kvh.to(tl.int64) * stride_sh + slot, mask=tmask, other=0.0)
            v_sc = tl.load(vs_ptr + kvh.to(tl.int64) * stride_sh + slot, mask=tmask, other=0.0)
            k = (k.to(tl.float32) * k_sc[:, None]).to(tl.float16)
            v = (v.to(tl.float32) * v_sc[:, None]).to(tl.float16)
        scores = tl.dot(q, tl.trans(k)) * qk_scale  # (GP, BLOCK_T), log2 units
        scores = tl.where(tmask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    row = (r * n_heads + head).to(tl.int64) * n_splits + s  # (GP,) partial slot of each head
    # An empty split (a short span: its share starts past L) writes only max = -inf and sum 0, which
    # the merge reads as "no partial": with 128 splits over a 32k cache at depth 0, 127 of every head's
    # partial rows would otherwise be zeros written here and read back there (TALLOW_ATTN_SKIP_EMPTY)
    if SKIP_EMPTY:
        tl.store(part_ptr + row[:, None] * BLOCK_D + dd[None, :], acc, mask=hmask[:, None] & (hi > lo))
    else:
        tl.store(part_ptr + row[:, None] * BLOCK_D + dd[None, :], acc, mask=hmask[:, None])
    tl.store(ml_ptr + row * 2, m_i, mask=hmask)
    tl.store(ml_ptr + row * 2 + 1, l_i, mask=hmask)


@triton.jit
def _merge_rows(part_ptr, ml_ptr, h, n_live, NS: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                SKIP_EMPTY: tl.constexpr):
    """Head h's output from the first n_live of its NS partial rows, merged as a (ROWS, BLOCK_D) tile."""
    si = tl.arange(0, ROWS)
    live = si < n_live
    dd = tl.arange(0, BLOCK_D)
    m = tl.load(ml_ptr + (h * NS + si) * 2, mask=live, other=float("-inf"))  # (ROWS,)
    l = tl.load(ml_ptr + (h * NS + si) * 2 + 1, mask=live, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.exp2(m - m_max)  # empty splits: exp2(-inf) = 0
    if SKIP_EMPTY:  # an empty split's row was not written: read as 0, what it weighs anyway (0 * 0)
        acc = tl.load(part_ptr + (h * NS + si)[:, None] * BLOCK_D + dd[None, :], mask=(live & (m != float("-inf")))[:, None],
                      other=0.0)
    else:
        acc = tl.load(part_ptr + (h * NS + si)[:, None] * BLOCK_D + dd[None, :], mask=live[:, None], other=0.0)
    return tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)


@triton.jit
def _merge_kernel(part_ptr, ml_ptr, out_ptr, len_ptr, stride_or, stride_oh, n_heads, window,
                  NS: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                  PDL: tl.constexpr, SKIP_EMPTY: tl.constexpr, LIVE: tl.constexpr):
    pdl.wait(PDL)
    r = tl.program_id(1).to(tl.int64)
    out_ptr += r * stride_or
    hh = tl.program_id(0).to(tl.int64)
    h = r * n_heads + hh
    dd = tl.arange(0, BLOCK_D)
    if LIVE < NS:
        # The splits that hold keys, counted as the split kernel cuts the span: while they fit LIVE rows, merge
        # a LIVE-row tile (what a LIVE-split launch merges: the same bits as a cache of LIVE * BLOCK_T slots)
        # instead of the NS-row one whose other rows are empty (TALLOW_ATTN_LIVE_MERGE)
        L = tl.load(len_ptr).to(tl.int32) + r.to(tl.int32)
        span = L - tl.where(window > 0, tl.maximum(L - window, 0), 0)
        per = tl.maximum(tl.cdiv(tl.cdiv(span, NS), BLOCK_T) * BLOCK_T, BLOCK_T)
        n_live = tl.cdiv(span, per)
        if n_live <= LIVE:
            o = _merge_rows(part_ptr, ml_ptr, h, n_live, NS, LIVE, BLOCK_D, SKIP_EMPTY)
        else:
            o = _merge_rows(part_ptr, ml_ptr, h, NS, NS, NS, BLOCK_D, SKIP_EMPTY)
    else:
        o = _merge_rows(part_ptr, ml_ptr, h, NS, NS, NS, BLOCK_D, SKIP_EMPTY)
    tl.store(out_ptr + hh * stride_oh + dd, o, mask=dd < D)


def default_splits(n_kv_heads: int, n_ctx: int, n_sms: int | None = None, block_t: int = 64) -> int:
    """A power of two giving ~4 programs per SM, at most 128 (on the H200, 256 and 512 splits were
    slower at every depth: the merge kernel's (n_splits x head_dim) tile spills), never more
    splits than BLOCK_T tiles in n_ctx."""
    if n_sms is None:
        n_sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    want = max(1, math.ceil(4 * n_sms / n_kv_heads))
    cap = max(1, math.ceil(n_ctx / block_t))
    return 1 << (min(want, cap, 128) - 1).bit_length()


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_len: torch.Tensor,
                     scale: float, window: int = 0, n_splits: int | None = None, out: torch.Tensor | None = None,
                     scratch: tuple[torch.Tensor, torch.Tensor] | None = None, block_t: int | None = None,
                     num_warps: int = 4, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query token over the first `seq_len` positions of the cache, or of R
    consecutive tokens (q (R, n_heads, head_dim): row r over the first seq_len + r positions,
    each row computed exactly as a one-token call at its length computes it).

    q (n_heads, head_dim); k_cache, v_cache (n_kv_heads, n_slots, head_dim); seq_len int32 (1,)
    on q's device. Position t is read from slot t % n_slots: a cache with n_slots >= the
    context is a plain cache, a smaller one a sliding-window ring (then window <= n_slots).
    int8 or float8_e4m3fn caches come with k_scale, v_scale (n_kv_heads, n_slots) float32: the
    value of a code is code * scale of its position and head.
    Returns float32 (n_heads, head_dim), or (R, n_heads, head_dim) (into `out` if given). For CUDA graphs,
    pass `out` and `scratch` (from `make_scratch`) so the launch allocates nothing."""
    q3 = q if q.dim() == 3 else q.unsqueeze(0)
    n_rows, n_heads, d = q3.shape
    n_kv, n_ctx, d_k = k_cache.shape
    if d_k != d or v_cache.shape != k_cache.shape or n_heads % n_kv:
        raise ValueError(f"decode_attention: q {tuple(q.shape)}, K {tuple(k_cache.shape)}, "
                         f"V {tuple(v_cache.shape)} do not fit (GQA needs n_heads % n_kv_heads == 0).")
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1 or q3.stride(2) != 1:
        raise ValueError("decode_attention: the head_dim axis of q, K and V must be contiguous.")
    scaled = storage_is_scaled(k_cache.dtype)
    if scaled != (k_scale is not None) or (k_scale is None) != (v_scale is None):
        raise ValueError(f"decode_attention: a {k_cache.dtype} cache needs k_scale and v_scale exactly when it is int8/fp8.")
    if scaled and (k_scale.shape != k_cache.shape[:2] or v_scale.shape != k_scale.shape or k_scale.stride(1) != 1
                   or v_scale.stride() != k_scale.stride() or k_scale.dtype != torch.float32):
        raise ValueError("decode_attention: k_scale and v_scale must be float32 (n_kv_heads, n_slots), contiguous rows.")
    group = n_heads // n_kv
    block_d = triton.next_power_of_2(d)
    if block_t is None:
        # The K and V tiles (BLOCK_T x BLOCK_D, staged through shared memory) of gemma4's 512-wide
        # global heads at 64 keys need 280 KB, more than the H200's 227 KB: fewer keys per step.
        block_t = 64 if block_d <= 128 else (32 if block_d <= 256 else 16)
    if n_splits is None:
        n_splits = default_splits(n_kv, n_ctx, block_t=block_t)
    if n_splits & (n_splits - 1):
        raise ValueError(f"n_splits must be a power of two, got {n_splits}.")
    if scratch is None:
        scratch = make_scratch(n_rows * n_heads, n_splits, d, q.device)
    part, ml = scratch
    if out is None:
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    out3 = out if out.dim() == 3 else out.unsqueeze(0)
    ks, vs = (k_scale, v_scale) if scaled else (k_cache, v_cache)  # unused pointers when not scaled
    skip = switches.enabled("TALLOW_ATTN_SKIP_EMPTY")
    live_merge = switches.enabled("TALLOW_ATTN_LIVE_MERGE")
    _split_kernel[(n_kv, n_splits, n_rows)](
        q3, k_cache, v_cache, ks, vs, seq_len, part, ml,
        q3.stride(0), q3.stride(1), n_heads, k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        k_scale.stride(0) if scaled else 0,
        float(scale) * _LOG2E, int(window), n_splits, n_ctx,
        GROUP=group, GP=max(16, triton.next_power_of_2(group)), D=d, BLOCK_D=block_d, BLOCK_T=block_t,
        SCALED=scaled, STAGES=2 if switches.enabled("TALLOW_ATTN_PIPELINE") else 1, num_warps=num_warps,
        SKIP_EMPTY=skip, LIVE_MERGE=live_merge, **pdl.launch(q.device))
    _merge_kernel[(n_heads, n_rows)](part, ml, out3, seq_len, out3.stride(0), out3.stride(1), n_heads, int(window),
                                     NS=n_splits, D=d, BLOCK_D=block_d, BLOCK_T=block_t, num_warps=4, SKIP_EMPTY=skip,
                                     LIVE=min(n_splits, LIVE_ROWS) if live_merge else n_splits, **pdl.launch(q.device))
    return out


def make_scratch(n_heads: int, n_splits: int, head_dim: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs (n_heads, n_splits, BLOCK_D) and (max, sum) pairs (n_heads, n_splits, 2), fp32
    (n_heads = rows x heads for a call with several query rows)."""
    block_d = triton.next_power_of_2(head_dim)
    return (torch.empty((n_heads, n_splits, block_d), dtype=torch.float32, device=device),
            torch.empty((n_heads, n_splits, 2), dtype=torch.float32, device=device))


def decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_len: int,
                               scale: float, window: int = 0, k_scale: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 softmax attention in torch over positions [max(0, seq_len - window), seq_len), position
    t read from slot t % n_slots, codes times their scales when given."""
    n_heads, d = q.shape
    n_kv, n_slots = k_cache.shape[:2]
    start = max(0, seq_len - window) if window > 0 else 0
    slots = torch.arange(start, seq_len) % n_slots
    k, v = k_cache[:, slots].float(), v_cache[:, slots].float()
    if k_scale is not None:
        k = k * k_scale[:, slots].unsqueeze(-1)
        v = v * v_scale[:, slots].unsqueeze(-1)
    k = k.repeat_interleave(n_heads // n_kv, dim=0)  # (n_heads, T, d)
    v = v.repeat_interleave(n_heads // n_kv, dim=0)
    scores = torch.einsum("hd,htd->ht", q.float(), k) * scale
    return torch.einsum("ht,htd->hd", torch.softmax(scores, dim=-1), v)
