"""Flash attention for a prefill chunk: causal, GQA, sliding window, optional soft-cap, reading
K/V straight from the KV pool (plain, ring, or int8/fp8 with scales).

Why. The torch path builds a boolean mask, converts the cache's keys and values to float32
copies and runs SDPA's math fallback (fp32 + mask + GQA has no fused kernel): about fifteen
launches and two cache-sized copies per layer. Prefill on the GPU is launch-bound at short and
mid lengths (the host issues ~50 launches per layer), so this one launch per layer is the lever.

Shapes: q (n, n_heads, head_dim) fp32 for queries at positions start..start+n-1, their K/V
already written to the pool; K/V caches (n_kv_heads, n_slots, head_dim), position p in slot
p % n_slots (a plain cache has n_slots >= every position, so p itself). Keys lo..start+n-1
are read, where lo is the oldest position any query may see (0, or the window's edge for a
ring). Output (n, n_heads * head_dim) fp32.

One program per (block of BLOCK_M queries, query head): Q tile (BLOCK_M, D) @ K tile^T on
the tensor cores, online softmax in fp32 with exp2, P (rounded to fp16) @ V tile, fp32
accumulation. Numerics as the decode kernel (decode_attention.py) and llama.cpp's CUDA flash
attention with an f16 cache: q rounded to the cache's float type for QK, probabilities to fp16
for PV. A query at p sees key k iff k <= p and (window == 0 or p - k < window).

Deep contexts (TALLOW_PREFILL_SPLIT): one program per (query block, head) is only n/64 x heads
programs — 48 for Falcon-H1-1.5B-Deep's 512-token chunk, on 132 SMs — each walking every key of a
32k context alone. So where a block's keys can span more than SPLIT_SPAN, a third grid axis splits
them into SPLIT_SPAN-key ranges (flash-decoding's split-K, for a prefill chunk): each range's
program keeps its unnormalised accumulator, running max and sum in a scratch, and a second launch
merges a row's ranges (rescaled to their common max). A block whose keys fit one range writes its
output directly, by the same loop as without the split (the same bits), and the merge skips it;
ranges past a block's keys do nothing. The split count is fixed at launch from the cache's size
(a captured graph does not know the depth), so at small depths most programs exit at once.

TALLOW_TRITON_ATTENTION=0 sends prefill back to the torch path.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ... import switches

__all__ = ["prefill_attention", "prefill_attention_enabled"]

_LOG2E = 1.4426950408889634
SPLIT_SPAN = 2048  # keys per range of a split block (TALLOW_PREFILL_SPLIT)


def prefill_attention_enabled() -> bool:
    return switches.enabled("TALLOW_TRITON_ATTENTION")


@triton.jit
def _block_keys(start, pid_m, lo, window, n_q, span, BLOCK_M: tl.constexpr):
    """The keys block pid_m of queries can see, [k_lo, k_hi): from its first query's window edge to
    its last query; and how many span-key ranges they make (a split block's). The split kernel and
    its merge must agree on both."""
    first = start + pid_m * BLOCK_M
    k_lo = tl.maximum(lo, tl.where(window > 0, first - window + 1, lo))
    k_hi = tl.minimum(first + BLOCK_M, start + n_q)
    return k_lo, k_hi, (k_hi - k_lo + span - 1) // span


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, o_ptr, start_ptr, part_ptr, ml_ptr, n_q, start, lo, n_slots,
                    window, span, qk_scale, softcap, sq_t, sq_h, sk_h, sk_t, sv_h, sv_t, ss_h, so_t,
                    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, SCALED: tl.constexpr, SOFTCAP: tl.constexpr,
                    START_ON_DEVICE: tl.constexpr, SPLIT: tl.constexpr):
    pid_m = tl.program_id(0)
    if START_ON_DEVICE:  # a captured prefill graph: the chunk's first position lives on the device
        start = tl.load(start_ptr).to(tl.int32)
    h = tl.program_id(1)
    kvh = h // GROUP
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    m_ok = m < n_q
    d_ok = d < D
    q_pos = start + m
    k_lo, k_hi, n_ranges = _block_keys(start, pid_m, lo, window, n_q, span, BLOCK_M)
    q_ok = m_ok
    if SPLIT:  # this program's range of the block's keys; one range: the whole, written directly
        sid = tl.program_id(2)
        direct = n_ranges <= 1
        k_lo = k_lo + sid * span
        k_hi = tl.minimum(k_hi, k_lo + span)
        q_ok = m_ok & (k_lo < k_hi)  # a range past the block's keys (most, at small depths) reads nothing
    q = tl.load(q_ptr + m[:, None] * sq_t + h * sq_h + d[None, :], mask=q_ok[:, None] & d_ok[None, :], other=0.0)
    # QK in the cache's float type (fp16 for codes), like the decode kernel.
    kv_float = tl.float16 if SCALED else k_ptr.dtype.element_ty
    q = q.to(kv_float)
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)  # finite: a fully masked tile adds exp2(-inf) = 0
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for n0 in range(k_lo, k_hi, BLOCK_N):
        p = n0 + tl.arange(0, BLOCK_N)
        p_ok = p < k_hi
        slot = (p % n_slots).to(tl.int64)
        k = tl.load(k_ptr + kvh * sk_h + slot[:, None] * sk_t + d[None, :], mask=p_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_ptr + kvh * sv_h + slot[:, None] * sv_t + d[None, :], mask=p_ok[:, None] & d_ok[None, :], other=0.0)
        if SCALED:
            k = (k.to(tl.float32) * tl.load(ks_ptr + kvh * ss_h + slot, mask=p_ok, other=0.0)[:, None]).to(tl.float16)
            v = (v.to(tl.float32) * tl.load(vs_ptr + kvh * ss_h + slot, mask=p_ok, other=0.0)[:, None]).to(tl.float16)
        s = tl.dot(q, tl.trans(k.to(kv_float)))  # (BLOCK_M, BLOCK_N) fp32
        if SOFTCAP:
            s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * (s * qk_scale / softcap))) - 1.0)  # cap * tanh(s * scale / cap)
            s = s * 1.4426950408889634
        else:
            s = s * (qk_scale * 1.4426950408889634)
        visible = (p[None, :] <= q_pos[:, None]) & p_ok[None, :]
        visible &= (window <= 0) | (q_pos[:, None] - p[None, :] < window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        prob = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(prob, axis=1)
        acc = acc * alpha[:, None] + tl.dot(prob.to(tl.float16), v.to(tl.float16))
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if SPLIT:
        mine = sid < n_ranges
        tl.store(o_ptr + m[:, None] * so_t + h * D + d[None, :], out, mask=m_ok[:, None] & d_ok[None, :] & direct & (sid == 0))
        # (range, row, head): the unnormalised accumulator, and the running max and sum
        row = (sid * n_q + m) * tl.num_programs(1) + h
        part = m_ok & mine & (n_ranges > 1)
        tl.store(part_ptr + row[:, None] * BLOCK_D + d[None, :], acc, mask=part[:, None])
        tl.store(ml_ptr + 2 * row, m_i, mask=part)
        tl.store(ml_ptr + 2 * row + 1, l_i, mask=part)
    else:
        tl.store(o_ptr + m[:, None] * so_t + h * D + d[None, :], out, mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def _merge_kernel(part_ptr, ml_ptr, o_ptr, start_ptr, n_q, start, lo, window, span, n_heads, so_t,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, START_ON_DEVICE: tl.constexpr):
    """A split block's rows for one head: its ranges' accumulators and sums rescaled to a running
    common max, range by range, then divided. A block written directly has no ranges to merge."""
    pid_m, h = tl.program_id(0), tl.program_id(1)
    if START_ON_DEVICE:
        start = tl.load(start_ptr).to(tl.int32)
    _, _, n_ranges = _block_keys(start, pid_m, lo, window, n_q, span, BLOCK_M)
    i = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    i_ok = i < n_q
    d = tl.arange(0, BLOCK_D)
    big = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)
    l_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for r in range(0, tl.where(n_ranges > 1, n_ranges, 0)):
        row = (r * n_q + i) * n_heads + h
        m_r = tl.load(ml_ptr + 2 * row, mask=i_ok, other=-1.0e30)
        l_r = tl.load(ml_ptr + 2 * row + 1, mask=i_ok, other=0.0)
        a_r = tl.load(part_ptr + row[:, None] * BLOCK_D + d[None, :], mask=i_ok[:, None], other=0.0)
        m_new = tl.maximum(big, m_r)
        c_old, c_r = tl.exp2(big - m_new), tl.exp2(m_r - m_new)
        acc = acc * c_old[:, None] + a_r * c_r[:, None]
        l_sum = l_sum * c_old + l_r * c_r
        big = m_new
    out = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
    tl.store(o_ptr + i[:, None] * so_t + h * D + d[None, :], out, mask=i_ok[:, None] & (d < D)[None, :] & (n_ranges > 1))


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: "int | torch.Tensor",
                      lo: int, scale: float, window: int | None = None, softcap: float | None = None,
                      k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                      span: int | None = None, block: int | None = None) -> torch.Tensor:
    """q (n, n_heads, head_dim) at positions start..; caches (n_kv_heads, n_slots, head_dim) holding
    positions lo..start+n-1 (slot p % n_slots); scales (n_kv_heads, n_slots) for int8/fp8 codes.
    `start` may be a (1,) integer tensor on the device (graph capture; then lo must be 0 or
    implied by the window, as it always is: the kernel never reads before a window's edge).
    Returns (n, n_heads * head_dim) float32. span / block: overrides of SPLIT_SPAN and the query and
    key tiles (the interpreter tests split small caches)."""
    n, n_heads, head_dim = q.shape
    n_kv, n_slots, kd = k_cache.shape
    if kd != head_dim or v_cache.shape[2] != head_dim or n_heads % n_kv:
        raise ValueError(f"prefill_attention: q {tuple(q.shape)}, K {tuple(k_cache.shape)}, V {tuple(v_cache.shape)} do not fit.")
    on_device = isinstance(start, torch.Tensor)
    if not on_device and start + n - lo > n_slots:
        raise ValueError(f"prefill_attention: positions {lo}..{start + n - 1} do not fit {n_slots} slots.")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("prefill_attention: the last dims must be contiguous.")
    scaled = k_scale is not None
    out = torch.empty((n, n_heads * head_dim), dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(head_dim)
    block_m = block or (64 if block_d <= 128 else 32)
    block_n = block or (64 if block_d <= 128 else 32)
    span = span or SPLIT_SPAN
    # The most keys a block can see: the cache's slots (a window's width plus the block for a ring),
    # or the keys up to this chunk's end where the start is known here.
    most = (window + block_m) if window else n_slots
    if not on_device:
        most = min(most, start + n - lo)
    ranges = triton.cdiv(most, span) if switches.enabled("TALLOW_PREFILL_SPLIT") else 1
    split = ranges > 1
    part = ml = out
    if split:
        part = torch.empty((ranges, n, n_heads, block_d), dtype=torch.float32, device=q.device)
        ml = torch.empty((ranges, n, n_heads, 2), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n, block_m), n_heads, ranges)
    _prefill_kernel[grid](
        q, k_cache, v_cache, k_scale if scaled else k_cache, v_scale if scaled else v_cache, out,
        start if on_device else out, part, ml, n, 0 if on_device else start, lo, n_slots, window or 0, span,
        float(scale), float(softcap or 1.0),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        k_scale.stride(0) if scaled else 0, out.stride(0),
        GROUP=n_heads // n_kv, D=head_dim, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n,
        SCALED=scaled, SOFTCAP=softcap is not None, START_ON_DEVICE=on_device, SPLIT=split, num_warps=4, num_stages=2)
    if split:
        _merge_kernel[(triton.cdiv(n, block_m), n_heads)](
            part, ml, out, start if on_device else out, n, 0 if on_device else start, lo, window or 0, span, n_heads,
            out.stride(0), D=head_dim, BLOCK_D=block_d, BLOCK_M=block_m, START_ON_DEVICE=on_device, num_warps=4)
    return out
