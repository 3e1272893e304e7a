#!/usr/bin/env python3
"""Mixture-of-experts twins: Qwen3-30B-A3B (Q4_K_M) and Gemma 4 26B-A4B (NVFP4, Q4_K_M) shaped
GGUFs with the metadata, tensor names, shapes and quant types of llama.cpp's files and random data
(block scales kept sane). A twin times like the real model and means nothing: speed only.

    python scripts/make_moe_twin.py NAME OUT.gguf                 # 15-18 GB, written in streaming chunks
    python scripts/make_moe_twin.py NAME OUT.gguf --header-only   # the header, data left a sparse hole
    python scripts/make_moe_twin.py NAME --table                  # tensor table and sizes, no file
    python scripts/make_moe_twin.py NAME OUT.gguf --layers 2 --experts 16   # scaled down (tests)
    python scripts/make_moe_twin.py --measure-load OUT.gguf --ctx 65536     # plan vs allocated (cuda)

NAME: qwen3-30b-a3b (Q4_K_M), gemma4-26b-nvfp4, gemma4-26b-q4km.

Where each number comes from:
- Qwen3-30B-A3B, its published config.json (Qwen/Qwen3-30B-A3B; the same figures as the Megatron
  arguments quoted in public training repositories, e.g. slime's scripts/models/qwen3-30B-A3B.sh):
  hidden 2048, 48 layers, 32 heads, 4 KV heads, head_dim 128, moe_intermediate_size 768,
  128 experts, 8 per token, norm_topk_prob, vocab 151936 (untied), rope_theta 1e6, rms eps 1e-6,
  max_position_embeddings 40960.
- Gemma 4 26B-A4B, its published text_config (google/gemma-4-26B-A4B, as quoted in public code):
  hidden 2816, 30 layers, 16 heads, 8 KV heads on sliding layers and 2 on global ones
  (num_global_key_value_heads), head_dim 256 / global_head_dim 512, intermediate_size 2112 (the
  dense MLP beside the experts), moe_intermediate_size 704, 128 experts, top 8, sliding_window
  1024, layer_types 5 sliding then 1 full, x5, attention_k_eq_v (global layers: V is K, no
  attn_v), vocab 262144 (tied), final_logit_softcapping 30, rope 1e4 sliding / 1e6 global with
  partial_rotary_factor 0.25, max_position_embeddings 262144, rms eps 1e-6.
- Tensors: llama.cpp b11434 llama-model.cpp (qwen3moe) and src/models/gemma4.cpp
  load_arch_tensors (26B: ffn_gate_inp + its .scale, pre_ffw_norm_2, post_ffw_norm_1/2,
  ffn_gate_up_exps or ffn_gate_exps + ffn_up_exps, ffn_down_exps + .scale (per_expert_scale,
  conversion/gemma.py), the dense MLP as the shared expert, layer_output_scale).
- Q4_K_M types: llama.cpp b11434 src/llama-quant.cpp: Q4_K by default; output (or the tied
  token_embd) Q6_K; attn_v and every ffn_down* (ffn_down_exps too; the layer read from the name as
  n_expert > 1) Q6_K where use_more_bits; rows not a multiple of 256 fall back Q4_K -> Q5_0,
  Q6_K -> Q8_0 (Gemma 4's 704- and 2112-long down rows); ffn_gate_inp never quantized (F32);
  norms F32. The converter writes Gemma 4's experts as one ffn_gate_up_exps.
- NVFP4 (Gemma 4): no published GGUF layout was at hand. Assumed: the routed experts NVFP4 with
  the FP32 per-expert scales the converter writes from weight_scale_2 (ffn_gate_exps.scale,
  ffn_up_exps.scale, ffn_down_exps.scale with per_expert_scale folded in), every other matrix
  Q8_0 (as llama.cpp's MXFP4_MOE recipe treats non-expert tensors).
- Vocabularies: Gemma 4's is llama.cpp's vocabulary file (tests/fixtures/shared/vocab); for Qwen3
  no vocabulary file is at hand, so a byte-level BPE of 256 tokens padded to 151936 with unused
  tokens (the output projection, what decode reads, has the real size).

Data: one 64 MiB pool of random blocks per type, scale fields set (fp16 0.002, UE4M3 scales in
[2^-3, 2^-1]), written cyclically: disk speed, not numpy per block.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from twin_gguf import BLOCKS, SCALE, Tensor, more_bits, start_gguf  # noqa: E402

CONFIGS = {
    "qwen3-30b-a3b": dict(arch="qwen3moe", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128,
                          expert_ffn=768, experts=128, used=8, vocab=151936, tied=False, rope=1e6, eps=1e-6,
                          ctx=40960),
    "gemma4-26b-a4b": dict(arch="gemma4", hidden=2816, layers=30, heads=16, kv_heads=8, kv_heads_global=2,
                           head_dim=256, head_dim_global=512, ffn=2112, expert_ffn=704, experts=128, used=8,
                           sliding_window=1024, pattern=(["s"] * 5 + ["f"]), vocab=262144, tied=True,
                           softcap=30.0, rope_swa=1e4, rope=1e6, partial_rotary=0.25, eps=1e-6, ctx=262144),
}
VARIANTS = {"qwen3-30b-a3b": ("qwen3-30b-a3b", "Q4_K_M"), "gemma4-26b-nvfp4": ("gemma4-26b-a4b", "NVFP4"),
            "gemma4-26b-q4km": ("gemma4-26b-a4b", "Q4_K_M")}

FILE_TYPE = {"Q4_K_M": 15, "NVFP4": 7}  # LLAMA_FTYPE_MOSTLY_Q4_K_M; NVFP4 files: most bytes FP4, rest Q8_0 (Q8_0's id)


def _k(kind: str, cols: int) -> str:
    """A k-quant for a row of `cols`, or llama-quant's fallback when cols is not a multiple of 256."""
    if cols % 256 == 0:
        return kind
    return {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[kind]


def scaled(c: dict, layers: int | None, experts: int | None, vocab: int | None) -> dict:
    c = dict(c)
    if layers:
        c["layers"] = layers
    if experts:
        c["experts"], c["used"] = experts, min(c["used"], experts)
    if vocab:
        c["vocab"] = vocab
    return c


def qwen3moe_table(c: dict) -> list[Tensor]:
    d, n, hd, e, w = c["hidden"], c["layers"], c["head_dim"], c["experts"], c["expert_ffn"]
    t = [Tensor("token_embd.weight", (c["vocab"], d), "Q4_K"), Tensor("output_norm.weight", (d,), "F32"),
         Tensor("output.weight", (c["vocab"], d), "Q6_K")]
    for i in range(n):
        p = f"blk.{i}."
        t += [Tensor(p + "attn_norm.weight", (d,), "F32"),
              Tensor(p + "attn_q.weight", (c["heads"] * hd, d), "Q4_K"),
              Tensor(p + "attn_k.weight", (c["kv_heads"] * hd, d), "Q4_K"),
              Tensor(p + "attn_v.weight", (c["kv_heads"] * hd, d), "Q6_K" if more_bits(i, n) else "Q4_K"),
              Tensor(p + "attn_output.weight", (d, c["heads"] * hd), "Q4_K"),
              Tensor(p + "attn_q_norm.weight", (hd,), "F32"), Tensor(p + "attn_k_norm.weight", (hd,), "F32"),
              Tensor(p + "ffn_norm.weight", (d,), "F32"),
              Tensor(p + "ffn_gate_inp.weight", (e, d), "F32"),
              Tensor(p + "ffn_gate_exps.weight", (e, w, d), "Q4_K"),
              Tensor(p + "ffn_up_exps.weight", (e, w, d), "Q4_K"),
              Tensor(p + "ffn_down_exps.weight", (e, d, w), _k("Q6_K" if more_bits(i, n) else "Q4_K", w))]
    return t


def gemma4_table(c: dict, quant: str) -> list[Tensor]:
    d, n, e, w, ffn = c["hidden"], c["layers"], c["experts"], c["expert_ffn"], c["ffn"]
    nv = quant == "NVFP4"
    dense = (lambda kind, cols: "Q8_0") if nv else _k
    swa = [c["pattern"][i % len(c["pattern"])] == "s" for i in range(n)]
    n_v = sum(swa)  # attn_v tensors present: the sliding layers' (global ones use K as V)
    t = [Tensor("token_embd.weight", (c["vocab"], d), "Q8_0" if nv else "Q6_K"),  # tied: the output's type
         Tensor("rope_freqs.weight", (c["head_dim_global"] // 2,), "F32"), Tensor("output_norm.weight", (d,), "F32")]
    i_v = 0
    for i in range(n):
        p = f"blk.{i}."
        hd = c["head_dim"] if swa[i] else c["head_dim_global"]
        kv = c["kv_heads"] if swa[i] else c["kv_heads_global"]
        t += [Tensor(p + "attn_norm.weight", (d,), "F32"), Tensor(p + "attn_q.weight", (c["heads"] * hd, d), dense("Q4_K", d)),
              Tensor(p + "attn_k.weight", (kv * hd, d), dense("Q4_K", d))]
        if swa[i]:
            t.append(Tensor(p + "attn_v.weight", (kv * hd, d), dense("Q6_K" if more_bits(i_v, n_v) else "Q4_K", d)))
            i_v += 1
        t += [Tensor(p + "attn_q_norm.weight", (hd,), "F32"), Tensor(p + "attn_k_norm.weight", (hd,), "F32"),
              Tensor(p + "attn_output.weight", (d, c["heads"] * hd), dense("Q4_K", c["heads"] * hd)),
              Tensor(p + "post_attention_norm.weight", (d,), "F32"),
              Tensor(p + "ffn_norm.weight", (d,), "F32"),
              Tensor(p + "ffn_gate.weight", (ffn, d), dense("Q4_K", d)), Tensor(p + "ffn_up.weight", (ffn, d), dense("Q4_K", d)),
              Tensor(p + "ffn_down.weight", (d, ffn), dense("Q6_K" if more_bits(i, n) else "Q4_K", ffn)),
              Tensor(p + "post_ffw_norm_1.weight", (d,), "F32"), Tensor(p + "pre_ffw_norm_2.weight", (d,), "F32"),
              Tensor(p + "ffn_gate_inp.weight", (e, d), "F32"), Tensor(p + "ffn_gate_inp.scale", (d,), "F32")]
        if nv:
            t += [Tensor(p + "ffn_gate_exps.weight", (e, w, d), "NVFP4"), Tensor(p + "ffn_gate_exps.scale", (e,), "F32"),
                  Tensor(p + "ffn_up_exps.weight", (e, w, d), "NVFP4"), Tensor(p + "ffn_up_exps.scale", (e,), "F32"),
                  Tensor(p + "ffn_down_exps.weight", (e, d, w), "NVFP4")]
        else:
            t += [Tensor(p + "ffn_gate_up_exps.weight", (e, 2 * w, d), "Q4_K"),
                  Tensor(p + "ffn_down_exps.weight", (e, d, w), _k("Q6_K" if more_bits(i, n) else "Q4_K", w))]
        t += [Tensor(p + "ffn_down_exps.scale", (e,), "F32"), Tensor(p + "post_ffw_norm_2.weight", (d,), "F32"),
              Tensor(p + "post_ffw_norm.weight", (d,), "F32"), Tensor(p + "layer_output_scale.weight", (1,), "F32")]
    return t


def tensor_table(name: str, c: dict) -> list[Tensor]:
    _, quant = VARIANTS[name]
    return qwen3moe_table(c) if c["arch"] == "qwen3moe" else gemma4_table(c, quant)


def add_metadata(w, name: str, c: dict, vocab_path: Path | None) -> None:
    _, quant = VARIANTS[name]
    w.add_string("general.name", f"{name} twin (random weights)")
    w.add_uint32("general.file_type", FILE_TYPE[quant])
    w.add_uint32("general.quantization_version", 2)
    w.add_block_count(c["layers"])
    w.add_context_length(c["ctx"])
    w.add_embedding_length(c["hidden"])
    w.add_head_count(c["heads"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_expert_feed_forward_length(c["expert_ffn"])
    w.add_expert_count(c["experts"])
    w.add_expert_used_count(c["used"])
    if c["arch"] == "qwen3moe":
        w.add_feed_forward_length(c["expert_ffn"] * c["used"])
        w.add_head_count_kv(c["kv_heads"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_rope_freq_base(c["rope"])
        w.add_expert_weights_norm(True)
        _add_filler_vocab(w, c["vocab"])
        return
    swa = [c["pattern"][i % len(c["pattern"])] == "s" for i in range(c["layers"])]
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count_kv([c["kv_heads"] if s else c["kv_heads_global"] for s in swa])
    w.add_key_length(c["head_dim_global"])
    w.add_value_length(c["head_dim_global"])
    w.add_key_length_swa(c["head_dim"])
    w.add_value_length_swa(c["head_dim"])
    w.add_rope_freq_base(c["rope"])
    w.add_rope_freq_base_swa(c["rope_swa"])
    w.add_rope_dimension_count(c["head_dim_global"])
    w.add_rope_dimension_count_swa(c["head_dim"])
    w.add_final_logit_softcapping(c["softcap"])
    w.add_sliding_window(c["sliding_window"])
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    from make_gemma4_twin import add_tokenizer

    add_tokenizer(w, vocab_path, c["vocab"])


def _add_filler_vocab(w, n: int) -> None:
    """A byte-level BPE vocabulary (GPT-2's byte alphabet) padded with unused tokens to n."""
    from gguf import TokenType

    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    tokens, extra = [], 0
    for b in range(256):
        tokens.append(chr(b) if b in printable else chr(256 + extra))
        extra += b not in printable
    tokens += ["Ġt", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # the one merge's result, then the specials
    types = [int(TokenType.NORMAL)] * 257 + [int(TokenType.CONTROL)] * 3
    tokens += [f"<|unused_{i}|>" for i in range(n - len(tokens))]
    types += [int(TokenType.UNUSED)] * (n - len(types))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(259)
    w.add_add_bos_token(False)


POOL_BYTES = 64 << 20


def _pool(kind: str, rng: np.random.Generator) -> bytes:
    """64 MiB of random blocks of `kind` with their scale fields sane."""
    _, size, scales = BLOCKS[kind]
    n = POOL_BYTES // size
    b = np.frombuffer(rng.bytes(n * size), np.uint8).reshape(n, size).copy()
    for o in scales:
        b[:, o : o + 2] = SCALE
    if kind == "NVFP4":  # UE4M3 exponents 4..6 (values 2^-3..2^-1, halved by the format), any mantissa
        b[:, :4] = (rng.integers(4, 7, (n, 4)) << 3 | rng.integers(0, 8, (n, 4))).astype(np.uint8)
    return b.tobytes()


def _floats(t: Tensor, rng: np.random.Generator, c: dict) -> bytes:
    n = int(np.prod(t.shape))
    if t.name == "rope_freqs.weight":
        n_rot = int(c["head_dim_global"] * c["partial_rotary"] / 2)
        return np.array([1.0] * n_rot + [1e30] * (n - n_rot), np.float32).tobytes()
    if t.name.endswith("exps.scale"):
        return np.full(n, 0.05, np.float32).tobytes()
    if "norm" in t.name or "scale" in t.name:
        return np.ones(n, np.float32).tobytes()
    return (rng.standard_normal(n, np.float32) * 0.02).tobytes()


def write_twin(name: str, c: dict, out: Path, vocab: Path | None = None, header_only: bool = False, seed: int = 0) -> int:
    """Write the twin; returns the file's size. header_only: the data region left as a hole."""
    table = tensor_table(name, c)
    with tempfile.TemporaryDirectory() as tmp:
        if c["arch"] == "gemma4" and vocab is None:
            from make_gemma4_twin import unpack_vocab

            vocab = unpack_vocab(Path(tmp) / "vocab.gguf")
        w, f, align = start_gguf(out, c["arch"], lambda w: add_metadata(w, name, c, vocab), table)
        start = f.tell()
        end = start + sum(t.nbytes + (-t.nbytes % align) for t in table)
        rng = np.random.default_rng(seed)
        pools: dict[str, memoryview] = {}
        at = 0
        for t in table:
            if t.type == "F32":  # small, and read at load (rope_freqs, norms): written even header-only
                f.write(_floats(t, rng, c))
            elif header_only:
                f.seek(t.nbytes, os.SEEK_CUR)  # a hole: no bytes on disk
            else:
                pool = pools.get(t.type)
                if pool is None:
                    pool = pools[t.type] = memoryview(_pool(t.type, rng))
                size = BLOCKS[t.type][1]
                usable = len(pool) // size * size
                left = t.nbytes
                while left:  # whole blocks, starting where the last tensor left the pool
                    at = at % usable // size * size
                    n = min(left, usable - at)
                    f.write(pool[at : at + n])
                    at += n
                    left -= n
            f.write(b"\0" * (-t.nbytes % align))
        assert f.tell() == end
        f.truncate(end)
        w.close()
    return out.stat().st_size


def measure_load(path: Path, ctx: int) -> int:
    """Load on cuda; print the plan's weights + KV against what the load allocated, and the plan's
    total against the peak after a 512-token prefill and 16 decode steps."""
    import torch

    import tallow
    from tallow.memory.budget import gpu_dequant_scratch_bytes, plan_memory

    plan = plan_memory(str(path), ctx, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    t0 = time.time()
    llm = tallow.load(str(path), ctx=ctx, device="cuda", progress=False)
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated() - base
    # a load holds the weights (RoPE tables included), the KV and the scratch's dequantization
    # buffer (allocated at load); the rest of the scratch is prefill's activations
    at_load = plan.weights + plan.kv + gpu_dequant_scratch_bytes(plan.header)
    print(f"load {time.time() - t0:.1f} s; planned weights + KV + dequant buffer {at_load / 2**30:.3f} GiB "
          f"(weights {plan.weights / 2**30:.3f}, KV {plan.kv / 2**30:.3f}), allocated after load "
          f"{resident / 2**30:.3f} GiB ({resident - at_load:+,} bytes, {resident / at_load - 1:+.3%})")
    torch.cuda.reset_peak_memory_stats()
    llm.generate(list(range(1000, 1512)), max_tokens=16, temperature=0)
    peak = torch.cuda.max_memory_allocated() - base
    planned = plan.weights + plan.kv + plan.scratch
    print(f"planned weights + KV + scratch {planned / 2**30:.3f} GiB, peak after pp512 + tg16 {peak / 2**30:.3f} GiB "
          f"({peak / planned - 1:+.2%})")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", nargs="?", choices=sorted(VARIANTS))
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument("--table", action="store_true", help="print the tensor table and sizes, write nothing")
    p.add_argument("--header-only", action="store_true", help="write the header; the data region stays a sparse hole")
    p.add_argument("--layers", type=int, help="fewer layers (a scaled-down twin)")
    p.add_argument("--experts", type=int, help="fewer experts (a scaled-down twin)")
    p.add_argument("--vocab-size", type=int, help="a smaller vocabulary (qwen3 only: Gemma 4's is its vocabulary file)")
    p.add_argument("--vocab", type=Path, help="Gemma 4: llama.cpp's vocabulary GGUF (default: the tests' copy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--measure-load", type=Path, metavar="GGUF", help="load GGUF on cuda: plan against allocation")
    p.add_argument("--ctx", type=int, default=65536)
    a = p.parse_args()
    if a.measure_load:
        return measure_load(a.measure_load, a.ctx)
    if a.name is None:
        p.error("NAME is required")
    base, _ = VARIANTS[a.name]
    if a.vocab_size and CONFIGS[base]["arch"] != "qwen3moe":
        p.error("--vocab-size is for the qwen3 twin only")
    c = scaled(CONFIGS[base], a.layers, a.experts, a.vocab_size)
    table = tensor_table(a.name, c)
    if a.table or a.out is None:
        by_type: dict[str, int] = {}
        for t in table:
            print(f"{t.name:36s} {t.type:5s} {'x'.join(map(str, t.shape[::-1]))}")
            by_type[t.type] = by_type.get(t.type, 0) + t.nbytes
        experts = sum(t.nbytes for t in table if len(t.shape) == 3)
        # a decode step reads one row of an untied embedding (a tied one is the output projection)
        other = sum(by_type.values()) - experts - (0 if c["tied"] else table[0].nbytes)
        print(f"{len(table)} tensors, {sum(by_type.values()):,} bytes: " + ", ".join(f"{k} {v:,}" for k, v in sorted(by_type.items())))
        print(f"a token reads {other + experts * c['used'] // c['experts']:,} bytes (all but the experts and an "
              f"untied embedding, and {c['used']}/{c['experts']} of the experts' {experts:,})")
        return 0
    start = time.time()
    size = write_twin(a.name, c, a.out, a.vocab, a.header_only, a.seed)
    print(f"{a.out}: {a.name} twin, {len(table)} tensors, {size:,} bytes{' (header only: sparse)' if a.header_only else ''}, "
          f"{time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
