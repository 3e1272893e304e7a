"""Split-K flash-decoding attention (tallow/kernels/triton/decode_attention.py) through Triton's
interpreter, against an fp32 torch softmax attention.

Tolerance: the kernel rounds q and the softmax probabilities to fp16 for its two tensor-core
products (fp32 accumulation), so the output carries ~2^-11 relative rounding per term: we
demand 2e-3 relative to the output norm (measured ~3e-4); an off-by-one in the mask, a lost
split or a wrong GQA head mapping gives > 1e-1.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

import tallow.kernels.triton  # noqa: E402,F401  (applies the interpreter shim)
from tallow.kernels.triton.decode_attention import (decode_attention, decode_attention_reference,  # noqa: E402
                                                    default_splits, make_scratch)

CASES = [
    # n_heads, n_kv_heads, head_dim, n_ctx, seq_len, window, n_splits
    (4, 2, 64, 256, 1, 0, 4),  # depth 0: one key, most splits empty
    (6, 2, 64, 256, 200, 0, 4),  # GQA group of 3 (padded to 16 rows)
    (8, 2, 128, 300, 257, 0, 8),  # a partial last tile
    (4, 1, 64, 256, 200, 50, 4),  # sliding window: only the last 50 keys
    (3, 3, 32, 64, 40, 0, 16),  # no GQA, more splits than tiles
]


@pytest.mark.parametrize("case", CASES)
def test_decode_attention_matches_reference(case: tuple[int, ...]) -> None:
    n_heads, n_kv, d, n_ctx, seq_len, window, n_splits = case
    g = torch.Generator().manual_seed(sum(case))
    q = torch.randn(n_heads, d, generator=g)
    k = torch.randn(n_kv, n_ctx, d, generator=g).half()
    v = torch.randn(n_kv, n_ctx, d, generator=g).half()
    out = torch.full((n_heads, d), float("nan"))
    decode_attention(q, k, v, torch.tensor([seq_len], dtype=torch.int32), scale=d ** -0.5, window=window,
                     n_splits=n_splits, out=out, block_t=32)
    ref = decode_attention_reference(q, k, v, seq_len, d ** -0.5, window)
    assert torch.isfinite(out).all()
    assert (out - ref).norm() / ref.norm() < 2e-3


def test_same_launch_follows_the_device_length() -> None:
    """One set of buffers and arguments (what a CUDA graph replays), the length bumped in place."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 64, generator=g)
    k = torch.randn(2, 128, 64, generator=g).half()
    v = torch.randn(2, 128, 64, generator=g).half()
    seq_len = torch.tensor([5], dtype=torch.int32)
    scratch, out = make_scratch(4, 4, 64, "cpu"), torch.empty(4, 64)
    for n in (5, 6, 97):
        seq_len.fill_(n)
        decode_attention(q, k, v, seq_len, 0.125, n_splits=4, out=out, scratch=scratch, block_t=32)
        ref = decode_attention_reference(q, k, v, n, 0.125)
        assert (out - ref).norm() / ref.norm() < 2e-3


def test_default_splits_fill_the_gpu() -> None:
    assert default_splits(8, 40960, n_sms=132) == 128  # qwen3-4b: 8 x 128 = 1024 programs
    assert default_splits(2, 40960, n_sms=132) == 128  # qwen2.5-1.5b: capped at 128
    assert default_splits(8, 128, n_sms=132) == 2  # never more splits than 64-key tiles


def test_bad_shapes_raise() -> None:
    q = torch.randn(5, 64)
    k = torch.randn(2, 16, 64).half()
    with pytest.raises(ValueError):
        decode_attention(q, k, k, torch.tensor([4], dtype=torch.int32), 0.1)


def _quantize(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and per-(head, slot) scales as KVPool stores them."""
    qmax = 127.0 if kind == "int8" else 448.0
    scale = x.abs().amax(-1) / qmax
    y = x / scale.unsqueeze(-1)
    return (y.round().to(torch.int8) if kind == "int8" else y.to(torch.float8_e4m3fn)), scale


RING_CASES = [
    # n_heads, n_kv_heads, head_dim, n_slots, seq_len, window, n_splits, kind
    (4, 2, 64, 96, 300, 50, 4, "f16"),  # a ring: positions 250..299 in slots p % 96 (wrapped)
    (4, 1, 64, 96, 96, 64, 4, "f16"),  # the last slot of the first lap
    (8, 2, 128, 80, 1000, 64, 8, "int8"),  # ring and int8 codes with their scales
    (4, 2, 64, 128, 100, 0, 4, "int8"),  # plain int8 cache
    (6, 2, 64, 96, 333, 40, 4, "fp8"),  # ring and fp8 e4m3
]


@pytest.mark.parametrize("case", RING_CASES)
def test_ring_and_quantized_caches_match_reference(case) -> None:
    """Slot = position % n_slots inside the kernel; int8/fp8 tiles dequantized with their scales.
    The reference reads the same slots in position order and multiplies codes by scales in fp32;
    a wrong slot (p instead of p % n) reads zeros or stale keys: error > 1e-1."""
    n_heads, n_kv, d, n_slots, seq_len, window, n_splits, kind = case
    g = torch.Generator().manual_seed(sum(case[:-1]))
    q = torch.randn(n_heads, d, generator=g)
    k = torch.randn(n_kv, n_slots, d, generator=g)
    v = torch.randn(n_kv, n_slots, d, generator=g)
    if kind == "f16":
        k, v, ks, vs = k.half(), v.half(), None, None
    else:
        (k, ks), (v, vs) = _quantize(k, kind), _quantize(v, kind)
    out = decode_attention(q, k, v, torch.tensor([seq_len], dtype=torch.int32), scale=d ** -0.5, window=window,
                           n_splits=n_splits, block_t=32, k_scale=ks, v_scale=vs)
    ref = decode_attention_reference(q, k, v, seq_len, d ** -0.5, window, ks, vs)
    assert (out - ref).norm() / ref.norm() < 2e-3


def test_scaled_cache_needs_its_scales() -> None:
    q = torch.randn(4, 64)
    k = torch.zeros(2, 16, 64, dtype=torch.int8)
    with pytest.raises(ValueError):
        decode_attention(q, k, k, torch.tensor([4], dtype=torch.int32), 0.1)


@pytest.mark.parametrize("window,n_slots", [(0, 96), (24, 40)])
def test_query_rows_equal_one_token_calls(window: int, n_slots: int) -> None:
    """R consecutive query tokens in one launch (speculative verification): row r is bit for bit
    a one-token call at length seq_len + r, on a plain cache and on a sliding-window ring."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(5, 8, 64, generator=g)
    k = torch.randn(2, n_slots, 64, generator=g).half()
    v = torch.randn(2, n_slots, 64, generator=g).half()
    rows = decode_attention(q, k, v, torch.tensor([37], dtype=torch.int32), 0.125, window, n_splits=4, block_t=32)
    singles = [decode_attention(q[r], k, v, torch.tensor([37 + r], dtype=torch.int32), 0.125, window, n_splits=4,
                                block_t=32) for r in range(5)]
    assert rows.shape == (5, 8, 64)
    assert torch.equal(rows, torch.stack(singles))
    ref = decode_attention_reference(q[4], k, v, 41, 0.125, window)
    assert (rows[4] - ref).norm() / ref.norm() < 2e-3


@pytest.mark.parametrize("seq_len", [1, 40, 200])
def test_empty_splits_skipped_give_the_same_bits(seq_len: int, monkeypatch) -> None:
    """TALLOW_ATTN_SKIP_EMPTY: splits a short span leaves empty write only their max and sum, and
    the merge reads their partial rows as 0 (scratch poisoned with NaN first, so an unwritten row
    that were read would show): the output equals the every-row form bit for bit."""
    g = torch.Generator().manual_seed(seq_len)
    q = torch.randn(6, 64, generator=g)
    k = torch.randn(2, 256, 64, generator=g).half()
    v = torch.randn(2, 256, 64, generator=g).half()
    outs = []
    for skip in ("1", "0"):
        monkeypatch.setenv("TALLOW_ATTN_SKIP_EMPTY", skip)
        scratch = tuple(t.fill_(float("nan")) for t in make_scratch(6, 16, 64, "cpu"))
        outs.append(decode_attention(q, k, v, torch.tensor([seq_len], dtype=torch.int32), 0.125, n_splits=16,
                                     scratch=scratch, block_t=32))
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("seq_len, window, rows", [(1, 0, 1), (100, 0, 3), (200, 50, 1), (200, 0, 2)])
def test_the_live_merge_is_a_small_launchs_merge(seq_len: int, window: int, rows: int, monkeypatch) -> None:
    """TALLOW_ATTN_LIVE_MERGE (its tile made 4 rows here): while the splits with keys fit the tile, a
    16-split launch merges them as a 4-split launch does (the same bits: a small cache's); past it
    (200 keys: 7 live splits) the merge is the full tile's as without the switch (the same bits)."""
    from tallow.kernels.triton import decode_attention as module
    monkeypatch.setattr(module, "LIVE_ROWS", 4)
    g = torch.Generator().manual_seed(seq_len + rows)
    q = torch.randn(rows, 6, 64, generator=g)
    k = torch.randn(2, 256, 64, generator=g).half()
    v = torch.randn(2, 256, 64, generator=g).half()
    length = torch.tensor([seq_len], dtype=torch.int32)

    def run(live: str, n_splits: int) -> torch.Tensor:
        monkeypatch.setenv("TALLOW_ATTN_LIVE_MERGE", live)
        scratch = tuple(t.fill_(float("nan")) for t in make_scratch(rows * 6, n_splits, 64, "cpu"))
        return decode_attention(q, k, v, length, 0.125, window, n_splits=n_splits, scratch=scratch, block_t=32)

    live, off = run("1", 16), run("0", 16)
    assert torch.isfinite(live).all()
    if seq_len + rows - 1 - (max(0, seq_len + rows - 1 - window) if window else 0) <= 4 * 32:
        assert torch.equal(live, run("0", 4))
        assert (live - off).abs().max() <= 1e-6 * off.abs().max()
    else:
        assert torch.equal(live, off)
    ref = decode_attention_reference(q[-1], k, v, seq_len + rows - 1, 0.125, window)
    assert (live[-1] - ref).norm() / ref.norm() < 2e-3
