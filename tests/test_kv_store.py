"""Persistent KV per conversation: round trip, atomic saves, refusal of foreign/corrupt files, LRU."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from model_paths import require_model
from tiny_models import write_tiny_model

from tallow.gguf_file import GGUFFile
from tallow.memory.kv_pool import KVPool
from tallow.memory.kv_store import KVStore, KVStoreWarning, model_fingerprint
from tallow.spec import spec_from_gguf




@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model's spec and fingerprint: the store never needs the weights."""
    path = write_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    with GGUFFile(path) as gf:
        return spec_from_gguf(gf), model_fingerprint(gf.header_bytes())


def _filled_pool(spec, n_ctx: int = 64, n_tokens: int = 20, seed: int = 0) -> KVPool:
    g = torch.Generator().manual_seed(seed)
    kv = KVPool(spec, n_ctx)
    for t in kv.k + kv.v:
        t.copy_(torch.randn(t.shape, generator=g).half())
    kv.tokens.extend(range(100 + seed, 100 + seed + n_tokens))
    return kv


def _same_used(a: KVPool, b: KVPool) -> bool:
    n = len(a.tokens)
    return a.tokens == b.tokens and all(torch.equal(x[:, :n], y[:, :n]) for x, y in zip(a.k + a.v, b.k + b.v))


def test_save_and_load_round_trip(tiny, tmp_path):
    spec, fp = tiny
    store = KVStore(spec, fp, tmp_path)
    kv = _filled_pool(spec)
    path = store.save("chat-1", kv)
    assert path is not None and path.parent == tmp_path
    # Only the used positions are stored.
    per_token = sum(2 * layer.n_kv_heads * spec.head_dim * 2 for layer in spec.layers) + 4
    assert path.stat().st_size < 20 * per_token + 2048
    fresh = KVPool(spec, 64)
    assert store.load("chat-1", fresh) == 20
    assert _same_used(kv, fresh)
    assert store.peek_tokens("chat-1") == kv.tokens
    assert store.load("unknown", KVPool(spec, 64)) == 0


def test_gemma4_round_trip_stores_shared_layers_once(tmp_path):
    """Gemma 4's shared-KV layers read an earlier layer's cache: the file holds the 5 cached
    layers (per-layer head sizes) and loading restores what the shared layers read."""
    with GGUFFile(write_tiny_model("gemma4", tmp_path / "g4.gguf")) as gf:
        spec, fp = spec_from_gguf(gf), model_fingerprint(gf.header_bytes())
    store = KVStore(spec, fp, tmp_path)
    kv = _filled_pool(spec)
    path = store.save("g4", kv)
    owned = sum(2 * layer.n_kv_heads * layer.head_dim * 2 for layer in spec.layers if layer.owns_kv)
    assert 20 * (owned + 4) <= path.stat().st_size < 20 * (owned + 4) + 2048
    fresh = KVPool(spec, 64)
    assert store.load("g4", fresh) == 20
    assert _same_used(kv, fresh)
    assert fresh.k[6] is fresh.k[3] and torch.equal(fresh.k[6][:, :20], kv.k[3][:, :20])


def test_kill_mid_save_leaves_the_old_file(tiny, tmp_path, monkeypatch):
    spec, fp = tiny
    store = KVStore(spec, fp, tmp_path)
    old = _filled_pool(spec, n_tokens=10, seed=1)
    store.save("chat", old)
    calls = {"n": 0}
    original = KVStore._write_layer

    def dying_write(put, kv, layer, *span):
        calls["n"] += 1
        if calls["n"] > 1:
            raise KeyboardInterrupt("killed mid-save")  # what a signal would do to the writer
        original(put, kv, layer, *span)

    monkeypatch.setattr(KVStore, "_write_layer", staticmethod(dying_write))
    with pytest.raises(KeyboardInterrupt):
        store.save("chat", _filled_pool(spec, n_tokens=30, seed=2))
    monkeypatch.undo()
    # A kill -9 would also leave the temporary file behind: it is never read.
    (tmp_path / f".{store.path('chat').name}.999.tmp").write_bytes(b"TALLOWKV partial")
    fresh = KVPool(spec, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.load("chat", fresh) == 10
    assert _same_used(old, fresh)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupt_or_truncated_file_is_ignored_with_a_warning(tiny, tmp_path, damage):
    spec, fp = tiny
    store = KVStore(spec, fp, tmp_path)
    path = store.save("chat", _filled_pool(spec))
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x40
    else:
        data = bytearray(b"not a cache file at all")
    path.write_bytes(bytes(data))
    kv = _filled_pool(spec, seed=5)
    with pytest.warns(KVStoreWarning):
        assert store.load("chat", kv) == 0
    assert kv.tokens == []  # nothing it holds is reusable


def test_file_from_another_model_is_refused(tiny, tmp_path):
    spec, fp = tiny
    KVStore(spec, "0" * 64, tmp_path).save("chat", _filled_pool(spec))
    store = KVStore(spec, fp, tmp_path)
    kv = KVPool(spec, 64)
    assert store.peek_tokens("chat") == []
    with pytest.warns(KVStoreWarning, match="another model"):
        assert store.load("chat", kv) == 0
    assert kv.tokens == []


def test_lru_bound_evicts_the_least_recently_used(tiny, tmp_path):
    spec, fp = tiny
    size = KVStore(spec, fp, tmp_path / "probe").save("x", _filled_pool(spec)).stat().st_size
    store = KVStore(spec, fp, tmp_path / "kv", max_bytes=int(2.5 * size))
    for i, name in enumerate(("a", "b")):
        store.save(name, _filled_pool(spec, seed=i))
        os.utime(store.path(name), (1000 + i, 1000 + i))
    assert store.load("a", KVPool(spec, 64)) == 20  # touching "a" makes "b" the oldest
    store.save("c", _filled_pool(spec, seed=3))
    assert store.path("a").exists() and store.path("c").exists()
    assert not store.path("b").exists()


def test_persistent_kv_round_trip_gives_identical_output(tmp_path, monkeypatch):
    """Turn 2 after a 'restart' (empty pool, new store object) hydrates turn 1's KV from disk
    and answers exactly as a run without any cache."""
    import tallow

    llm = tallow.LLM(require_model("smollm2-135m"), ctx=512)
    llm.engine.kv_store_dir = str(tmp_path)
    # Long enough to be reusable: the last 64 prompt tokens are always prefilled again (prefill_plan.py).
    system = {"role": "system", "content": "You are a terse assistant who answers with one short sentence. " * 6}
    turn1 = [system, {"role": "user", "content": "Name a primary color."}]
    first = llm.chat(turn1, max_tokens=12, conversation_id="conv-1")
    files = list(tmp_path.glob("*.kv"))
    assert len(files) == 1
    turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Name another one."}]

    llm.engine.reset()  # a restart: nothing resident
    llm.engine._kv_store = None
    warm = llm.chat(turn2, max_tokens=12, conversation_id="conv-1")
    assert warm.stats.reused_from_disk > 0 and warm.stats.reused_tokens == warm.stats.reused_from_disk

    monkeypatch.setenv("TALLOW_PREFIX_CACHE", "0")
    monkeypatch.setenv("TALLOW_PERSIST_KV", "0")
    llm.engine.reset()
    cold = llm.chat(turn2, max_tokens=12, conversation_id="conv-1")
    assert cold.stats.reused_tokens == 0
    assert warm.tokens == cold.tokens and warm.text == cold.text
    assert list(tmp_path.glob("*.kv")) == files  # TALLOW_PERSIST_KV=0 wrote nothing new
