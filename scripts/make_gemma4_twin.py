#!/usr/bin/env python3
"""Gemma 4 E2B- and E4B-shaped twins: GGUFs with the metadata keys, tensor names, shapes and
quant types a real Q4_K_M file of the model has, and random data (block scales kept sane). A twin
times like the real model and means nothing: use it for speed, never for text.

    python scripts/make_gemma4_twin.py e2b OUT.gguf [--vocab VOCAB.gguf] [--seed 0]
    python scripts/make_gemma4_twin.py e4b OUT.gguf
    python scripts/make_gemma4_twin.py e2b --table          # the tensor table and sizes, no file
    python scripts/make_gemma4_twin.py e2b OUT.gguf --own-kv  # no shared-KV layers: what sharing saves

Where each fact comes from (docs/performance.md, "Gemma 4 twins", lists them per model):

- The shapes: the published `text_config` of google/gemma-4-E2B(-it) and google/gemma-4-E4B(-it)
  (CONFIGS below, field for field; copies of config.json quoted in public repositories, found
  through the code search: the Hugging Face pages themselves are not reachable from here).
- The metadata keys and how the converter fills them: llama.cpp b11434
  `conversion/gemma.py` (Gemma3Model.set_gguf_parameters, then Gemma4Model.set_gguf_parameters):
  key/value length = global_head_dim, *_swa = head_dim; rope.dimension_count = global_head_dim
  (proportional RoPE goes through rope_freqs instead), rope.dimension_count_swa = head_dim ×
  the sliding layers' partial_rotary_factor (1.0); feed_forward_length an array only with
  use_double_wide_mlp (the last num_kv_shared_layers layers twice as wide); head_count_kv
  a scalar (num_global_key_value_heads is null in both configs); rope_freqs = [1.0] × 64 +
  [1e30] × 192 (global_head_dim 512 × partial_rotary_factor 0.25 / 2 rotated pairs).
- The tensors: llama.cpp b11434 `src/models/gemma4.cpp` load_arch_tensors. The shared-KV layers
  carry no attn_k / attn_v / attn_k_norm (transformers' saved checkpoints omit them, and the
  size check below agrees: a real E2B Q4_K_M file is 3.412 GB; this table gives 3.399 GB of
  tensors + ~13 MB of header without them, 3.411 GB + header with them).
- The quant types: llama.cpp b11434 `src/llama-quant.cpp`, Q4_K_M: Q4_K by default; the tied
  token_embd and per_layer_token_embd (both match tensor_name_match_token_embd, and the file
  has no output.weight) get the output tensor's Q6_K; attn_v and ffn_down Q6_K where
  usemore_bits(i, n) (i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2), counted over the attn_v
  tensors present and over the layers; per_layer_model_proj is never quantized, so it keeps the
  converter's type, BF16 (`--outtype auto` on a bfloat16 checkpoint); 1-D tensors and norms F32.
- The vocabulary: llama.cpp's Gemma 4 vocabulary file (tests/fixtures/shared/vocab), every
  `tokenizer.*` key copied.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from twin_gguf import Tensor, more_bits, random_blocks, start_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VOCAB_XZ = ROOT / "tests" / "fixtures" / "shared" / "vocab" / "ggml-vocab-gemma-4.gguf.xz"

# The published text_config fields the twin uses (google/gemma-4-E2B and -E4B, base and -it alike).
CONFIGS = {
    "e2b": dict(hidden_size=1536, num_hidden_layers=35, intermediate_size=6144, num_attention_heads=8,
                num_key_value_heads=1, num_global_key_value_heads=None, head_dim=256, global_head_dim=512,
                sliding_window=512, vocab_size=262144, vocab_size_per_layer_input=262144,
                hidden_size_per_layer_input=256, num_kv_shared_layers=20, use_double_wide_mlp=True,
                attention_k_eq_v=False, max_position_embeddings=131072, rms_norm_eps=1e-6,
                final_logit_softcapping=30.0, tie_word_embeddings=True,
                layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
                rope_theta_full=1_000_000.0, partial_rotary_factor_full=0.25, rope_theta_sliding=10_000.0),
    "e4b": dict(hidden_size=2560, num_hidden_layers=42, intermediate_size=10240, num_attention_heads=8,
                num_key_value_heads=2, num_global_key_value_heads=None, head_dim=256, global_head_dim=512,
                sliding_window=512, vocab_size=262144, vocab_size_per_layer_input=262144,
                hidden_size_per_layer_input=256, num_kv_shared_layers=18, use_double_wide_mlp=False,
                attention_k_eq_v=False, max_position_embeddings=131072, rms_norm_eps=1e-6,
                final_logit_softcapping=30.0, tie_word_embeddings=True,
                layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 7,
                rope_theta_full=1_000_000.0, partial_rotary_factor_full=0.25, rope_theta_sliding=10_000.0),
}

def ffn_widths(c: dict) -> list[int]:
    """Per-layer MLP widths: with use_double_wide_mlp the converter doubles the last
    num_kv_shared_layers layers (double_wide_from keeps them when a variant owns every cache)."""
    n_layers = c["num_hidden_layers"]
    first = c.get("double_wide_from", n_layers - c["num_kv_shared_layers"])
    return [c["intermediate_size"] * (2 if c["use_double_wide_mlp"] and i >= first else 1) for i in range(n_layers)]


def own_every_cache(c: dict) -> dict:
    """The same model with no shared-KV layers (every layer with its K/V projections and cache,
    MLP widths unchanged): to measure what KV sharing saves, in tallow and in llama.cpp."""
    return dict(c, num_kv_shared_layers=0, double_wide_from=c["num_hidden_layers"] - c["num_kv_shared_layers"])


def tensor_table(c: dict) -> list[Tensor]:
    """The tensors of a real Q4_K_M file of config c, in a converter-like order."""
    dim, n_layers, ple = c["hidden_size"], c["num_hidden_layers"], c["hidden_size_per_layer_input"]
    n_heads, vocab = c["num_attention_heads"], c["vocab_size"]
    swa = [t == "sliding_attention" for t in c["layer_types"]]
    assert len(swa) == n_layers
    n_cached = n_layers - c["num_kv_shared_layers"]
    kv_full = c["num_global_key_value_heads"] or c["num_key_value_heads"]
    ffn = ffn_widths(c)
    assert c["tie_word_embeddings"] and not c["attention_k_eq_v"]
    t = [Tensor("token_embd.weight", (vocab, dim), "Q6_K")]
    if ple:
        assert c["vocab_size_per_layer_input"] == vocab
        t += [Tensor("per_layer_token_embd.weight", (vocab, n_layers * ple), "Q6_K"),
              Tensor("per_layer_model_proj.weight", (n_layers * ple, dim), "BF16"),
              Tensor("per_layer_proj_norm.weight", (ple,), "F32")]
    t += [Tensor("rope_freqs.weight", (c["global_head_dim"] // 2,), "F32"), Tensor("output_norm.weight", (dim,), "F32")]
    n_v, i_v = n_cached, 0  # attn_v tensors present: one per cached layer
    for i in range(n_layers):
        p = f"blk.{i}."
        hd = c["head_dim"] if swa[i] else c["global_head_dim"]
        kv = c["num_key_value_heads"] if swa[i] else kv_full
        t += [Tensor(p + "attn_norm.weight", (dim,), "F32"), Tensor(p + "attn_q.weight", (n_heads * hd, dim), "Q4_K")]
        if i < n_cached:
            t += [Tensor(p + "attn_k.weight", (kv * hd, dim), "Q4_K"),
                  Tensor(p + "attn_v.weight", (kv * hd, dim), "Q6_K" if more_bits(i_v, n_v) else "Q4_K"),
                  Tensor(p + "attn_k_norm.weight", (hd,), "F32")]
            i_v += 1
        t += [Tensor(p + "attn_q_norm.weight", (hd,), "F32"),
              Tensor(p + "attn_output.weight", (dim, n_heads * hd), "Q4_K"),
              Tensor(p + "post_attention_norm.weight", (dim,), "F32"),
              Tensor(p + "ffn_norm.weight", (dim,), "F32"),
              Tensor(p + "ffn_gate.weight", (ffn[i], dim), "Q4_K"),
              Tensor(p + "ffn_up.weight", (ffn[i], dim), "Q4_K"),
              Tensor(p + "ffn_down.weight", (dim, ffn[i]), "Q6_K" if more_bits(i, n_layers) else "Q4_K"),
              Tensor(p + "post_ffw_norm.weight", (dim,), "F32"),
              Tensor(p + "layer_output_scale.weight", (1,), "F32")]
        if ple:
            t += [Tensor(p + "inp_gate.weight", (ple, dim), "Q4_K"), Tensor(p + "proj.weight", (dim, ple), "Q4_K"),
                  Tensor(p + "post_norm.weight", (dim,), "F32")]
    return t


def add_metadata(w, c: dict, name: str, vocab_path: Path) -> None:
    """The keys llama.cpp's converter writes for this config, then every tokenizer.* key of the vocabulary."""
    n_layers = c["num_hidden_layers"]
    w.add_string("general.name", f"gemma-4-{name.upper()} twin (random weights)")
    w.add_uint32("general.file_type", 15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    w.add_uint32("general.quantization_version", 2)
    w.add_block_count(n_layers)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    if c["use_double_wide_mlp"]:
        w.add_feed_forward_length(ffn_widths(c))
    else:
        w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_key_length(c["global_head_dim"])
    w.add_value_length(c["global_head_dim"])
    w.add_key_length_swa(c["head_dim"])
    w.add_value_length_swa(c["head_dim"])
    w.add_rope_freq_base(c["rope_theta_full"])
    w.add_rope_freq_base_swa(c["rope_theta_sliding"])
    w.add_rope_dimension_count(c["global_head_dim"])
    w.add_rope_dimension_count_swa(c["head_dim"])
    w.add_final_logit_softcapping(c["final_logit_softcapping"])
    w.add_sliding_window(c["sliding_window"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in c["layer_types"]])
    w.add_shared_kv_layers(c["num_kv_shared_layers"])
    w.add_embedding_length_per_layer_input(c["hidden_size_per_layer_input"])
    add_tokenizer(w, vocab_path, c["vocab_size"])


def add_tokenizer(w, vocab_path: Path, vocab_size: int) -> None:
    """Every tokenizer.* key of the vocabulary GGUF (also scripts/make_moe_twin.py's Gemma 4 twins)."""
    from gguf import GGUFReader, GGUFValueType as VT

    r = GGUFReader(str(vocab_path))
    for key, field in r.fields.items():
        if key.startswith("tokenizer."):
            vt = field.types[0]
            if vt == VT.ARRAY:
                w.add_key_value(key, field.contents(), vt, sub_type=field.types[-1])
            else:
                w.add_key_value(key, field.contents(), vt)
    n_tokens = len(r.fields["tokenizer.ggml.tokens"].data)
    if n_tokens != vocab_size:
        raise SystemExit(f"{vocab_path}: {n_tokens} tokens, but the config has vocab_size {vocab_size}.")


def _random_data(t: Tensor, rng: np.random.Generator, chunk: int = 1 << 26):
    """The tensor's bytes in chunks: random quant blocks with their fp16 scales set to 0.002,
    norms and the output scales 1.0, rope_freqs the converter's values, other floats N(0, 0.02)."""
    if t.type in ("Q4_K", "Q6_K"):
        yield from random_blocks(t, rng, chunk)
    elif t.type == "F32":
        n = int(np.prod(t.shape))
        if t.name == "rope_freqs.weight":
            n_rot = int(2 * n * 0.25 / 2)  # partial_rotary_factor 0.25 of global_head_dim = 2n
            yield np.array([1.0] * n_rot + [1e30] * (n - n_rot), np.float32).tobytes()
        elif "norm" in t.name or "scale" in t.name:
            yield np.ones(n, np.float32).tobytes()
        else:
            yield (rng.standard_normal(n, np.float32) * 0.02).tobytes()
    else:  # BF16: the top halves of float32 values
        rows, cols = t.shape
        step = max(1, chunk // (cols * 4))
        for r0 in range(0, rows, step):
            v = rng.standard_normal((min(step, rows - r0), cols), np.float32) * 0.02
            yield (v.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def unpack_vocab(dest: Path) -> Path:
    if not dest.exists():
        with lzma.open(VOCAB_XZ) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out)
    return dest


def write_twin(c: dict, name: str, out: Path, vocab: Path | None = None, seed: int = 0) -> Path:
    """Write the twin of config c (CONFIGS[...] or a variant) to out; vocab: a GGUF whose
    tokenizer.* keys to copy (default: llama.cpp's Gemma 4 vocabulary)."""
    table = tensor_table(c)
    with tempfile.TemporaryDirectory() as tmp:
        vocab = vocab or unpack_vocab(Path(tmp) / "vocab.gguf")
        w, f, align = start_gguf(out, "gemma4", lambda w: add_metadata(w, c, name, vocab), table)
        rng = np.random.default_rng(seed)
        for t in table:
            for part in _random_data(t, rng):
                f.write(part)
            f.write(b"\0" * (-t.nbytes % align))
        w.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=sorted(CONFIGS))
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument("--vocab", type=Path, help="llama.cpp's Gemma 4 vocabulary GGUF (default: the tests' copy, unpacked)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--table", action="store_true", help="print the tensor table and its sizes, write nothing")
    p.add_argument("--own-kv", action="store_true",
                   help="a variant without shared-KV layers (every layer owns its cache), to measure what sharing saves")
    a = p.parse_args()
    c = own_every_cache(CONFIGS[a.model]) if a.own_kv else CONFIGS[a.model]
    table = tensor_table(c)
    if a.table or a.out is None:
        by_type: dict[str, int] = {}
        for t in table:
            print(f"{t.name:36s} {t.type:5s} {'x'.join(map(str, t.shape[::-1]))}")  # ggml order, as llama.cpp logs
            by_type[t.type] = by_type.get(t.type, 0) + t.nbytes
        print(f"{len(table)} tensors, {sum(by_type.values()):,} bytes: "
              + ", ".join(f"{k} {v:,}" for k, v in sorted(by_type.items())))
        return 0
    start = time.time()
    write_twin(c, a.model + ("-own-kv" if a.own_kv else ""), a.out, a.vocab, a.seed)
    print(f"{a.out}: gemma-4-{a.model.upper()} twin, {len(table)} tensors, {a.out.stat().st_size:,} bytes, "
          f"{time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
