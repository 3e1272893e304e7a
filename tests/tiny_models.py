"""Small random-weight GGUF models for every architecture, written deterministically.

llama.cpp runs any valid GGUF, so these let us compare tallow with llama.cpp on
architectures we have no real weights for (qwen3) and, with F32 weights and F32 KV,
without llama.cpp's activation quantization blurring the comparison: any architectural
mistake shows up as a large logit difference. `scripts/make_fixtures.py` records
llama.cpp's logits for them; the tests rebuild the same files from the same seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize

from tallow.families import family

# "gemma4": E2B/E4B-style (per-layer embeddings, shared-KV layers with a double-wide MLP,
# per-layer output scales); "gemma4-31b": 31B-style (neither; V is K on the global layers).
ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "gemma4", "gemma4-31b")
N_VOCAB_BYTES = 256


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet, one token per byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def _tokens() -> tuple[list[str], list[int], list[str]]:
    tokens = _byte_tokens() + ["Ġt", "he", "<s>", "</s>"]
    types = [TokenType.NORMAL] * (len(tokens) - 2) + [TokenType.CONTROL, TokenType.CONTROL]
    merges = ["Ġ t", "h e"]
    return tokens, [int(t) for t in types], merges


def _add_byte_tokenizer(w: GGUFWriter, tokens: list[str], types: list[int], merges: list[str]) -> None:
    """The byte-level BPE vocabulary of `_tokens()`, its last two tokens BOS and EOS."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(False)


def _random_tensors(w: GGUFWriter, rng: np.random.RandomState, qtype: GGMLQuantizationType):
    """matrix(name, rows, cols, scale) in qtype and vector(name, n, mean, scale) in F32, drawn from
    rng in call order (the fixtures depend on that order)."""

    def matrix(name: str, rows: int, cols: int, scale: float) -> None:
        data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    def vector(name: str, n: int, mean: float, scale: float) -> None:
        w.add_tensor(name, (mean + rng.standard_normal(n) * scale).astype(np.float32))

    return matrix, vector


def write_tiny_model(arch: str, path: str | Path, seed: int = 0, qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
                     n_layers: int | None = None) -> Path:
    """Write a tiny `arch` model to path. Matrices use qtype; norms and biases stay F32.
    n_layers (not gemma4): fewer blocks for tests whose cost is per block (the fixtures use the default)."""
    if arch not in ARCHITECTURES:
        raise ValueError(arch)
    if arch.startswith("gemma4"):
        return _write_gemma4(path, seed, qtype, e2b_style=arch == "gemma4")
    rng = np.random.RandomState(seed)
    dim, n_heads, n_kv, ffn = 64, 4, 2, 128
    # llama.cpp's llama and qwen2 derive the head size from dim/n_heads; qwen3 and gemma3
    # read key_length, so they get a head size that differs from it to test that path.
    head_dim = 32 if arch in ("qwen3", "gemma3") else dim // n_heads
    n_layers = n_layers or (6 if arch == "gemma3" else 2)
    tokens, types, merges = _tokens()
    n_vocab = len(tokens)

    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if arch == "gemma3":
        w.add_sliding_window(8)
    _add_byte_tokenizer(w, tokens, types, merges)
    matrix, vector = _random_tensors(w, rng, qtype)
    names = family(arch).tensors  # tallow's tensor-name table (tallow/families/)

    matrix(names.name("token_embd"), n_vocab, dim, 1.0)
    vector(names.name("output_norm"), dim, 1.0, 0.1)
    if arch in ("llama", "qwen2"):
        matrix(names.name("output"), n_vocab, dim, dim**-0.5)
    for i in range(n_layers):
        tn = names.block(i)
        vector(tn("attn_norm"), dim, 1.0, 0.1)
        matrix(tn("attn_q"), n_heads * head_dim, dim, dim**-0.5)
        matrix(tn("attn_k"), n_kv * head_dim, dim, dim**-0.5)
        matrix(tn("attn_v"), n_kv * head_dim, dim, dim**-0.5)
        matrix(tn("attn_out"), dim, n_heads * head_dim, (n_heads * head_dim) ** -0.5)
        if arch == "qwen2":
            vector(tn("attn_q", "bias"), n_heads * head_dim, 0.0, 0.1)
            vector(tn("attn_k", "bias"), n_kv * head_dim, 0.0, 0.1)
            vector(tn("attn_v", "bias"), n_kv * head_dim, 0.0, 0.1)
        if arch in ("qwen3", "gemma3"):
            vector(tn("attn_q_norm"), head_dim, 1.0, 0.1)
            vector(tn("attn_k_norm"), head_dim, 1.0, 0.1)
        if arch == "gemma3":
            vector(tn("attn_post_norm"), dim, 1.0, 0.1)
            vector(tn("ffn_post_norm"), dim, 1.0, 0.1)
        vector(tn("ffn_norm"), dim, 1.0, 0.1)
        matrix(tn("ffn_gate"), ffn, dim, dim**-0.5)
        matrix(tn("ffn_up"), ffn, dim, dim**-0.5)
        matrix(tn("ffn_down"), dim, ffn, ffn**-0.5)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


# Tiny Gemma 4: 8 layers, sliding (s) and global (g) as below; the last 3 share KV in the E2B
# style (llama.cpp's rule: a sliding one reads layer 3, a global one layer 4).
GEMMA4_LAYER_TYPES = "ssgsgssg"
GEMMA4_SHARED_KV = 3


def _write_gemma4(path: str | Path, seed: int, qtype: GGMLQuantizationType, e2b_style: bool) -> Path:
    """A tiny `gemma4` GGUF with every per-layer-type fact distinct: sliding layers with head size
    16, 2 KV heads, window 8 and RoPE base 1e4; global ones with head size 32, 1 KV head, base 1e6
    and proportional RoPE (rope_freqs: the first 4 of 16 pairs rotate)."""
    rng = np.random.RandomState(seed)
    dim, n_heads, hd_swa, hd_full, per_layer = 64, 4, 16, 32, 32
    swa = [t == "s" for t in GEMMA4_LAYER_TYPES]
    n_layers = len(swa)
    n_shared = GEMMA4_SHARED_KV if e2b_style else 0
    n_cached = n_layers - n_shared
    kv_heads = [2 if s else 1 for s in swa]
    ffn = [128 if i < n_cached else 256 for i in range(n_layers)]  # double-wide shared-KV layers
    tokens, types, merges = _tokens()
    n_vocab = len(tokens)

    w = GGUFWriter(str(path), "gemma4")
    w.add_block_count(n_layers)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hd_full)
    w.add_value_length(hd_full)
    w.add_key_length_swa(hd_swa)
    w.add_value_length_swa(hd_swa)
    w.add_rope_dimension_count(hd_full)
    w.add_rope_dimension_count_swa(hd_swa)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(8)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(n_shared)
    w.add_embedding_length_per_layer_input(per_layer if e2b_style else 0)
    w.add_final_logit_softcapping(30.0)
    _add_byte_tokenizer(w, tokens, types, merges)
    matrix, vector = _random_tensors(w, rng, qtype)
    names = family("gemma4").tensors  # tallow's tensor-name table (tallow/families/gemma4.py)

    matrix(names.name("token_embd"), n_vocab, dim, 1.0)
    vector(names.name("output_norm"), dim, 1.0, 0.1)
    if e2b_style:
        # Untied: with logits from the tied embedding the tiny model's greedy run repeats one
        # token; its own output projection gives a varied continuation to compare. (The 31B
        # style keeps the tie, as the real files do.)
        matrix(names.name("output"), n_vocab, dim, 1.0)
    n_rot = hd_full // 2 // 4  # partial_rotary_factor 0.25, as the converter writes it
    w.add_tensor(names.name("rope_freqs"), np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32))
    if e2b_style:
        matrix(names.name("per_layer_token_embd"), n_vocab, per_layer * n_layers, 1.0)
        matrix(names.name("per_layer_model_proj"), per_layer * n_layers, dim, dim**-0.5)
        vector(names.name("per_layer_proj_norm"), per_layer, 1.0, 0.1)
    for i in range(n_layers):
        tn = names.block(i)
        hd = hd_swa if swa[i] else hd_full
        nkv = kv_heads[i]
        vector(tn("attn_norm"), dim, 1.0, 0.1)
        matrix(tn("attn_q"), n_heads * hd, dim, dim**-0.5)
        vector(tn("attn_q_norm"), hd, 1.0, 0.1)
        if i < n_cached:
            matrix(tn("attn_k"), nkv * hd, dim, dim**-0.5)
            vector(tn("attn_k_norm"), hd, 1.0, 0.1)
            if e2b_style or swa[i]:  # the 31B style: global layers' V is their K projection
                matrix(tn("attn_v"), nkv * hd, dim, dim**-0.5)
        matrix(tn("attn_out"), dim, n_heads * hd, (n_heads * hd) ** -0.5)
        vector(tn("attn_post_norm"), dim, 1.0, 0.1)
        vector(tn("ffn_norm"), dim, 1.0, 0.1)
        matrix(tn("ffn_gate"), ffn[i], dim, dim**-0.5)
        matrix(tn("ffn_up"), ffn[i], dim, dim**-0.5)
        matrix(tn("ffn_down"), dim, ffn[i], ffn[i] ** -0.5)
        vector(tn("ffn_post_norm"), dim, 1.0, 0.1)
        if e2b_style:
            matrix(tn("per_layer_inp_gate"), per_layer, dim, dim**-0.5)
            matrix(tn("per_layer_proj"), dim, per_layer, per_layer**-0.5)
            vector(tn("per_layer_post_norm"), dim, 1.0, 0.1)
            vector(tn("layer_out_scale"), 1, 0.8, 0.1)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)



def write_tiny_gemma4_vocab(vocab: str | Path, out: str | Path) -> Path:
    """A 2-layer random-weight gemma4 model (31B style) carrying the tokenizer and chat template of
    the vocabulary-only GGUF `vocab` (llama.cpp's Gemma 4 vocabulary): for the chat path end to end
    (tests/test_gemma4_chat.py) and for llama-server's template renderings
    (scripts/make_template_fixtures.py). Its output is noise."""
    from gguf import GGUFValueType

    from tallow.gguf_file import GGUFFile

    md = GGUFFile(str(vocab)).metadata
    n_vocab = len(md["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(out), "gemma4")
    dim, heads, hd, ffn = 64, 4, 16, 128
    w.add_block_count(2)
    w.add_context_length(8192)
    w.add_embedding_length(dim)
    w.add_feed_forward_length([ffn, ffn])
    w.add_head_count(heads)
    w.add_head_count_kv([1, 1])
    for add in (w.add_key_length, w.add_value_length, w.add_key_length_swa, w.add_value_length_swa,
                w.add_rope_dimension_count, w.add_rope_dimension_count_swa):
        add(hd)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(8)
    w.add_sliding_window_pattern([True, False])
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    w.add_final_logit_softcapping(30.0)
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    w.add_token_scores(md["tokenizer.ggml.scores"].tolist())
    w.add_token_types(md["tokenizer.ggml.token_type"].tolist())
    w.add_token_merges(md["tokenizer.ggml.merges"])
    for key in ("bos", "eos", "unknown", "padding", "mask"):
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", int(md[f"tokenizer.ggml.{key}_token_id"]))
    w.add_bool("tokenizer.ggml.add_bos_token", bool(md["tokenizer.ggml.add_bos_token"]))
    w.add_key_value("tokenizer.chat_template", md["tokenizer.chat_template"], GGUFValueType.STRING)
    rng = np.random.RandomState(0)

    def matrix(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    names = family("gemma4").tensors  # tallow's tensor-name table (tallow/families/gemma4.py)
    matrix(names.name("token_embd"), n_vocab, dim)
    ones(names.name("output_norm"), dim)
    ones(names.name("rope_freqs"), hd // 2)
    for i in range(2):
        tn = names.block(i)
        for role, n in (("attn_norm", dim), ("attn_q_norm", hd), ("attn_k_norm", hd), ("attn_post_norm", dim),
                        ("ffn_norm", dim), ("ffn_post_norm", dim)):
            ones(tn(role), n)
        for role, rows, cols in (("attn_q", heads * hd, dim), ("attn_k", hd, dim), ("attn_v", hd, dim),
                                 ("attn_out", dim, heads * hd), ("ffn_gate", ffn, dim), ("ffn_up", ffn, dim),
                                 ("ffn_down", dim, ffn)):
            matrix(tn(role), rows, cols)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def tiny_prompt(n: int = 24, seed: int = 1) -> list[int]:
    """A fixed token sequence longer than gemma3's tiny window of 8."""
    return [int(t) for t in np.random.RandomState(seed).randint(0, N_VOCAB_BYTES, size=n)]
