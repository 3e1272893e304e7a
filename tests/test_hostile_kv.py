"""KV files with valid JSON but wrong header types are ignored with the documented warning
(they were a 500 on every later turn, and never replaced), and the next save replaces them."""

from __future__ import annotations

import json
import struct
import warnings

import pytest

from test_kv_store import _filled_pool, tiny  # noqa: F401 (the module fixture)
from tallow.memory.kv_pool import KVPool
from tallow.memory.kv_store import MAGIC, VERSION, KVStore, KVStoreWarning


def rewrite_header(path, change):
    data = path.read_bytes()
    (header_len,) = struct.unpack("<I", data[12:16])
    header = json.loads(data[16 : 16 + header_len])
    new = json.dumps(change(header)).encode()
    path.write_bytes(MAGIC + struct.pack("<II", VERSION, len(new)) + new + data[16 + header_len :])


@pytest.mark.parametrize("change", [
    lambda h: {**h, "lo": None},
    lambda h: {**h, "lo": ["a"] * len(h["lo"])},
    lambda h: {**h, "n_tokens": "20"},
    lambda h: {**h, "n_tokens": None},
    lambda h: {**h, "layout": 7},
    lambda h: {**h, "layout": [[1, 2]] * len(h["layout"])},
    lambda h: {**h, "fingerprint": None},
    lambda h: [h],
    lambda h: "header",
    lambda h: None,
], ids=["lo-null", "lo-strings", "n-string", "n-null", "layout-int", "layout-short", "fp-null", "list", "string", "null"])
def test_wrong_header_types_are_ignored_with_a_warning_and_replaced(tiny, tmp_path, change):  # noqa: F811
    spec, fp = tiny
    store = KVStore(spec, fp, tmp_path)
    path = store.save("conv", _filled_pool(spec))
    rewrite_header(path, change)
    with pytest.warns(KVStoreWarning, match="ignoring the KV cache file"):
        assert store.peek_tokens("conv") == []
    with pytest.warns(KVStoreWarning, match="ignoring the KV cache file"):
        assert store.load("conv", KVPool(spec, 64)) == 0
    store.save("conv", _filled_pool(spec, seed=1))  # the next turn's save replaces it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.load("conv", KVPool(spec, 64)) == 20


def test_huge_header_length_is_refused_without_reading_it(tiny, tmp_path):  # noqa: F811
    spec, fp = tiny
    store = KVStore(spec, fp, tmp_path)
    path = store.save("conv", _filled_pool(spec))
    data = bytearray(path.read_bytes())
    data[12:16] = struct.pack("<I", 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    with pytest.warns(KVStoreWarning, match="header claims"):
        assert store.load("conv", KVPool(spec, 64)) == 0


def test_long_ids_are_cut_in_the_header_and_any_string_is_a_safe_name(tiny, tmp_path):  # noqa: F811
    spec, fp = tiny
    store = KVStore(spec, fp, tmp_path)
    path = store.save("x" * 100_000, _filled_pool(spec))
    assert path.stat().st_size < 100_000 and path.parent == tmp_path
    for cid in ("../../etc/passwd", "/abs/path", "a\x00b", "\ud800"):
        assert store.path(cid).parent == tmp_path
