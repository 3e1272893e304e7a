"""The Gemma 4 twin generator (scripts/make_gemma4_twin.py): the E2B/E4B tensor tables follow the
published configs and llama.cpp's Q4_K_M rules, and a shrunken twin of the same shape loads and runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from gguf import GGUFWriter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_models import _add_byte_tokenizer, _tokens  # noqa: E402

_spec = importlib.util.spec_from_file_location("make_gemma4_twin", ROOT / "scripts" / "make_gemma4_twin.py")
twin = importlib.util.module_from_spec(_spec)
sys.modules["make_gemma4_twin"] = twin  # dataclasses look their module up
_spec.loader.exec_module(twin)


def _types(table):
    return {t.name: t.type for t in table}


def test_e2b_table_matches_the_real_file():
    table = twin.tensor_table(twin.CONFIGS["e2b"])
    types = _types(table)
    # What llama.cpp's loader logs for the twin, and a real E2B Q4_K_M file is 3.412e9 bytes in all
    # (these tensors plus ~13 MB of header).
    assert len(table) == 541
    assert sum(t.nbytes for t in table) == 3_400_303_756
    assert [t.type for t in table].count("Q6_K") == 26 and types["per_layer_model_proj.weight"] == "BF16"
    assert types["token_embd.weight"] == types["per_layer_token_embd.weight"] == "Q6_K"  # tied: the output's type
    shapes = {t.name: t.shape for t in table}
    assert shapes["per_layer_token_embd.weight"] == (262144, 35 * 256)
    assert shapes["blk.4.attn_q.weight"] == (8 * 512, 1536) and shapes["blk.3.attn_q.weight"] == (8 * 256, 1536)
    assert shapes["blk.14.ffn_gate.weight"] == (6144, 1536) and shapes["blk.15.ffn_gate.weight"] == (12288, 1536)
    # The 20 shared-KV layers carry no K/V projections; attn_v's extra bits count over the 15 present.
    assert "blk.14.attn_k.weight" in types and not any(f"blk.{i}.attn_k.weight" in types for i in range(15, 35))
    assert [i for i in range(15) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"] == [0, 3, 6, 9, 12, 13, 14]
    assert [i for i in range(35) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"][:6] == [0, 1, 2, 3, 6, 9]


def test_e4b_table():
    c = twin.CONFIGS["e4b"]
    table = twin.tensor_table(c)
    shapes = {t.name: t.shape for t in table}
    assert set(twin.ffn_widths(c)) == {10240}  # E4B's MLP is not double wide
    assert shapes["blk.5.attn_k.weight"] == (2 * 512, 2560) and "blk.24.attn_k.weight" not in shapes
    own = twin.tensor_table(twin.own_every_cache(c))
    assert len(own) == len(table) + 3 * 18  # K, V and K's norm for each formerly shared layer


def _small_config() -> dict:
    """E2B's structure at a size a test can write: 4 layers (sliding, global, sliding, global),
    the last two sharing KV with a double-wide MLP, per-layer embeddings, the byte vocabulary."""
    return dict(twin.CONFIGS["e2b"], hidden_size=256, num_hidden_layers=4, intermediate_size=512,
                num_attention_heads=2, num_kv_shared_layers=2, vocab_size=len(_tokens()[0]),
                vocab_size_per_layer_input=len(_tokens()[0]), sliding_window=8,
                layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=256)


def test_small_twin_loads_and_runs(tmp_path):
    import tallow
    from tallow.gguf_file import GGUFFile
    from tallow.spec import spec_from_gguf

    vocab = tmp_path / "vocab.gguf"
    w = GGUFWriter(str(vocab), "gemma4")
    _add_byte_tokenizer(w, *_tokens())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    c = _small_config()
    path = twin.write_twin(c, "small", tmp_path / "small.gguf", vocab)
    spec = spec_from_gguf(GGUFFile(str(path)))
    assert [layer.kv_source for layer in spec.layers] == [0, 1, 0, 1]
    assert [layer.ffn_dim for layer in spec.layers] == [512, 512, 1024, 1024]
    assert [layer.head_dim for layer in spec.layers] == [256, 512, 256, 512]
    assert spec.per_layer_input_dim == 256
    llm = tallow.LLM(str(path), ctx=32, device="cpu")
    logits = llm.model.forward([1, 2, 3, 4, 5], 0, llm.engine.kv, all_logits=True)
    assert logits.shape == (5, c["vocab_size"]) and torch.isfinite(logits).all()
    # The pool holds the two owning layers only (the sliding one as a ring), exactly as the plan counts them.
    from tallow.memory.budget import kv_bytes

    kv = llm.engine.kv
    assert kv.owners == [0, 1] and kv.nbytes == kv_bytes(spec, 32, "f16", llm.engine.prefill_chunk)
    assert kv.nbytes == (min(32, 8 + llm.engine.prefill_chunk - 1) * 256 + 32 * 512) * 2 * 2


@pytest.mark.parametrize("depth", [0, 9])
def test_bench_prefill_at_depth(tmp_path, depth):
    """`tallow bench -d` applies to pp as to tg (as llama-bench's does): the timed prompt lands
    after `depth` tokens of context."""
    import tallow
    from tallow.bench import bench_prefill
    from tiny_models import write_tiny_model

    llm = tallow.LLM(str(write_tiny_model("qwen3", tmp_path / "q.gguf")), ctx=32, device="cpu")
    assert bench_prefill(llm, 4, depth, torch.Generator().manual_seed(0)) > 0
    assert len(llm.engine.kv.tokens) == depth + 4
