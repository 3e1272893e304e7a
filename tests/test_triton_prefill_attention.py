"""Flash prefill attention (kernels/triton/prefill_attention.py) through Triton's interpreter
against the torch reference: plain f16 cache with GQA and a reused prefix, a sliding-window
ring that has wrapped, int8 codes with scales, soft-cap, head_dim 256.

Tolerance: q and the probabilities are rounded to fp16 for the two products (as the decode
kernel and llama.cpp's flash attention do), so ~1e-3 relative; a wrong mask, slot or head
gives O(1).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import tallow.kernels.triton  # noqa: E402,F401
from tallow.kernels.triton.prefill_attention import prefill_attention  # noqa: E402


def reference(q, keys, values, start, lo, scale, window, softcap):
    """keys/values (n_kv, n_keys, d) float32 for positions lo.. in order."""
    n, nh, d = q.shape
    group = nh // keys.shape[0]
    k = keys.repeat_interleave(group, 0)
    v = values.repeat_interleave(group, 0)
    s = torch.einsum("nhd,htd->hnt", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    qp = torch.arange(start, start + n)[:, None]
    kp = torch.arange(lo, lo + keys.shape[1])[None, :]
    vis = kp <= qp
    if window:
        vis &= qp - kp < window
    s = s.masked_fill(~vis, float("-inf"))
    return torch.einsum("hnt,htd->nhd", s.softmax(-1), v).reshape(n, -1)


def _fill(n_kv, n_slots, d, positions, g, dtype=torch.float16):
    """A cache whose slot p % n_slots holds position p's key, plus those keys in order (float32)."""
    k = torch.zeros(n_kv, n_slots, d, dtype=dtype)
    keys = torch.randn(n_kv, len(positions), d, generator=g)
    for i, p in enumerate(positions):
        k[:, p % n_slots] = keys[:, i].to(dtype)
    return k, k[:, [p % n_slots for p in positions]].float()


def _case(n, start, nh, nkv, d, window, n_slots):
    """A chunk of n queries at start after the keys a window (or the whole prefix) leaves in the cache:
    (lo, q, the K cache, its keys in order, the V cache, its values)."""
    g = torch.Generator().manual_seed(n + start)
    lo = max(0, start - window + 1) if window else 0
    positions = list(range(lo, start + n))
    k_cache, keys = _fill(nkv, n_slots, d, positions, g)
    v_cache, values = _fill(nkv, n_slots, d, positions, g)
    return lo, torch.randn(n, nh, d, generator=g), k_cache, keys, v_cache, values


@pytest.mark.parametrize("n,start,nh,nkv,d,window,n_slots,softcap", [
    (70, 0, 4, 2, 64, None, 96, None),     # fresh prompt, GQA, a partial last block
    (33, 40, 6, 2, 64, None, 128, None),   # a chunk after a reused prefix
    (50, 90, 2, 1, 64, 16, 80, None),      # sliding window on a ring that has wrapped
    (20, 10, 2, 1, 256, None, 64, 30.0),   # head_dim 256, soft-cap
])
def test_prefill_attention_matches_reference(n, start, nh, nkv, d, window, n_slots, softcap):
    lo, q, k_cache, keys, v_cache, values = _case(n, start, nh, nkv, d, window, n_slots)
    scale = d ** -0.5
    got = prefill_attention(q, k_cache, v_cache, start, lo, scale, window, softcap)
    want = reference(q, keys, values, start, lo, scale, window, softcap)
    assert float((got - want).abs().max()) < 1e-2 * float(want.abs().max())


def test_prefill_attention_reads_int8_codes_with_scales():
    g = torch.Generator().manual_seed(5)
    n, nh, nkv, d, n_slots = 24, 4, 2, 64, 32
    x_k = torch.randn(nkv, n_slots, d, generator=g)
    x_v = torch.randn(nkv, n_slots, d, generator=g)
    ks, vs = x_k.abs().amax(-1) / 127, x_v.abs().amax(-1) / 127
    k8 = (x_k / ks[..., None]).round().to(torch.int8)
    v8 = (x_v / vs[..., None]).round().to(torch.int8)
    q = torch.randn(n, nh, d, generator=g)
    got = prefill_attention(q, k8, v8, 0, 0, 0.125, k_scale=ks, v_scale=vs)
    want = reference(q, (k8.float() * ks[..., None])[:, :n], (v8.float() * vs[..., None])[:, :n], 0, 0, 0.125, None, None)
    assert float((got - want).abs().max()) < 1e-2 * float(want.abs().max())


def test_prefill_attention_start_on_device_equals_host_start():
    g = torch.Generator().manual_seed(9)
    positions = list(range(0, 40))
    k_cache, _ = _fill(2, 48, 64, positions, g)
    v_cache, _ = _fill(2, 48, 64, positions, g)
    q = torch.randn(24, 4, 64, generator=g)
    host = prefill_attention(q, k_cache, v_cache, 16, 0, 0.125, 8)
    device = prefill_attention(q, k_cache, v_cache, torch.tensor([16]), 0, 0.125, 8)
    assert torch.equal(host, device)


@pytest.mark.parametrize("n,start,nh,nkv,d,window,n_slots,on_device", [
    (40, 100, 4, 2, 64, None, 160, False),  # a chunk after a long prefix: four 32-key ranges and a partial one
    (70, 0, 6, 2, 64, None, 96, True),      # a fresh prompt, the start on the device (ranges fixed by the slots)
    (30, 150, 2, 1, 64, 48, 80, False),     # a sliding window on a wrapped ring: the window's width split
])
def test_split_prefill_attention_is_the_one_pass_kernel(monkeypatch, n, start, nh, nkv, d, window, n_slots, on_device):
    """TALLOW_PREFILL_SPLIT: a block's keys in 32-key ranges, merged, against the one-pass kernel (the
    probabilities are rounded to fp16 against each range's own max, so within ~1e-3) and the reference."""
    lo, q, k_cache, keys, v_cache, values = _case(n, start, nh, nkv, d, window, n_slots)
    s = torch.tensor([start]) if on_device else start
    split = prefill_attention(q, k_cache, v_cache, s, lo, d ** -0.5, window, span=32, block=16)
    monkeypatch.setenv("TALLOW_PREFILL_SPLIT", "0")
    one = prefill_attention(q, k_cache, v_cache, s, lo, d ** -0.5, window, span=32, block=16)
    want = reference(q, keys, values, start, lo, d ** -0.5, window, None)
    assert float((split - one).abs().max()) < 2e-3 * float(one.abs().max())
    assert float((split - want).abs().max()) < 1e-2 * float(want.abs().max())


def test_split_prefill_attention_leaves_short_blocks_to_the_one_pass_loop(monkeypatch):
    """With the start on the device the ranges are fixed by the cache's slots; a block whose keys fit
    one range writes its output by the one-pass loop itself: the same bits as without the split."""
    g = torch.Generator().manual_seed(3)
    k_cache, _ = _fill(2, 128, 64, list(range(24)), g)
    v_cache, _ = _fill(2, 128, 64, list(range(24)), g)
    q = torch.randn(24, 4, 64, generator=g)
    split = prefill_attention(q, k_cache, v_cache, torch.tensor([0]), 0, 0.125, span=32, block=16)
    monkeypatch.setenv("TALLOW_PREFILL_SPLIT", "0")
    assert torch.equal(split, prefill_attention(q, k_cache, v_cache, torch.tensor([0]), 0, 0.125, span=32, block=16))
