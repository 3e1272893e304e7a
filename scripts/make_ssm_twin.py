#!/usr/bin/env python3
"""Twins of the architecture study's state-space and hybrid models (issue 17): GGUFs with the
metadata keys, tensor names, shapes and quant types a real Q4_K_M file of the model has, and
random data (block scales kept sane, decays negative so states stay finite). A twin times and
sizes like the real model and means nothing: use it for speed and memory, never for text.

    python scripts/make_ssm_twin.py mamba-1.4b OUT.gguf
    python scripts/make_ssm_twin.py falcon-h1-0.5b OUT.gguf [--seed 0]
    python scripts/make_ssm_twin.py falcon-h1-3b --table      # the tensor table and sizes, no file
    python scripts/make_ssm_twin.py all OUT_DIR               # the five, as OUT_DIR/<name>.gguf

Where each fact comes from:

- The shapes: the published config.json of each checkpoint (CONFIGS below, field for field, with
  where each was read; the Hugging Face pages are not reachable from here, so copies quoted in
  public repositories, found through the code search, and transformers' Falcon-H1 documentation
  table (depth, width, heads, KV heads, Mamba heads, head sizes, d_state per size)).
- The metadata keys: llama.cpp b11434's converter, conversion/mamba.py (MambaModel,
  Mamba2Model.set_gguf_parameters) and conversion/falcon_h1.py (FalconH1Model): mamba writes
  context_length 2**20 ("arbitrary"), feed_forward_length 0 and head_count 0; falcon-h1 writes
  vocab_size, the real max_position_embeddings, intermediate_size, the attention heads and head
  size, rope.freq_base, and ssm.time_step_rank = mamba_d_ssm / mamba_d_head (the Mamba heads).
- The tensors: llama.cpp b11434 src/models/mamba.cpp and falcon-h1.cpp (load_arch_tensors), and
  the converter's reshapes: Mamba-1 ssm_a (d_inner, d_state) and ssm_d (d_inner); Mamba-2 ssm_a
  and ssm_d (n_head, 1); ssm_norm (n_group, d_inner / n_group) when mamba_rms_norm; Falcon-H1's
  `blk.N.ffn_norm` without a `.weight` suffix (the converter maps the whole pre_ff_layernorm.weight
  to it). Mamba ties its output to token_embd (the converter drops an equal lm_head); Falcon-H1
  does not (tie_word_embeddings false).
- The quant types: llama.cpp b11434 src/llama-quant.cpp, Q4_K_M: Q4_K by default; only names
  ending in "weight" are quantized, never "_norm.weight" nor ssm_conv1d (so ssm_a, ssm_d, the
  conv kernel, biases, norms and Falcon-H1's suffix-less ffn_norm stay F32, as the converter
  writes them); output.weight, and token_embd when tied (Mamba), Q6_K; an untied token_embd keeps
  Q4_K; attn_v and ffn_down Q6_K where usemore_bits(i, n); a row not a multiple of 256 falls
  back (tensor_type_fallback) Q4_K -> Q5_0: Mamba's ssm_dt.weight (rows of dt_rank = 128).
- The vocabulary: the real tokenizers are not here. The twin carries a byte-level BPE vocabulary
  of exactly vocab_size tokens (GPT-2's 256 byte symbols, then two-symbol merges, the last two
  BOS and EOS), so llama.cpp and tallow load it and token_embd/output have the real row count.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from twin_gguf import Tensor, more_bits, random_blocks, start_gguf  # noqa: E402

# The published config.json fields each twin uses.
CONFIGS = {
    # state-spaces/mamba-1.4b-hf: d_model 2048, 48 layers, expand 2 (d_inner 4096), d_state 16,
    # d_conv 4, dt_rank ceil(2048/16) = 128, vocab 50280 (50277 padded to a multiple of 8), tied
    # embeddings, layer_norm_epsilon 1e-5 (the Mamba paper's 1.4B row: 48 layers, d_model 2048).
    "mamba-1.4b": dict(arch="mamba", hidden_size=2048, num_hidden_layers=48, intermediate_size=4096, state_size=16,
                       conv_kernel=4, time_step_rank=128, vocab_size=50280, layer_norm_epsilon=1e-5,
                       tie_word_embeddings=True),
    # tiiuae/Falcon-H1-0.5B-Instruct: the whole config.json is quoted in NVIDIA Megatron-Bridge's
    # tests (FALCON_H1_500M_CONFIG). 521 M parameters with these numbers (the published figure).
    "falcon-h1-0.5b": dict(arch="falcon-h1", hidden_size=1024, num_hidden_layers=36, intermediate_size=2048,
                           num_attention_heads=8, num_key_value_heads=2, head_dim=64, mamba_d_ssm=1536,
                           mamba_n_heads=24, mamba_d_head=64, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4,
                           mamba_conv_bias=True, mamba_rms_norm=False, vocab_size=32784,
                           max_position_embeddings=16384, rope_theta=1e11, rms_norm_eps=1e-5,
                           tie_word_embeddings=False),
    # tiiuae/Falcon-H1-1.5B-Instruct: the fields quoted in public test fixtures (hidden 2048, 24
    # layers, intermediate 4608, 8 heads / 2 KV of 128, Mamba 48 heads of 64, d_state 256, 1 group,
    # vocab 65537); context 128K (transformers' table). mamba_rms_norm is not in the quotes: as 0.5B.
    "falcon-h1-1.5b": dict(arch="falcon-h1", hidden_size=2048, num_hidden_layers=24, intermediate_size=4608,
                           num_attention_heads=8, num_key_value_heads=2, head_dim=128, mamba_d_ssm=3072,
                           mamba_n_heads=48, mamba_d_head=64, mamba_d_state=256, mamba_n_groups=1, mamba_d_conv=4,
                           mamba_conv_bias=True, mamba_rms_norm=False, vocab_size=65537,
                           max_position_embeddings=131072, rope_theta=1e11, rms_norm_eps=1e-5,
                           tie_word_embeddings=False),
    # tiiuae/Falcon-H1-1.5B-Deep-Instruct: 66 layers, hidden 1280, 6 heads / 2 KV of 128, Mamba 24
    # heads of 64, d_state 256 (transformers' table); vocab 65536, untied (a quoted profile of the
    # Base checkpoint); intermediate_size 3072 is NOT in any quote found: it is the width that gives
    # the published 1.55 B parameters with the rest (mamba_d_ssm = 24 x 64).
    "falcon-h1-1.5b-deep": dict(arch="falcon-h1", hidden_size=1280, num_hidden_layers=66, intermediate_size=3072,
                                num_attention_heads=6, num_key_value_heads=2, head_dim=128, mamba_d_ssm=1536,
                                mamba_n_heads=24, mamba_d_head=64, mamba_d_state=256, mamba_n_groups=1,
                                mamba_d_conv=4, mamba_conv_bias=True, mamba_rms_norm=False, vocab_size=65536,
                                max_position_embeddings=131072, rope_theta=1e11, rms_norm_eps=1e-5,
                                tie_word_embeddings=False),
    # tiiuae/Falcon-H1-3B-Instruct: quoted fixture FALCON_H1_3B_HF (hidden 2560, 32 layers,
    # intermediate 6144, 10 heads / 2 KV of 128, Mamba 32 heads of 128 = d_ssm 4096, d_state 256,
    # 1 group, vocab 65536, untied, context 131072).
    "falcon-h1-3b": dict(arch="falcon-h1", hidden_size=2560, num_hidden_layers=32, intermediate_size=6144,
                         num_attention_heads=10, num_key_value_heads=2, head_dim=128, mamba_d_ssm=4096,
                         mamba_n_heads=32, mamba_d_head=128, mamba_d_state=256, mamba_n_groups=1, mamba_d_conv=4,
                         mamba_conv_bias=True, mamba_rms_norm=False, vocab_size=65536,
                         max_position_embeddings=131072, rope_theta=1e11, rms_norm_eps=1e-5,
                         tie_word_embeddings=False),
}

def _q4k(cols: int) -> str:
    """Q4_K, or tensor_type_fallback's Q5_0 for rows that are not whole 256-blocks."""
    return "Q4_K" if cols % 256 == 0 else "Q5_0"


def tensor_table(c: dict) -> list[Tensor]:
    """The tensors of a real Q4_K_M file of config c, in the converter's order."""
    dim, n = c["hidden_size"], c["num_hidden_layers"]
    t: list[Tensor] = []
    if c["arch"] == "mamba":
        d, ds, r = c["intermediate_size"], c["state_size"], c["time_step_rank"]
        assert c["tie_word_embeddings"] and d == 2 * dim
        t.append(Tensor("token_embd.weight", (c["vocab_size"], dim), "Q6_K"))  # tied: the output's type
        for i in range(n):
            p = f"blk.{i}."
            t += [Tensor(p + "attn_norm.weight", (dim,), "F32"),
                  Tensor(p + "ssm_in.weight", (2 * d, dim), _q4k(dim)),
                  Tensor(p + "ssm_conv1d.weight", (d, c["conv_kernel"]), "F32"),
                  Tensor(p + "ssm_conv1d.bias", (d,), "F32"),
                  Tensor(p + "ssm_x.weight", (r + 2 * ds, d), _q4k(d)),
                  Tensor(p + "ssm_dt.weight", (d, r), _q4k(r)),
                  Tensor(p + "ssm_dt.bias", (d,), "F32"),
                  Tensor(p + "ssm_a", (d, ds), "F32"),
                  Tensor(p + "ssm_d", (d,), "F32"),
                  Tensor(p + "ssm_out.weight", (dim, d), _q4k(d))]
        return t + [Tensor("output_norm.weight", (dim,), "F32")]
    d, nh, ng, ds = c["mamba_d_ssm"], c["mamba_n_heads"], c["mamba_n_groups"], c["mamba_d_state"]
    assert d == nh * c["mamba_d_head"] and not c["tie_word_embeddings"]
    hd, heads, kv, ffn = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    conv_ch = d + 2 * ng * ds
    t.append(Tensor("token_embd.weight", (c["vocab_size"], dim), _q4k(dim)))  # untied: Q4_K_M keeps Q4_K
    for i in range(n):
        p = f"blk.{i}."
        t += [Tensor(p + "attn_norm.weight", (dim,), "F32"),
              Tensor(p + "attn_q.weight", (heads * hd, dim), _q4k(dim)),
              Tensor(p + "attn_k.weight", (kv * hd, dim), _q4k(dim)),
              Tensor(p + "attn_v.weight", (kv * hd, dim), "Q6_K" if more_bits(i, n) else _q4k(dim)),
              Tensor(p + "attn_output.weight", (dim, heads * hd), _q4k(heads * hd)),
              Tensor(p + "ssm_in.weight", (2 * d + 2 * ng * ds + nh, dim), _q4k(dim)),
              Tensor(p + "ssm_conv1d.weight", (conv_ch, c["mamba_d_conv"]), "F32")]
        if c["mamba_conv_bias"]:
            t.append(Tensor(p + "ssm_conv1d.bias", (conv_ch,), "F32"))
        t += [Tensor(p + "ssm_dt.bias", (nh,), "F32"), Tensor(p + "ssm_a", (nh, 1), "F32"),
              Tensor(p + "ssm_d", (nh, 1), "F32")]
        if c["mamba_rms_norm"]:
            t.append(Tensor(p + "ssm_norm.weight", (ng, d // ng), "F32"))
        t += [Tensor(p + "ssm_out.weight", (dim, d), _q4k(d)),
              Tensor(p + "ffn_norm", (dim,), "F32"),
              Tensor(p + "ffn_gate.weight", (ffn, dim), _q4k(dim)),
              Tensor(p + "ffn_up.weight", (ffn, dim), _q4k(dim)),
              Tensor(p + "ffn_down.weight", (dim, ffn), "Q6_K" if more_bits(i, n) else _q4k(ffn))]
    return t + [Tensor("output_norm.weight", (dim,), "F32"), Tensor("output.weight", (c["vocab_size"], dim), "Q6_K")]


def byte_bpe_vocab(n: int) -> tuple[list[str], list[int], list[str]]:
    """n tokens: GPT-2's 256 byte symbols, two-symbol merges of them, BOS and EOS last."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    symbols, extra = [], 0
    for b in range(256):
        symbols.append(chr(b) if b in printable else chr(256 + extra))
        extra += b not in printable
    pairs = [(a, b) for a in symbols for b in symbols][: n - 256 - 2]
    assert len(pairs) == n - 256 - 2, n
    tokens = symbols + [a + b for a, b in pairs] + ["<|begin_of_text|>", "<|end_of_text|>"]
    types = [1] * (n - 2) + [3, 3]  # NORMAL, then two CONTROL
    return tokens, types, [f"{a} {b}" for a, b in pairs]


def add_metadata(w, c: dict, name: str) -> None:
    """The keys llama.cpp's converter (and llama-quantize's file_type) write for config c."""
    dim, n = c["hidden_size"], c["num_hidden_layers"]
    w.add_string("general.name", f"{name} twin (random weights)")
    w.add_uint32("general.file_type", 15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    w.add_uint32("general.quantization_version", 2)
    w.add_block_count(n)
    w.add_embedding_length(dim)
    if c["arch"] == "mamba":
        w.add_context_length(2**20)
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        w.add_ssm_conv_kernel(c["conv_kernel"])
        w.add_ssm_inner_size(c["intermediate_size"])
        w.add_ssm_state_size(c["state_size"])
        w.add_ssm_time_step_rank(c["time_step_rank"])
        w.add_layer_norm_rms_eps(c["layer_norm_epsilon"])
        w.add_ssm_dt_b_c_rms(False)
    else:
        w.add_vocab_size(c["vocab_size"])
        w.add_context_length(c["max_position_embeddings"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_ssm_conv_kernel(c["mamba_d_conv"])
        w.add_ssm_inner_size(c["mamba_d_ssm"])
        w.add_ssm_state_size(c["mamba_d_state"])
        w.add_ssm_time_step_rank(c["mamba_d_ssm"] // c["mamba_d_head"])
        w.add_ssm_group_count(c["mamba_n_groups"])
        w.add_layer_norm_rms_eps(c["rms_norm_eps"])
        w.add_rope_freq_base(c["rope_theta"])
    tokens, types, merges = byte_bpe_vocab(c["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(False)


def _random_data(t: Tensor, c: dict, rng: np.random.Generator, chunk: int = 1 << 26):
    """The tensor's bytes in chunks: random quant blocks with their fp16 scales set to 0.002; A
    negative as Mamba initializes it (-1..-d_state per channel; per head -exp(U(0, log 16))), the
    dt bias softplus^-1 of dt in [1e-3, 1e-1], D and norms 1.0, other floats N(0, 0.02)."""
    if t.type != "F32":
        yield from random_blocks(t, rng, chunk)
        return
    n = int(np.prod(t.shape))
    if t.name.endswith("ssm_a"):
        v = (-np.tile(np.arange(1, t.shape[1] + 1), t.shape[0]) if c["arch"] == "mamba"
             else -np.exp(rng.uniform(0.0, np.log(16.0), n)))
    elif t.name.endswith("ssm_dt.bias"):
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))
        v = dt + np.log(-np.expm1(-dt))
    elif "norm" in t.name or t.name.endswith("ssm_d"):
        v = np.ones(n)
    elif "conv1d.weight" in t.name:
        v = rng.standard_normal(n) * 0.5
    else:
        v = rng.standard_normal(n) * 0.02
    yield v.astype(np.float32).tobytes()


def write_twin(name: str, out: Path, seed: int = 0) -> Path:
    c = CONFIGS[name]
    table = tensor_table(c)
    w, f, align = start_gguf(out, c["arch"], lambda w: add_metadata(w, c, name), table)
    rng = np.random.default_rng(seed)
    for t in table:
        for part in _random_data(t, c, rng):
            f.write(part)
        f.write(b"\0" * (-t.nbytes % align))
    w.close()
    return out


def parameters(c: dict) -> int:
    return sum(int(np.prod(t.shape)) for t in tensor_table(c))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=sorted(CONFIGS) + ["all"])
    p.add_argument("out", nargs="?", type=Path, help="the GGUF to write (with `all`: a folder)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--table", action="store_true", help="print the tensor table and its sizes, write nothing")
    a = p.parse_args()
    names = sorted(CONFIGS) if a.model == "all" else [a.model]
    for name in names:
        table = tensor_table(CONFIGS[name])
        if a.table or a.out is None:
            by_type: dict[str, int] = {}
            for t in table:
                if a.model != "all":
                    print(f"{t.name:32s} {t.type:5s} {'x'.join(map(str, t.shape[::-1]))}")  # ggml order
                by_type[t.type] = by_type.get(t.type, 0) + t.nbytes
            print(f"{name}: {len(table)} tensors, {parameters(CONFIGS[name]) / 1e6:.0f} M parameters, "
                  f"{sum(by_type.values()):,} bytes: " + ", ".join(f"{k} {v:,}" for k, v in sorted(by_type.items())))
            continue
        out = a.out / f"{name}.gguf" if a.model == "all" else a.out
        out.parent.mkdir(parents=True, exist_ok=True)
        start = time.time()
        write_twin(name, out, a.seed)
        print(f"{out}: {name} twin, {len(table)} tensors, {out.stat().st_size:,} bytes, {time.time() - start:.1f} s",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
