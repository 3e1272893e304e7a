"""The on-disk cache of packed weights (memory/weight_cache.py): a warm load maps what a cold load
packed, bit for bit; every input of the packing gets its own entry; a damaged, foreign or
unwritable cache costs one warning and never the load."""

from __future__ import annotations

import ctypes
import os
import warnings

import pytest
import torch
from gguf import GGMLQuantizationType as QT

import tallow
from tallow.gguf_file import GGUFFile, TensorInfo
from tallow.kernels.cpu import linear as cpu_linear
from tallow.memory import weight_cache
from tallow.memory.weight_cache import WeightCache, WeightCacheWarning
from test_quant_reference import random_rows
from full_disk import FullDisk
from tiny_models import tiny_prompt, write_tiny_model

PROMPT = tiny_prompt(12)
_USER_HOME = os.environ.get("TALLOW_HOME")  # where `tallow pull` put the real models


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TALLOW_HOME", str(tmp_path / "home"))
    for var in ("TALLOW_WEIGHT_CACHE", "TALLOW_WEIGHT_CACHE_BYTES", "TALLOW_INT4", "TALLOW_INT8", "TALLOW_INT4X2",
                "TALLOW_FUSE", "TALLOW_OUTPUT_INT8G", "TALLOW_REFERENCE", "TALLOW_PROGRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TALLOW_NUMERICS", "default")  # the cache holds the torch paths' layers (llama.cpp's map the file)
    return tmp_path / "home" / "packed"


def _logits(llm: tallow.LLM) -> torch.Tensor:
    llm.engine.kv.tokens.clear()
    return llm.model.forward(PROMPT, 0, llm.engine.kv, all_logits=True)


def _load(path, **kw) -> tallow.LLM:
    return tallow.LLM(path, ctx=64, device="cpu", **kw)


def _mapped_bytes(llm: tallow.LLM) -> int:
    """Bytes of the model's layer tensors that live inside the weight cache's map."""
    mm = llm.weight_cache._map
    lo = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    hi = lo + len(mm)
    seen, total = set(), 0
    for t in llm.weight_cache._tensors:
        assert lo <= t.data_ptr() and t.data_ptr() + t.nbytes <= hi
    layers = [llm.model.output] + [v for layer in llm.model.layers for v in layer.tensors.values() if not isinstance(v, torch.Tensor)]
    for layer in layers:
        for t in layer._tensors():
            if t.data_ptr() not in seen and lo <= t.data_ptr() < hi:
                seen.add(t.data_ptr())
                total += t.nbytes
    return total


def _no_packing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a warm load must not pack")
    monkeypatch.setattr(cpu_linear, "make_linear", refuse)


@pytest.mark.parametrize("arch,qtype,env", [
    ("llama", QT.Q4_1, {}),                          # int4, fused Q/K/V and gate/up
    ("qwen2", QT.Q8_0, {}),                          # int8 per row, Q/K/V biases
    ("qwen2", QT.Q8_0, {"TALLOW_INT4X2": "1", "TALLOW_OUTPUT_INT8G": "1"}),  # int4x2
    ("gemma3", QT.Q5_0, {"TALLOW_FUSE": "0"}),       # tied output, parts unfused
    ("llama", QT.F32, {}),                           # dense fp32
])
def test_warm_load_maps_what_the_cold_load_packed(home, tmp_path, monkeypatch, arch, qtype, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path = write_tiny_model(arch, tmp_path / "m.gguf", qtype=qtype)
    monkeypatch.setenv("TALLOW_WEIGHT_CACHE", "0")
    off = _load(path)
    assert off.stats.load.weight_cache == "off" and not home.exists()
    monkeypatch.delenv("TALLOW_WEIGHT_CACHE")
    cold = _load(path)
    assert cold.stats.load.weight_cache == "written"
    assert len(list(home.glob("*.tallowpack"))) == 1
    with monkeypatch.context() as m:
        _no_packing(m)
        warm = _load(path)
    assert warm.stats.load.weight_cache == "hit"
    assert warm.model.nbytes == off.model.nbytes
    assert _mapped_bytes(warm) == sum(t.nbytes for t in warm.weight_cache._tensors)  # every layer tensor is in the map
    assert abs(warm.memory.weights - warm.model.nbytes) <= 0.02 * warm.model.nbytes  # and the plan counts it
    assert [repr(l) for l in warm.model.layers[0].tensors.values()] == [repr(l) for l in off.model.layers[0].tensors.values()]
    ref = _logits(off)
    assert torch.equal(_logits(cold), ref)
    assert torch.equal(_logits(warm), ref)
    assert warm.generate(PROMPT, max_tokens=6).tokens == off.generate(PROMPT, max_tokens=6).tokens


def test_a_changed_switch_file_or_mode_gets_its_own_entry(home, tmp_path, monkeypatch):
    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q4_1)
    _load(path)
    monkeypatch.setenv("TALLOW_INT4", "0")  # int4 candidates become dense bf16
    changed = _load(path)
    assert changed.stats.load.weight_cache == "written"
    layer = changed.model.layers[0].attn_output
    assert (layer.fallback[0] if layer.kind == "ggml_dot" else layer).kind == "dense_bf16"  # under the C kernel
    monkeypatch.delenv("TALLOW_INT4")
    assert _load(path, linear_mode="int8").stats.load.weight_cache == "written"
    other = write_tiny_model("llama", tmp_path / "m.gguf", seed=1, qtype=QT.Q4_1)  # same header, new data
    assert _load(other).stats.load.weight_cache == "written"
    assert len(list(home.glob("*.tallowpack"))) == 4
    assert _load(path).stats.load.weight_cache == "hit"


def test_a_pack_without_the_c_kernel_is_not_served_with_it_or_back(home, tmp_path, monkeypatch):
    """Which layers a load builds depends on whether the C kernel was built at install: a pack written
    without it would run the slower torch layers forever once it is; one written with it would restore
    layers whose library is missing (an AttributeError at the first token)."""
    from tallow.kernels.cpu import ggml_dot

    if not ggml_dot.usable():
        pytest.skip(ggml_dot.unavailable_reason() or "the C kernel runs portable code here")
    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q4_1)
    assert _load(path).stats.load.weight_cache == "written"
    with monkeypatch.context() as m:
        m.setattr(ggml_dot, "_lib", None)
        m.setattr(ggml_dot, "_reason", "not built (test)")
        without = _load(path)
        assert without.stats.load.weight_cache == "written"
        assert without.model.layers[0].attn_output.kind != "ggml_dot"
        assert without.generate(PROMPT, max_tokens=3).tokens
    assert _load(path).stats.load.weight_cache == "hit"
    assert len(list(home.glob("*.tallowpack"))) == 2


def test_the_fp32_reference_path_is_not_cached(home, tmp_path, monkeypatch):
    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q4_1)
    assert _load(path, linear_mode="reference").stats.load.weight_cache == "off"
    monkeypatch.setenv("TALLOW_REFERENCE", "1")
    assert _load(path).stats.load.weight_cache == "off"
    assert not list(home.glob("*.tallowpack"))


def test_every_construction_switch_is_in_the_key():
    _, switches = weight_cache._code_identity()
    for name in ("TALLOW_INT4", "TALLOW_INT8", "TALLOW_INT4X2", "TALLOW_REFERENCE", "TALLOW_FUSE", "TALLOW_OUTPUT_INT8G"):
        assert name in switches
    assert "TALLOW_PREFILL_DEQUANT" not in switches  # read at call time


@pytest.mark.parametrize("damage", ["truncate", "garbage", "flip_header", "foreign_key"])
def test_a_damaged_or_foreign_file_is_ignored_with_one_warning_then_rewritten(home, tmp_path, monkeypatch, damage):
    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q8_0)
    ref = _logits(_load(path))
    (entry,) = home.glob("*.tallowpack")
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "flip_header":
        data[40] ^= 0x20
    else:  # a file another model wrote, renamed into this one's place
        data = data.replace(b'"device": "cpu"', b'"device": "cpX"')
    entry.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = _load(path)
    ours = [w for w in caught if issubclass(w.category, WeightCacheWarning)]
    assert len(ours) == 1 and "damaged or foreign" in str(ours[0].message)
    assert llm.stats.load.weight_cache == "written"
    assert torch.equal(_logits(llm), ref)
    assert _load(path).stats.load.weight_cache == "hit"


def test_an_unwritable_cache_dir_warns_once_and_loads(tmp_path, monkeypatch, home):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TALLOW_HOME", str(blocker / "home"))  # mkdir fails, even as root
    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q4_1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = _load(path)
    ours = [w for w in caught if issubclass(w.category, WeightCacheWarning)]
    assert len(ours) == 1 and "were not cached" in str(ours[0].message)
    assert llm.stats.load.weight_cache == "not written"
    assert llm.generate(PROMPT, max_tokens=3).tokens


def test_a_full_disk_warns_once_leaves_no_partial_file_and_loads(home, tmp_path, monkeypatch):
    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q4_1)
    real_open = open
    def fake_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return FullDisk(f) if "w" in mode and str(file).endswith(".tmp") else f  # the second write fails

    monkeypatch.setattr("builtins.open", fake_open)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm = _load(path)
    monkeypatch.setattr("builtins.open", real_open)
    ours = [w for w in caught if issubclass(w.category, WeightCacheWarning)]
    assert len(ours) == 1 and "No space left" in str(ours[0].message)
    assert llm.stats.load.weight_cache == "not written"
    assert list(home.iterdir()) == []  # the temporary file is gone
    assert llm.generate(PROMPT, max_tokens=3).tokens


def test_too_little_free_space_is_not_filled(home, tmp_path, monkeypatch):
    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q4_1)
    monkeypatch.setattr(weight_cache.shutil, "disk_usage", lambda p: type("U", (), {"free": 1 << 20})())
    with pytest.warns(WeightCacheWarning, match="free on that disk"):
        assert _load(path).stats.load.weight_cache == "not written"


def test_the_folder_stays_within_its_byte_bound(home, tmp_path, monkeypatch):
    paths = [write_tiny_model("llama", tmp_path / f"m{i}.gguf", seed=i, qtype=QT.Q8_0) for i in range(3)]
    _load(paths[0])
    size = next(home.glob("*.tallowpack")).stat().st_size
    monkeypatch.setenv("TALLOW_WEIGHT_CACHE_BYTES", str(2 * size + size // 2))
    for p in paths[1:]:
        _load(p)
    names = sorted(f.name for f in home.glob("*.tallowpack"))
    assert len(names) == 2 and not any(n.startswith("m0-") for n in names)
    dead = home / f".{names[0]}.{2 ** 22 + 12345}.tmp"  # a writer killed mid-file (no such pid)
    dead.write_bytes(b"partial")
    live = home / f".{names[0]}.{os.getpid()}.tmp"
    live.write_bytes(b"being written")
    weight_cache.evict(home, 1 << 40)
    assert not dead.exists() and live.exists()


def test_group_int8_layers_round_trip_through_the_file(home, tmp_path):
    """Q6_K's group-32 int8 form (the output projection of Q4_K_M files): no tiny model has it."""
    raw = random_rows(QT.Q6_K, 48, 256, seed=5)
    info = TensorInfo("output.weight", QT.Q6_K, (256, 48), 0, raw.nbytes, raw)
    gf = GGUFFile(write_tiny_model("llama", tmp_path / "m.gguf"))
    key = weight_cache.cache_key(gf, "cpu", "int8g")
    cache = WeightCache(gf, key, home / "x.tallowpack", progress=False)
    built = cache.layer(["output.weight"], lambda: cpu_linear.make_linear(info, mode="int8g"))
    assert built.kind == "int8g" and cache.save() == "written"
    again = WeightCache(gf, key, home / "x.tallowpack", progress=False)
    restored = again.layer(["output.weight"], lambda: pytest.fail("should be mapped"))
    x = torch.randn(3, 256)
    assert type(restored) is type(built) and torch.equal(restored(x), built(x))


def test_progress_bar_only_when_asked(home, tmp_path, monkeypatch, capfd):
    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q4_1)
    _load(path)
    assert "packing" not in capfd.readouterr().err  # not a terminal
    (entry,) = home.glob("*.tallowpack")
    entry.unlink()
    monkeypatch.setenv("TALLOW_PROGRESS", "1")
    _load(path)
    assert "packing weights" in capfd.readouterr().err


def test_smollm2_warm_logits_are_bit_identical_to_the_packed_ones(home, monkeypatch):
    from model_paths import require_model

    with monkeypatch.context() as m:
        m.setenv("TALLOW_HOME", _USER_HOME) if _USER_HOME else m.delenv("TALLOW_HOME")
        path = require_model("smollm2-135m")
    cold = _load(path)  # packs, exactly as with TALLOW_WEIGHT_CACHE=0, then writes the file
    assert cold.stats.load.weight_cache == "written"
    ids = cold.tokenize("The capital of France is")
    ref = cold.model.forward(ids, 0, cold.engine.kv, all_logits=True)
    text = cold.generate(ids, max_tokens=8).text
    del cold
    with monkeypatch.context() as m:
        _no_packing(m)
        warm = _load(path)
    assert warm.stats.load.weight_cache == "hit"
    assert torch.equal(warm.model.forward(ids, 0, warm.engine.kv, all_logits=True), ref)
    assert warm.generate(ids, max_tokens=8).text == text
