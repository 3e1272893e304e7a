"""Ring-buffer KV for sliding-window layers and the int8/fp8/bf16 KV dtypes, on tiny models.

The tiny gemma3 has a window of 8; with max_chunk 4 its sliding-window layers hold rings of
8 + 4 - 1 = 11 slots, so a 40-token prompt wraps them three times. The reference is the same
model with every layer holding the whole context (ring=False, what TALLOW_KV_RING=0 gives).
The real-model test against llama.cpp is tests/test_kv_long_context.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_graph_step import decode_step
from tiny_models import write_tiny_model

from tallow.gguf_file import GGUFFile
from tallow.memory import budget
from tallow.errors import UsageError
from tallow.memory.kv_format import KV_FORMATS, USER_FORMATS, kv_format
from tallow.memory.kv_pool import KVPool, kv_dtype_name
from tallow.memory.kv_store import KVStore, model_fingerprint
from tallow.models import build_model
from tallow.spec import spec_from_gguf

IDS = [int(t) for t in np.random.RandomState(7).randint(0, 256, size=40)]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path = write_tiny_model("gemma3", tmp_path_factory.mktemp("ring") / "gemma3.gguf")
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    return spec, build_model(gf, spec), model_fingerprint(gf.header_bytes())


def _run(model, kv, ids, chunk):
    """Prefill in chunks of `chunk` (all logits), then decode 6 tokens one at a time."""
    logits = [model.forward(ids[s : s + chunk], s, kv, all_logits=True) for s in range(0, len(ids) - 6, chunk)]
    logits += [model.forward([t], len(ids) - 6 + i, kv) for i, t in enumerate(ids[-6:])]
    return torch.cat(logits)


def test_ring_layout_from_the_spec(gemma) -> None:
    spec, _, _ = gemma
    kv = KVPool(spec, 64, max_chunk=4)
    windows = [layer.sliding_window for layer in spec.layers]
    assert any(windows) and not all(windows)
    assert kv.caps == [11 if w else 64 for w in windows]
    assert KVPool(spec, 64, max_chunk=4, ring=False).caps == [64] * len(windows)
    # The plan counts exactly what the pool allocates, for every dtype.
    for name in ("f16", "bf16", "int8", "fp8"):
        pool = KVPool(spec, 64, name, max_chunk=4)
        assert pool.nbytes == budget.kv_bytes(spec, 64, name, prefill_chunk=4)
        assert KVPool(spec, 64, name, ring=False).nbytes == budget.kv_bytes(spec, 64, name, ring=False)


@pytest.mark.parametrize("chunk", [4, 3, 1])
def test_ring_layers_give_the_logits_of_full_layers(gemma, chunk) -> None:
    """Past the window edge and across three laps of the ring, prefill in chunks and decode."""
    spec, model, _ = gemma
    ring = _run(model, KVPool(spec, 64, torch.float32, max_chunk=4), IDS, chunk)
    full = _run(model, KVPool(spec, 64, torch.float32, ring=False), IDS, chunk)
    # Decode and positions inside the first window are bit-identical. A chunk past the window
    # edge gives SDPA only the window's keys instead of all keys with the old ones masked: a
    # different summation order (~1e-5), which gemma3's fp16-rounded GELU amplifies to ~2e-3 on
    # logits of magnitude ~70 (the same bound as the tiny gemma3 against llama.cpp).
    assert torch.equal(ring[:8], full[:8])
    torch.testing.assert_close(ring, full, rtol=0, atol=5e-3)
    if chunk == 1:
        assert torch.equal(ring, full)


def test_f16_ring_decode_steps_are_the_full_layouts_bit_for_bit(gemma) -> None:
    """With an f16 cache the CPU decode step reads a ring in C in position order (layers.decode_attention),
    as it reads the full layout: one token at a time, the layout never changes a logit."""
    spec, model, _ = gemma
    ring_kv, full_kv = KVPool(spec, 64, "f16", max_chunk=4), KVPool(spec, 64, "f16", ring=False)
    assert ring_kv.has_rings
    assert torch.equal(_run(model, ring_kv, IDS, 1), _run(model, full_kv, IDS, 1))


def test_a_long_forward_is_split_into_chunks_the_ring_holds(gemma) -> None:
    spec, model, _ = gemma
    ring = model.forward(IDS, 0, KVPool(spec, 64, torch.float32, max_chunk=4), all_logits=True)
    full = model.forward(IDS, 0, KVPool(spec, 64, torch.float32, ring=False), all_logits=True)
    torch.testing.assert_close(ring, full, rtol=0, atol=5e-3)


@pytest.mark.parametrize("kv_dtype", ["f16", "int8", "fp8"])
def test_ring_decode_step_bound_to_device_position(gemma, kv_dtype) -> None:
    """The CUDA-graph step (store_at at position % ring, attention over the window) equals eager."""
    spec, model, _ = gemma
    eager_kv, step_kv = KVPool(spec, 64, kv_dtype, max_chunk=4), KVPool(spec, 64, kv_dtype, max_chunk=4)
    eager = torch.cat([model.forward([t], i, eager_kv) for i, t in enumerate(IDS)])
    steps = torch.cat([
        model.run(decode_step(t, i), step_kv)
        for i, t in enumerate(IDS)
    ])
    torch.testing.assert_close(steps, eager, rtol=0, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(step_kv.k, eager_kv.k))


def test_truncation_into_an_overwritten_ring_is_refused(gemma) -> None:
    spec, model, _ = gemma
    kv = KVPool(spec, 64, max_chunk=4)
    model.forward(IDS[:30], 0, kv)
    # Position 28 needs keys 21..27; the ring (11 slots) holds 19..29: reusable.
    assert kv.reusable(28) == 28
    # Position 10 needs keys 3..9, long overwritten: nothing is reusable, and truncating empties.
    assert kv.reusable(10) == 0
    kv.truncate(10)
    assert kv.tokens == []
    # Below the window everything is still there only if nothing was overwritten yet.
    kv2 = KVPool(spec, 64, max_chunk=4)
    model.forward(IDS[:10], 0, kv2)
    assert kv2.reusable(5) == 5


def test_engine_prefix_reuse_on_rings_matches_a_fresh_pool(gemma) -> None:
    """Request 2 shares a prefix whose window the ring has lost (reuse is refused) and request 3
    one that it still holds (reused): both give the logits a fresh pool gives."""
    from tallow.engine.engine import Engine, GenerationStats

    spec, model, _ = gemma
    engine = Engine(model, 64, prefill_chunk=4)
    engine.prefill(IDS[:36], GenerationStats())
    stats = GenerationStats()
    got = engine.prefill(IDS[:12] + IDS[30:34], stats)  # shares 12 tokens, long overwritten
    assert stats.reused_tokens == 0
    fresh = Engine(model, 64, prefill_chunk=4).prefill(IDS[:12] + IDS[30:34], GenerationStats())
    torch.testing.assert_close(got, fresh, rtol=0, atol=1e-5)
    engine.prefill(IDS[:30], GenerationStats())
    stats = GenerationStats()
    got = engine.prefill(IDS[:28] + IDS[:5], stats)
    assert stats.reused_tokens == 28
    fresh = Engine(model, 64, prefill_chunk=4).prefill(IDS[:28] + IDS[:5], GenerationStats())
    torch.testing.assert_close(got, fresh, rtol=0, atol=5e-3)  # other chunk boundaries: summation order


@pytest.mark.parametrize("kv_dtype", ["f16", "int8", "fp8"])
def test_ring_state_round_trips_through_the_kv_store(gemma, tmp_path, kv_dtype) -> None:
    """Saved after 30 tokens (the rings hold only their last 11 positions), hydrated into a fresh
    pool: decoding on gives exactly the logits of the pool that never left memory, and the
    hydrated pool refuses to reuse a prefix whose window it does not hold."""
    spec, model, fp = gemma
    store = KVStore(spec, fp, tmp_path)
    kv = KVPool(spec, 64, kv_dtype, max_chunk=4)
    model.forward(IDS[:30], 0, kv)
    store.save("c", kv)
    fresh = KVPool(spec, 64, kv_dtype, max_chunk=4)
    assert store.load("c", fresh) == 30
    a = torch.cat([model.forward([t], 30 + i, kv) for i, t in enumerate(IDS[30:36])])
    b = torch.cat([model.forward([t], 30 + i, fresh) for i, t in enumerate(IDS[30:36])])
    assert torch.equal(a, b)
    assert fresh.reusable(20) == 0 and fresh.reusable(35) == 35
    # A pool of another layout (no rings) or dtype does not take the file.
    with pytest.warns(UserWarning):
        assert store.load("c", KVPool(spec, 64, kv_dtype, ring=False)) == 0
    other = "f16" if kv_dtype != "f16" else "int8"
    with pytest.warns(UserWarning):
        assert store.load("c", KVPool(spec, 64, other, max_chunk=4)) == 0


# -- KV dtypes --------------------------------------------------------------------------------

def test_the_kv_formats_match_their_tensors_and_the_planner() -> None:
    """One table (memory/kv_format.py): its bytes are the pool's tensors, its aliases the planner's."""
    for fmt in KV_FORMATS:
        assert torch.empty(0, dtype=fmt.torch_dtype).element_size() == fmt.element_bytes
        assert fmt.scaled == (fmt.scale_bytes == 4) == (fmt.qmax is not None)
        for alias in (fmt.name, *fmt.aliases, fmt.name.upper()):
            assert kv_dtype_name(alias) == fmt.name
            if fmt.name in USER_FORMATS:
                assert budget.kv_dtype_arg(alias) == fmt.name
            else:  # f32: tests only
                with pytest.raises(UsageError, match="--kv-dtype must be one of f16, bf16, int8, fp8"):
                    budget.kv_dtype_arg(alias)
    assert kv_format(torch.bfloat16).name == "bf16" and kv_format(None).name == "f16"
    with pytest.raises(ValueError, match="--kv-dtype must be one of f16, bf16, int8, fp8, not 'int4'."):
        kv_dtype_name("int4")
    with pytest.raises(ValueError, match="not supported"):
        kv_format(torch.int8)  # codes without their scales name no format


@pytest.mark.parametrize("kv_dtype,bound", [("bf16", 2 ** -8), ("int8", 1 / 127), ("fp8", 2 ** -3)])
def test_quantized_storage_round_trip_error(gemma, kv_dtype, bound) -> None:
    """Per position and head, |dequantized - x| <= absmax * bound (int8: half a step of absmax/127,
    fp8 e4m3: 3 mantissa bits; bf16: 8 bits relative)."""
    spec, _, _ = gemma
    kv = KVPool(spec, 16, kv_dtype)
    g = torch.Generator().manual_seed(0)
    heads = spec.layers[0].n_kv_heads
    k = torch.randn(5, heads, spec.head_dim, generator=g) * torch.tensor([0.01, 1.0, 30.0, 1e-3, 5.0]).view(5, 1, 1)
    v = torch.randn(5, heads, spec.v_head_dim, generator=g)
    kv.store(0, 3, k, v)
    got_k, got_v = kv.view(0, 3, 8)
    for got, want in ((got_k, k.transpose(0, 1)), (got_v, v.transpose(0, 1))):
        amax = want.abs().amax(-1, keepdim=True)
        err = (got - want).abs()
        assert (err <= amax * bound + 1e-12).all(), (err / amax).max()


@pytest.mark.parametrize("kv_dtype", ["bf16", "int8", "fp8"])
def test_quantized_kv_logits_stay_close_to_f16(gemma, kv_dtype) -> None:
    """Whole tiny model, rings included: the same computation with rounded keys and values."""
    spec, model, _ = gemma
    ref = _run(model, KVPool(spec, 64, "f16", max_chunk=4), IDS, 4)
    got = _run(model, KVPool(spec, 64, kv_dtype, max_chunk=4), IDS, 4)
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < {"bf16": 2e-2, "int8": 2e-2, "fp8": 8e-2}[kv_dtype], rel
