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
# Routed-expert families (tests/test_moe.py; the GPU path: tests/test_moe_gpu.py).
MOE_ARCHITECTURES = ("qwen3moe", "gemma4-moe")
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


def _quantize(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """gguf.quants.quantize, plus NVFP4, which gguf 0.19 can only dequantize."""
    return _quantize_nvfp4(data) if qtype == GGMLQuantizationType.NVFP4 else quantize(data, qtype)


def _quantize_nvfp4(data: np.ndarray) -> np.ndarray:
    """NVFP4 blocks of the float32 rows `data` (last axis a multiple of 64): per 16 values a UE4M3
    scale of amax / 6 (E2M1's largest magnitude), each value the nearest E2M1 code times it."""
    from gguf.quants import NVFP4

    sub = data.reshape(-1, 4, 16)
    d = NVFP4.fp32_to_ue4m3(np.abs(sub).max(axis=-1) / 6)  # (n, 4) uint8
    scale = NVFP4.ue4m3_to_fp32(d)[..., None]  # halved, as the doubled codes expect
    values = np.array(NVFP4.kvalues, dtype=np.float32)
    q = np.abs(sub[..., None] - scale[..., None] * values).argmin(axis=-1).astype(np.uint8)  # (n, 4, 16)
    qs = q[..., :8] | (q[..., 8:] << 4)  # low nibbles: values 0-7 of the sub-block, high: 8-15
    blocks = np.concatenate([d, qs.reshape(-1, 32)], axis=-1)
    return blocks.reshape(*data.shape[:-1], data.shape[-1] // 64 * 36)


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


def _finish(w: GGUFWriter, path: str | Path) -> Path:
    """Write the header, the metadata and the tensors, in that order, and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_tiny_model(arch: str, path: str | Path, seed: int = 0, qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
                     n_layers: int | None = None) -> Path:
    """Write a tiny `arch` model to path. Matrices use qtype; norms and biases stay F32.
    n_layers (not gemma4): fewer blocks for tests whose cost is per block (the fixtures use the default)."""
    if arch in MOE_ARCHITECTURES:
        return write_tiny_moe(arch, path, seed, qtype)
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

    return _finish(w, path)


# Tiny Gemma 4: 8 layers, sliding (s) and global (g) as below; the last 3 share KV in the E2B
# style (llama.cpp's rule: a sliding one reads layer 3, a global one layer 4).
GEMMA4_LAYER_TYPES = "ssgsgssg"
GEMMA4_SHARED_KV = 3


def _gemma4_metadata(w, dim: int, ffn, n_heads: int, kv_heads: list[int], hd_full: int, hd_swa: int, swa: list[bool],
                     n_shared: int, per_layer: int, experts: tuple[int, int, int] | None = None) -> None:
    """The gemma4 keys of the tiny writers, in the order the fixtures' files were written
    (experts: (width, count, used) of a 26B-A4B-style file, right after the FFN width)."""
    w.add_block_count(len(swa))
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    if experts is not None:
        w.add_expert_feed_forward_length(experts[0])
        w.add_expert_count(experts[1])
        w.add_expert_used_count(experts[2])
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
    w.add_embedding_length_per_layer_input(per_layer)
    w.add_final_logit_softcapping(30.0)


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
    _gemma4_metadata(w, dim, ffn, n_heads, kv_heads, hd_full, hd_swa, swa, n_shared, per_layer if e2b_style else 0)
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

    return _finish(w, path)



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
    return _finish(w, out)


# Tiny routed-expert shape: 16 experts of width 32, 4 chosen per token.
MOE_EXPERTS, MOE_USED, MOE_WIDTH = 16, 4, 32


def write_tiny_moe(arch: str, path: str | Path, seed: int = 0,
                   qtype: GGMLQuantizationType = GGMLQuantizationType.F32) -> Path:
    """A tiny `qwen3moe` (Qwen3-30B-A3B style): 2 qwen3 attention blocks (head size 32, per-head
    Q/K norms) each with a router over MOE_EXPERTS SwiGLU experts, MOE_USED chosen per token, no
    shared expert. Expert tensors are 3-D as llama.cpp lays them out ([row length, rows,
    experts]); the router stays F32 like the converter writes it."""
    if arch == "gemma4-moe":
        return _write_gemma4_moe(path, seed, qtype)
    rng = np.random.RandomState(seed)
    dim, n_heads, n_kv, head_dim, n_layers = 64, 4, 2, 32, 2
    n_exp, used, width = MOE_EXPERTS, MOE_USED, MOE_WIDTH
    fp4 = qtype in (GGMLQuantizationType.MXFP4, GGMLQuantizationType.NVFP4)
    if qtype == GGMLQuantizationType.NVFP4:
        width = 64  # NVFP4 rows are whole blocks of 64 (the down projection's rows are `width` long)
    tokens, types, merges = _tokens()
    n_vocab = len(tokens)

    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(width * used)
    w.add_expert_feed_forward_length(width)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(used)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    _add_byte_tokenizer(w, tokens, types, merges)
    # FP4: the experts only, the other matrices Q8_0 (as llama.cpp's MXFP4_MOE files).
    matrix, vector = _random_tensors(w, rng, GGMLQuantizationType.Q8_0 if fp4 else qtype)

    def experts(name: str, rows: int, cols: int, scale: float) -> None:
        data = (rng.standard_normal((n_exp, rows, cols)) * scale).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, _quantize(data, qtype), raw_dtype=qtype)

    matrix("token_embd.weight", n_vocab, dim, 1.0)
    vector("output_norm.weight", dim, 1.0, 0.1)
    # Logits of spread ~8 (as gemma4's tiny model): greedy steps far from near-ties.
    matrix("output.weight", n_vocab, dim, 1.0)
    for i in range(n_layers):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", dim, 1.0, 0.1)
        matrix(p + "attn_q.weight", n_heads * head_dim, dim, dim**-0.5)
        matrix(p + "attn_k.weight", n_kv * head_dim, dim, dim**-0.5)
        matrix(p + "attn_v.weight", n_kv * head_dim, dim, dim**-0.5)
        matrix(p + "attn_output.weight", dim, n_heads * head_dim, (n_heads * head_dim) ** -0.5)
        vector(p + "attn_q_norm.weight", head_dim, 1.0, 0.1)
        vector(p + "attn_k_norm.weight", head_dim, 1.0, 0.1)
        vector(p + "ffn_norm.weight", dim, 1.0, 0.1)
        # The router: logits of spread ~2, so the top-k boundary is rarely a near-tie.
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((n_exp, dim)) * 2 * dim**-0.5).astype(np.float32))
        experts(p + "ffn_gate_exps.weight", width, dim, dim**-0.5)
        experts(p + "ffn_up_exps.weight", width, dim, dim**-0.5)
        experts(p + "ffn_down_exps.weight", dim, width, width**-0.5)

    return _finish(w, path)


GEMMA4_MOE_LAYER_TYPES = "sgsg"


def _write_gemma4_moe(path: str | Path, seed: int, qtype: GGMLQuantizationType) -> Path:
    """A tiny Gemma 4 26B-A4B-style `gemma4`: every layer has a dense GELU MLP (the shared expert,
    width 64) beside MOE_EXPERTS routed GELU experts (MOE_USED per token, width MOE_WIDTH, gate
    and up as one `ffn_gate_up_exps` tensor on even layers and two on odd ones), a router on the
    attention output with its own scale (`ffn_gate_inp.scale`), per-expert output scales
    (`ffn_down_exps.scale`) and the extra norms (pre_ffw_norm_2, post_ffw_norm_1/2). Attention as
    the 31B style (sliding head 16, global head 32 with V = K), no per-layer embeddings, no shared KV."""
    rng = np.random.RandomState(seed)
    dim, n_heads, hd_swa, hd_full, ffn = 64, 4, 16, 32, 64
    n_exp, used, width = MOE_EXPERTS, MOE_USED, MOE_WIDTH
    swa = [t == "s" for t in GEMMA4_MOE_LAYER_TYPES]
    n_layers = len(swa)
    kv_heads = [2 if s else 1 for s in swa]
    tokens, types, merges = _tokens()
    n_vocab = len(tokens)

    w = GGUFWriter(str(path), "gemma4")
    _gemma4_metadata(w, dim, [ffn] * n_layers, n_heads, kv_heads, hd_full, hd_swa, swa, 0, 0, experts=(width, n_exp, used))
    _add_byte_tokenizer(w, tokens, types, merges)
    matrix, vector = _random_tensors(w, rng, qtype)

    def experts(name: str, rows: int, cols: int, scale: float) -> None:
        data = (rng.standard_normal((n_exp, rows, cols)) * scale).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, _quantize(data, qtype), raw_dtype=qtype)

    matrix("token_embd.weight", n_vocab, dim, 1.0)
    vector("output_norm.weight", dim, 1.0, 0.1)
    matrix("output.weight", n_vocab, dim, 1.0)  # untied, as the E2B-style tiny model (varied greedy tokens)
    n_rot = hd_full // 2 // 4
    w.add_tensor("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32))
    for i in range(n_layers):
        p = f"blk.{i}."
        hd, nkv = (hd_swa, kv_heads[i]) if swa[i] else (hd_full, kv_heads[i])
        vector(p + "attn_norm.weight", dim, 1.0, 0.1)
        matrix(p + "attn_q.weight", n_heads * hd, dim, dim**-0.5)
        vector(p + "attn_q_norm.weight", hd, 1.0, 0.1)
        matrix(p + "attn_k.weight", nkv * hd, dim, dim**-0.5)
        vector(p + "attn_k_norm.weight", hd, 1.0, 0.1)
        if swa[i]:
            matrix(p + "attn_v.weight", nkv * hd, dim, dim**-0.5)
        matrix(p + "attn_output.weight", dim, n_heads * hd, (n_heads * hd) ** -0.5)
        vector(p + "post_attention_norm.weight", dim, 1.0, 0.1)
        vector(p + "ffn_norm.weight", dim, 1.0, 0.1)
        matrix(p + "ffn_gate.weight", ffn, dim, dim**-0.5)
        matrix(p + "ffn_up.weight", ffn, dim, dim**-0.5)
        matrix(p + "ffn_down.weight", dim, ffn, ffn**-0.5)
        vector(p + "post_ffw_norm_1.weight", dim, 1.0, 0.1)
        vector(p + "pre_ffw_norm_2.weight", dim, 1.0, 0.1)
        # The router sees rms_norm(x) / sqrt(dim) * scale (~unit norm): weights of 2 give logits of spread ~2.
        vector(p + "ffn_gate_inp.scale", dim, 1.0, 0.1)
        w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((n_exp, dim)) * 2).astype(np.float32))
        if i % 2 == 0:
            experts(p + "ffn_gate_up_exps.weight", 2 * width, dim, dim**-0.5)
        else:
            experts(p + "ffn_gate_exps.weight", width, dim, dim**-0.5)
            experts(p + "ffn_up_exps.weight", width, dim, dim**-0.5)
        experts(p + "ffn_down_exps.weight", dim, width, width**-0.5)
        vector(p + "ffn_down_exps.scale", n_exp, 1.0, 0.2)
        vector(p + "post_ffw_norm_2.weight", dim, 1.0, 0.1)
        vector(p + "post_ffw_norm.weight", dim, 1.0, 0.1)

    return _finish(w, path)


def tiny_prompt(n: int = 24, seed: int = 1) -> list[int]:
    """A fixed token sequence longer than gemma3's tiny window of 8."""
    return [int(t) for t in np.random.RandomState(seed).randint(0, N_VOCAB_BYTES, size=n)]


# Tiny state-space models (tallow/ssm_spec.py): written by their own function so every file
# above stays byte-identical. Mamba-1: dim 64, d_inner 128 (llama.cpp wants 2 x dim), 16
# states, conv kernel 4, dt rank 4. Mamba-2: 8 heads of 16 in 2 groups, 16 states. Falcon-H1:
# the Mamba-2 mixer (one group) beside llama-style attention (4 heads of 16, 2 KV heads) in
# every block, then a SwiGLU MLP of 128 (its multipliers are folded into the weights by
# llama.cpp's converter, so the file has none).
SSM_ARCHITECTURES = ("mamba", "mamba2", "falcon-h1")


def write_tiny_ssm(arch: str, path: str | Path, seed: int = 0, qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
                   n_layers: int = 2, shape: dict | None = None) -> Path:
    """A tiny random-weight `mamba`, `mamba2` or `falcon-h1` model. Matrices use qtype; the conv kernel, A,
    D, norms and biases stay F32 (as llama.cpp's quantizer leaves them). A and the dt bias are
    drawn the way Mamba initializes them (A = -exp(log 1..d_state), dt in [1e-3, 1e-1]), so the
    states neither vanish nor explode over a few dozen tokens. `shape` overrides the sizes below
    by name (dim, d_inner, d_state, n_head, n_heads, n_kv, head_dim, ffn, dt_rank, context:
    scripts/gpu_ssmgpu.py's mid-size models)."""
    if arch not in SSM_ARCHITECTURES:
        raise ValueError(arch)
    rng = np.random.RandomState(seed)
    dim, d_inner, d_state, d_conv = 64, 128, 16, 4
    n_head, n_group = 8, (1 if arch == "falcon-h1" else 2)  # mamba2, falcon-h1
    hybrid = arch == "falcon-h1"
    n_heads, n_kv, head_dim, ffn = 4, 2, 16, 128  # falcon-h1's attention and MLP
    if shape:
        dim, d_inner, d_state = shape.get("dim", dim), shape.get("d_inner", d_inner), shape.get("d_state", d_state)
        n_head, n_heads, n_kv = shape.get("n_head", n_head), shape.get("n_heads", n_heads), shape.get("n_kv", n_kv)
        head_dim, ffn = shape.get("head_dim", head_dim), shape.get("ffn", ffn)
    dt_rank = (shape or {}).get("dt_rank", 4) if arch == "mamba" else n_head
    tokens, types, merges = _tokens()
    n_vocab = len(tokens)

    w = GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_context_length((shape or {}).get("context", 256))
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn if hybrid else 0)
    w.add_head_count(n_heads if hybrid else 0)
    if hybrid:
        w.add_head_count_kv(n_kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_freq_base(10000.0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    if arch != "mamba":
        w.add_ssm_group_count(n_group)
    else:
        w.add_ssm_dt_b_c_rms(False)
    w.add_layer_norm_rms_eps(1e-5)
    _add_byte_tokenizer(w, tokens, types, merges)
    matrix, vector = _random_tensors(w, rng, qtype)

    def f32(name: str, data: np.ndarray) -> None:
        w.add_tensor(name, data.astype(np.float32))

    def dt_bias(n: int) -> np.ndarray:  # softplus^-1 of dt drawn log-uniform in [1e-3, 1e-1]
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))
        return dt + np.log(-np.expm1(-dt))

    conv_ch = d_inner if arch == "mamba" else d_inner + 2 * n_group * d_state
    matrix("token_embd.weight", n_vocab, dim, 1.0)
    vector("output_norm.weight", dim, 1.0, 0.1)
    matrix("output.weight", n_vocab, dim, dim**-0.5)
    for i in range(n_layers):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", dim, 1.0, 0.1)
        if hybrid:
            matrix(p + "attn_q.weight", n_heads * head_dim, dim, dim**-0.5)
            matrix(p + "attn_k.weight", n_kv * head_dim, dim, dim**-0.5)
            matrix(p + "attn_v.weight", n_kv * head_dim, dim, dim**-0.5)
            matrix(p + "attn_output.weight", dim, n_heads * head_dim, (n_heads * head_dim) ** -0.5)
        if arch == "mamba":
            matrix(p + "ssm_in.weight", 2 * d_inner, dim, dim**-0.5)
        else:
            matrix(p + "ssm_in.weight", d_inner + conv_ch + n_head, dim, dim**-0.5)
        f32(p + "ssm_conv1d.weight", rng.standard_normal((conv_ch, d_conv)) * d_conv**-0.5)
        vector(p + "ssm_conv1d.bias", conv_ch, 0.0, 0.1)
        if arch == "mamba":
            matrix(p + "ssm_x.weight", dt_rank + 2 * d_state, d_inner, d_inner**-0.5)
            if qtype == GGMLQuantizationType.F32 or dt_rank % 32:  # too narrow for a quantized block: F32
                f32(p + "ssm_dt.weight", rng.standard_normal((d_inner, dt_rank)) * dt_rank**-0.5)
            else:
                matrix(p + "ssm_dt.weight", d_inner, dt_rank, dt_rank**-0.5)
            f32(p + "ssm_dt.bias", dt_bias(d_inner))
            a = -np.tile(np.arange(1, d_state + 1, dtype=np.float64), (d_inner, 1)) * np.exp(rng.standard_normal((d_inner, d_state)) * 0.1)
            f32(p + "ssm_a", a)
            f32(p + "ssm_d", 1.0 + rng.standard_normal(d_inner) * 0.1)
        else:
            f32(p + "ssm_dt.bias", dt_bias(n_head))
            f32(p + "ssm_a", -np.exp(rng.uniform(0.0, np.log(16.0), (n_head, 1))))
            f32(p + "ssm_d", 1.0 + rng.standard_normal((n_head, 1)) * 0.1)
            f32(p + "ssm_norm.weight", 1.0 + rng.standard_normal((n_group, d_inner // n_group)) * 0.1)
        matrix(p + "ssm_out.weight", dim, d_inner, d_inner**-0.5)
        if hybrid:
            # `blk.N.ffn_norm`, without `.weight`: llama.cpp's converter maps Falcon-H1's whole
            # `pre_ff_layernorm.weight` to that name, and its falcon-h1 loader asks for it.
            vector(p + "ffn_norm", dim, 1.0, 0.1)
            matrix(p + "ffn_gate.weight", ffn, dim, dim**-0.5)
            matrix(p + "ffn_up.weight", ffn, dim, dim**-0.5)
            matrix(p + "ffn_down.weight", dim, ffn, ffn**-0.5)

    return _finish(w, path)
