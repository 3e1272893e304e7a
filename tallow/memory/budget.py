"""The memory account: every byte tallow will hold, counted from the GGUF header before loading.

Why before: a model that does not fit must be refused with a clear sentence and exit code 3,
not killed by the OOM killer halfway through an answer. So the account is computed from the
header and the spec alone — no weight is read — and must answer in well under a second even
for a 1.5B model with a 150k-token vocabulary (the header's string tables are skipped, not
decoded; see `scan_header`).

The parts, each derived from what the code allocates:

* weights:  every 2-D weight as the CPU kernels hold it after repacking (the rules of
  `kernels/cpu/linear.make_linear` and `quant/pack.py`); norms and biases as fp32; the token
  embedding stays in the file and costs nothing (unless tied to the output projection, which is
  then repacked like any linear): its rows are read with pread per lookup, never faulted in
  through the map, whose fault-around would make most of the table resident uncounted. A warm
  start maps the same packed bytes from the weight cache (memory/weight_cache.py) instead of
  building them on the heap: file-backed pages rather than heap, but counted in the resident size
  (what the OOM killer sees) once touched, so the account is the same either way
  (tests/test_weight_cache.py checks it).
* kv:       the KV pool in its dtype (f16, bf16, int8 or fp8 codes plus their per-position-head
            fp32 scales): global layers for every position of the context, sliding-window
            layers a ring of window + prefill chunk - 1 slots (`KVPool`'s layout).
* scratch:  the transient activations of one prefill chunk at the deepest position (`scratch_bytes`).
* prefix cache: the in-memory prefix cache *is* the KV pool (0 extra); the persistent store
  stages one layer of K/V at a time, plus the token list.
* runtime:  tokenizer tables, parsed metadata and tallow's own modules (beyond torch), measured.
* reserve:  what the user keeps free for co-tenants.

The torch runtime of the process itself (~220 MiB, loaded before any model) is not part of
the account: the budget is for what tallow adds.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

from gguf import GGMLQuantizationType as QT

from .. import switches
from ..errors import MemoryBudgetError, UsageError
from ..families.tensors import OUTPUT, PER_LAYER_TOKEN_EMBD, TOKEN_EMBD, is_tied, model_roles
from ..gguf_file import GGUFFile
from ..numerics_choice import choose as choose_numerics
from ..numerics_mode import GGML
from ..spec import ModelSpec, spec_from_gguf
from .kv_format import kv_format, user_kv_format

MiB = 1 << 20
GiB = 1 << 30

# Kept equal to quant/pack.py and kernels/cpu/linear.py (a test checks it); repeated here so
# that `tallow plan` never imports torch (~1-3 s).
INT4_TYPES: frozenset[QT] = frozenset({QT.Q4_0, QT.Q4_1, QT.Q4_K})
INT8_TYPES: frozenset[QT] = frozenset({QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q2_K, QT.Q3_K, QT.Q5_K, QT.Q6_K})
INT4X2_TYPES: frozenset[QT] = frozenset({QT.Q5_0, QT.Q5_1, QT.Q5_K, QT.Q8_0})
FLOAT_TYPES: frozenset[QT] = frozenset({QT.F32, QT.F16, QT.BF16})
INT4_GROUP = 32
INT4_ROW_ALIGN = 16

# Runtime: measured on the three reference models (VmRSS after load and malloc_trim, minus
# VmRSS after `import torch`, minus weights and KV): 34 MiB (smollm2, 49k tokens + 49k merges),
# 75 MiB (gemma3, 262k tokens with scores), 66 MiB (qwen2.5, 152k tokens + 151k merges). The
# three unknowns solve to ~19 MiB of modules plus ~222 B per vocabulary entry (the metadata
# string, its decoded copy and the tokenizer's dict entries) plus ~104 B per BPE merge.
RUNTIME_BASE = 19 * MiB
RUNTIME_PER_TOKEN = 222
RUNTIME_PER_MERGE = 104

DEFAULT_PREFILL_CHUNK = 512



# ------------------------------------------------------------------------------ header scan


def scan_header(path: str | os.PathLike) -> GGUFFile:
    """The metadata and tensor table of a GGUF file, its string arrays left undecoded (their
    lengths are all the plan needs; decoding a 262k-entry vocabulary costs ~0.3 s)."""
    return GGUFFile(path, skip_strings=True)


# ------------------------------------------------------------------------------ the parts


def _env_off(var: str) -> bool:
    return switches.value(var) is False


def _env_on(var: str) -> bool:
    return switches.value(var) is True


def _kernel_ops() -> tuple[bool, bool]:
    """Whether the int4/int8 aten ops exist. Only asked of torch when it is already imported:
    torch 2.11-2.14, the versions tallow supports, all have them."""
    torch = sys.modules.get("torch")
    if torch is None:
        return True, True
    aten = torch.ops.aten
    return (hasattr(aten, "_convert_weight_to_int4pack_for_cpu") and hasattr(aten, "_weight_int4pack_mm_for_cpu"),
            hasattr(aten, "_weight_int8pack_mm"))


def linear_kind(qtype: QT, mode: str | None = None) -> str:
    """The representation `make_linear` picks for a weight of this type: int4, int4x2, int8,
    dense_bf16, dense_f32 or reference — the same decision, made without torch."""
    mode = mode or "auto"
    has_int4, has_int8 = _kernel_ops()
    if mode == "reference" or (mode == "auto" and _env_on("TALLOW_REFERENCE")):
        return "reference"
    if qtype == QT.MXFP4 and has_int4 and mode in ("auto", "int8g") and not _env_off("TALLOW_MXFP4_INT8G"):
        return "int8g"  # exact group-32 int8 codes (kernels/cpu/linear.py GroupInt8Linear)
    if qtype in FLOAT_TYPES:
        return "dense_bf16" if qtype == QT.BF16 else "dense_f32"
    if mode == "dense":
        return "dense_bf16"
    if qtype in INT4_TYPES and has_int4 and mode in ("auto", "int4", "int4x2") and (mode != "auto" or not _env_off("TALLOW_INT4")):
        return "int4"
    if qtype in INT4X2_TYPES and has_int4 and (mode == "int4x2" or (mode == "auto" and _env_on("TALLOW_INT4X2"))):
        return "int4x2"
    if has_int8 and (mode == "int8" or (mode == "auto" and qtype in INT8_TYPES and not _env_off("TALLOW_INT8"))):
        return "int8"
    return "dense_bf16"


def linear_bytes(n_rows: int, n_cols: int, kind: str) -> int:
    """Resident bytes of an (n_rows, n_cols) weight held as `kind` (see pack_int4/pack_int8).

    int4: rows padded to 16; K/2 bytes of codes and K/32 bf16 (scale, zero) pairs per row.
    int4x2 doubles K. int8: K bytes and one bf16 scale per row.
    """
    if kind in ("int4", "int4x2", "int8g"):
        k = n_cols * (1 if kind == "int4" else 2)
        n_pad = -(-n_rows // INT4_ROW_ALIGN) * INT4_ROW_ALIGN
        return n_pad * (k // 2) + (k // INT4_GROUP) * n_pad * 2 * 2
    if kind == "int8":
        return n_rows * n_cols + n_rows * 2
    if kind == "dense_bf16":
        return n_rows * n_cols * 2
    return n_rows * n_cols * 4  # dense_f32, reference


def _c_kernel_bytes(t, linear_mode: str | None, output: bool = False, ggml: bool = False) -> int | None:
    """The C kernel (kernels/cpu/ggml_dot.py) reads a wrapped weight from the file map: its file
    bytes, instead of (ggml: llama.cpp's numerics, numerics_choice.py; the output projection;
    Q4_K/Q6_K under TALLOW_CPU_GEMM) or on top of (the default numerics' other types: prefill's)
    the torch layer."""
    if linear_mode not in (None, "auto") or len(t.shape) != 2 or t.n_rows <= 1 or t.qtype not in _C_KERNEL_TYPES:
        return None
    if not switches.enabled("TALLOW_CPU_GGML_DOT"):  # ggml_dot.wanted(), without importing torch
        return None
    from ..kernels.cpu import ggml_dot  # wanted: weights are about to be loaded, torch is there

    if not ggml_dot.usable():
        return None
    # TALLOW_CPU_GEMM: Q4_K/Q6_K prefill in C as well (kernels/cpu/linear.make_linear), no torch layer
    return t.n_bytes if ggml or output or ggml_dot.prefills(QT(t.qtype)) else t.n_bytes + linear_bytes(t.n_rows, t.n_cols, linear_kind(t.qtype, linear_mode))


_C_KERNEL_TYPES = frozenset({QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K})  # ggml_dot.TYPES


def weights_bytes(header: GGUFFile, linear_mode: str | None = None, ggml: bool = False) -> int:
    """Bytes of every weight as resident after loading (the embedding, read row by row from the file: 0)."""
    tied, roles = is_tied(header.tensors), model_roles(header.tensors)
    total = 0
    for t in header.tensors.values():
        role = roles.get(t.name)
        if (role == TOKEN_EMBD and not tied) or role == PER_LAYER_TOKEN_EMBD:
            continue  # only its rows, read from the file on lookup (gemma4's per-layer table too)
        if len(t.shape) == 3:  # routed experts: one linear per expert (kernels/cpu/moe.py), each padded alone
            total += t.shape[2] * linear_bytes(t.shape[1], t.n_cols, linear_kind(t.qtype, linear_mode))
        elif len(t.shape) >= 2 and t.n_rows > 1:
            c_bytes = _c_kernel_bytes(t, linear_mode, role == OUTPUT or (tied and role == TOKEN_EMBD), ggml)
            total += c_bytes if c_bytes is not None else linear_bytes(t.n_rows, t.n_cols, linear_kind(t.qtype, linear_mode))
        else:
            total += t.n_rows * t.n_cols * 4  # norms and biases, dequantized to fp32
    return total


def dequantizes_for_prefill(header: GGUFFile, linear_mode: str | None = None, ggml: bool = False) -> bool:
    """Whether some weight prefills through a torch int4/int8 layer, whose products share the
    dequantization tiles (PREFILL_DEQUANT_SCRATCH); not when the C kernel prefills every one."""
    tied, roles = is_tied(header.tensors), model_roles(header.tensors)
    for t in header.tensors.values():
        role = roles.get(t.name)
        if (role == TOKEN_EMBD and not tied) or role == PER_LAYER_TOKEN_EMBD or len(t.shape) < 2 or t.n_rows <= 1:
            continue
        if linear_kind(t.qtype, linear_mode) not in ("int4", "int4x2", "int8"):
            continue
        if len(t.shape) == 3:
            return True  # routed experts: torch layers (kernels/cpu/moe.py)
        c_bytes = _c_kernel_bytes(t, linear_mode, role == OUTPUT or (tied and role == TOKEN_EMBD), ggml)
        if c_bytes != t.n_bytes:  # a torch layer beside (or instead of) the C kernel's bytes
            return True
    return False


def kv_dtype_arg(name: str | None) -> str | None:
    """A --kv-dtype value checked and made canonical (None: the model's default)."""
    if name is None:
        return None
    return user_kv_format(name).name


def _ring_enabled() -> bool:
    return switches.enabled("TALLOW_KV_RING")


def kv_layer_slots(spec: ModelSpec, n_ctx: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                   ring: bool | None = None) -> list[int]:
    """Slots per layer as `KVPool` allocates them (kv_pool.layer_capacity): the context, or
    min(context, window + chunk - 1) for a sliding-window layer held as a ring."""
    ring = _ring_enabled() if ring is None else ring
    chunk = max(1, min(prefill_chunk, n_ctx))
    return [min(n_ctx, layer.sliding_window + chunk - 1) if ring and layer.sliding_window else n_ctx
            for layer in spec.layers]


def kv_bytes(spec: ModelSpec, n_ctx: int, kv_dtype: str = "f16", prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
             ring: bool | None = None) -> int:
    """The KV pool: K and V codes of every layer that owns a cache, for every slot, in that
    layer's head sizes, plus (int8/fp8) one fp32 scale per slot and head for K and for V (as
    `KVPool` allocates it; gemma4's shared-KV layers read an earlier layer's cache and add nothing)."""
    fmt = kv_format(kv_dtype)
    return sum(slots * fmt.bytes_per_position(layer.n_kv_heads, layer.head_dim, layer.v_head_dim)
               for layer, slots in zip(spec.layers, kv_layer_slots(spec, n_ctx, prefill_chunk, ring)) if layer.owns_kv)


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str = "f16", shared: bool = True) -> int:
    """Bytes one position costs across the layers that own a cache, were every layer global
    (no ring savings). shared=False: as if every layer owned one (what KV sharing saves)."""
    fmt = kv_format(kv_dtype)
    return sum(fmt.bytes_per_position(layer.n_kv_heads, layer.head_dim, layer.v_head_dim) for layer in spec.layers
               if layer.owns_kv or not shared)


def scratch_bytes(spec: ModelSpec, n_ctx: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK, kv_dtype: str = "f16",
                  dequant_tiles: bool = True) -> int:
    """Peak transient activations of one prefill chunk of C tokens whose keys reach position N.

    Blocks run one after another and free their temporaries, so the peak is the residual
    stream plus the larger of one block's attention and MLP phases (all fp32 unless noted):
      residual: x, the normed h and the new x:                    3 · C · dim · 4
      attention (none in a model without attention layers, Mamba):
                 q, k, v and their rotated copies                  2 · C · (H + 2·H_kv) · hd · 4
                 the pool's K/V up to N as fp32 (KVPool.view)      2 · H_kv · N · hd · 4
                 the mask: bool, SDPA's float copy, for the rows
                 of one call (attention_query_rows: T <= C)        T · N · (1 + 4)
                 the output and its bf16 copy for attn_output      C · H · hd · (4 + 2)
      MLP:       gate, up, act(gate), the product (fp32) and the
                 bf16 kernel outputs / input copies                C · ffn · (4·4 + 2)
                 int8/fp8 KV: the codes as fp32 before their scales  2 · H_kv · N · hd · 4
      logits:    the last position only, plus the sampler's sort   vocab · 4 · 4
      the torch prefill's dequantization tiles, where a weight
      prefills through a torch int4/int8 layer (dequantizes_for_prefill)  PREFILL_DEQUANT_SCRATCH
    Logits for every position (`forward(all_logits=True)`, used only by conformance tests)
    would add C · vocab · 4 and are not part of the engine's account.

    One chunk's activations are counted twice (x2). With glibc's defaults the heap kept the
    freed temporaries of the chunk before resident beside the live ones (its mmap threshold is
    dynamic: after the first chunk large temporaries come from the heap, and freed runs stay):
    measured 2026-11-29 (ctx 2048, a 2000-token prompt) 75.2 / 113.9 / 208.3 MiB of prefill
    peak on smollm2 / gemma3 / qwen2.5 against 75.4 / 89.6 / 203.8 derived with the x2. The
    heap's free runs now go back to the OS after every chunk (TALLOW_HEAP_TRIM, memory/heap.py),
    yet what one chunk holds at once is still more than the formula above: measured (VmHWM
    during a chunk over VmRSS before it, less the chunk's new K/V pages) 36 MiB on smollm2 and
    119 on qwen2.5 at 1-2k against 16.9 and 87.8 derived (1.4-2.1x), and on Falcon-H1-0.5B
    growing with the depth, 50 at 6k to 70-114 at 12-16k against 40.9 — while torch's live
    tensors stay within the formula (33.8 / 42.8 MiB at 2k / 8k): the excess is the heap's
    fragments within a chunk, which TALLOW_BOUNDED_HEAP=1 removes (docs/performance.md,
    sessions 23-24). So the x2 stays, as the measured envelope rather than the heap's copy.
    """
    return (2 * chunk_activation_bytes(spec, n_ctx, prefill_chunk, kv_dtype) + logits_bytes(spec)
            + (PREFILL_DEQUANT_SCRATCH if dequant_tiles else 0) + TORCH_CODE_PAGES)


# torch's code paged into the process by loading and the first prefill (file-backed, counted in
# its resident size): smollm2 at ctx 2048, the same packages, measured 21 MiB of file-backed
# growth where torch's libraries were cold in the page cache and 52 MiB where they had just been
# installed (a fault then maps whole cached neighbourhoods). The runtime constants were fitted
# on the cold case; this adds half the difference, so either case lands within 10% (2026-11-29).
TORCH_CODE_PAGES = 16 * MiB


def chunk_activation_bytes(spec: ModelSpec, n_ctx: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                           kv_dtype: str = "f16") -> int:
    """The residual stream plus the larger block phase of one prefill chunk (scratch_bytes' table)."""
    c = min(prefill_chunk, n_ctx)
    n = n_ctx
    h = max((layer.n_heads for layer in spec.layers), default=0)  # 0: no attention layers (mamba)
    hkv = max((layer.n_kv_heads for layer in spec.layers), default=0)
    hd = max((max(layer.head_dim, layer.v_head_dim) for layer in spec.layers), default=0)
    residual = 3 * c * spec.dim * 4
    mask_rows = min(-(-c // _QUERY_BLOCK) * _QUERY_BLOCK, attention_query_rows(n))
    attention = 2 * c * (h + 2 * hkv) * hd * 4 + 2 * hkv * n * hd * 4 + mask_rows * n * (1 + 4) + c * h * hd * 6 if h else 0
    if h and kv_format(kv_dtype).scaled:
        attention += 2 * hkv * n * hd * 4
    mlp = c * spec.ffn_dim * (4 * 4 + 2)
    if spec.n_experts:  # routed experts (kernels/cpu/moe.py): every row's k outputs, then weighted
        mlp = max(mlp, c * spec.n_experts_used * (2 * spec.dim * 4 + spec.expert_ffn_dim * (4 * 4 + 2)))
    if spec.ssm is not None:
        mlp = max(mlp, spec.ssm.mixer_activation_bytes(c))
    return residual + max(attention, mlp)


# The most bytes one SDPA call's mask may take in CPU prefill attention: a bool per (query, key)
# and SDPA's float copy of it. A chunk of 512 queries over 32k keys would take 80 MiB a call.
MASK_TILE_BYTES = 16 * MiB
_QUERY_BLOCK = 64  # layers.QUERY_BLOCK (repeated so planning never imports torch; a test checks it)


def attention_query_rows(n_keys: int) -> int:
    """How many query rows one prefill attention call takes over n_keys keys (models/step.py):
    as many whole query blocks as keep its mask within MASK_TILE_BYTES, at least one block."""
    rows = MASK_TILE_BYTES // (5 * max(n_keys, 1))
    return max(_QUERY_BLOCK, rows - rows % _QUERY_BLOCK)


def logits_bytes(spec: ModelSpec) -> int:
    """The last position's logits plus the sampler's sort."""
    return spec.vocab_size * 4 * 4


# kernels/cpu/dequant_matmul.py's shared tiles at their cap: SCRATCH_ELEMENTS bf16 weights plus
# half as many bytes of nibbles (repeated here so planning never imports torch; a test checks it).
PREFILL_DEQUANT_SCRATCH = (1 << 23) * 2 + (1 << 23)


def prefix_cache_bytes(spec: ModelSpec, n_ctx: int, kv_dtype: str = "f16") -> int:
    """Extra bytes of the prefix caches. In memory: none — the KV pool's resident tokens are
    the cache. On disk (kv_store): saving and hydrating stage one layer's K and V (and scales)
    of the used positions at a time, plus the token ids (a Python int and a list slot each)."""
    fmt = kv_format(kv_dtype)
    per_layer = max((fmt.bytes_per_position(layer.n_kv_heads, layer.head_dim, layer.v_head_dim) for layer in spec.layers),
                    default=0)
    return n_ctx * per_layer + n_ctx * 36


def runtime_bytes(header: GGUFFile) -> int:
    """Tokenizer tables, parsed metadata and tallow's modules (see RUNTIME_* above)."""
    tokens = header.get("tokenizer.ggml.tokens")
    merges = header.get("tokenizer.ggml.merges")
    return RUNTIME_BASE + RUNTIME_PER_TOKEN * (len(tokens) if tokens is not None else 0) + RUNTIME_PER_MERGE * (
        len(merges) if merges is not None else 0
    )


# ------------------------------------------------------------------------------ on a GPU

# Quant types the GPU keeps as GGUF byte planes (kernels/triton/planes.py repacks the blocks'
# bytes one for one); every other matrix is dequantized at load: F32/F16 to fp32, the rest bf16.
GPU_PLANE_TYPES = frozenset({QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q6_K})
# An allowance for what the free-memory figure does not yet include when the plan is made:
# cuBLAS workspaces, Triton's loaded kernels, the decode graph's pool. Not yet measured (the
# CUDA context itself exists by then: mem_get_info creates it).
GPU_RUNTIME = 512 * MiB


def gpu_weights_bytes(header: GGUFFile) -> int:
    """Bytes of the weights in GPU memory (kernels/gpu/linear.py): byte planes of the file's
    blocks, dense copies of types without a kernel, fp32 norms and biases; a tied output
    projection holds a second copy of the embedding's planes."""
    tied, roles = is_tied(header.tensors), model_roles(header.tensors)
    total = 0
    for t in header.tensors.values():
        if len(t.shape) >= 2 and t.n_rows > 1:
            if t.qtype in GPU_PLANE_TYPES or (len(t.shape) == 3 and t.qtype in (QT.MXFP4, QT.NVFP4)):
                size = t.n_bytes  # planes; routed experts' FP4 blocks as stored (kernels/gpu/moe.py)
            else:
                size = t.n_rows * t.n_cols * (4 if t.qtype in (QT.F32, QT.F16) else 2)
            total += size * (2 if tied and roles.get(t.name) == TOKEN_EMBD else 1)
        else:
            total += t.n_rows * t.n_cols * 4
    return total


def gpu_rope_bytes(spec: ModelSpec) -> int:
    """The RoPE tables a GPU model keeps from its load (models/base.py), for the whole trained
    context whatever the planned one: per distinct (base, rotated width, factors) cos and sin
    (n, rope_dim / 2) and their full-width forms (n, rope_dim), float32 (layers.RotaryTables).
    Gemma 4 26B-A4B's two tables at 262,144 positions: 2.25 GiB."""
    n = max(spec.context_length, 256)  # RotaryTables.ensure's growth from empty tables
    return sum(n * 3 * rope_dim * 4 for _, rope_dim, _ in {layer.rope_key for layer in spec.layers})


def gpu_dequant_scratch_bytes(header: GGUFFile) -> int:
    """The bf16 buffer prefill dequantizes each matrix (or a layer's stacked experts) into, sized
    for the largest and allocated at load (kernels/gpu/linear.Scratch): part of the scratch."""
    largest = max((t.n_rows * t.n_cols for t in header.tensors.values() if len(t.shape) >= 2 and t.n_rows > 1), default=0)
    return max(largest, _gpu_expert_stack(header)) * 2


def gpu_scratch_bytes(spec: ModelSpec, header: GGUFFile, n_ctx: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                      kv_dtype: str = "f16") -> int:
    """GPU transients: the bf16 buffer prefill dequantizes each matrix into (sized for the
    largest, kernels/gpu/linear.Scratch), and one prefill chunk's activations twice — the
    eager pass that warms a graph up and the prefill graphs' shared memory pool — with the
    CPU account's per-chunk formula (chunk_activation_bytes) plus the split prefill attention's
    partials, and the logits."""
    chunk = chunk_activation_bytes(spec, n_ctx, prefill_chunk, kv_dtype) + gpu_split_attention_bytes(spec, n_ctx, prefill_chunk)
    return gpu_dequant_scratch_bytes(header) + 2 * chunk + logits_bytes(spec)


# kernels/triton/prefill_attention.SPLIT_SPAN, repeated so planning never imports triton (a test checks it).
PREFILL_SPLIT_SPAN = 2048


def gpu_split_attention_bytes(spec: ModelSpec, n_ctx: int, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> int:
    """The split prefill attention's partials (TALLOW_PREFILL_SPLIT), its largest layer's: a layer whose
    block of queries can see more than one span of keys (its cache's slots, or a window's width plus
    the block, since a captured graph does not know the depth) keeps, per range, row and head, an fp32
    accumulator over the head's padded width and the running max and sum."""
    if _env_off("TALLOW_PREFILL_SPLIT"):
        return 0
    rows = max(1, min(prefill_chunk, n_ctx))
    most = 0
    for layer, slots in zip(spec.layers, kv_layer_slots(spec, n_ctx, prefill_chunk)):
        if not layer.n_heads:
            continue
        width = 1 << (layer.head_dim - 1).bit_length()  # triton.next_power_of_2
        block = 64 if width <= 128 else 32
        keys = layer.sliding_window + block if layer.sliding_window else slots
        ranges = -(-keys // PREFILL_SPLIT_SPAN)
        if ranges > 1:
            most = max(most, ranges * rows * layer.n_heads * (width + 2) * 4)
    return most


def _gpu_expert_stack(header: GGUFFile) -> int:
    """Elements of the largest stacked expert weight the grouped prefill dequantizes at once
    (kernels/gpu/moe.py): a layer's ffn_gate_exps and ffn_up_exps as one when they share a type."""
    largest = 0
    for t in header.tensors.values():
        if t.name.endswith("ffn_gate_exps.weight"):
            up = header.tensors.get(t.name.replace("ffn_gate_exps", "ffn_up_exps"))
            if up is not None and up.qtype == t.qtype and (t.qtype in GPU_PLANE_TYPES or t.qtype in (QT.MXFP4, QT.NVFP4)):
                largest = max(largest, (t.n_rows + up.n_rows) * t.n_cols)
    return largest


def gpu_free_bytes(device: str) -> int:
    """Free memory on the GPU now, as the driver reports it."""
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


# ------------------------------------------------------------------------------ the plan


@dataclass
class MemoryPlan:
    """The account for one model at one context. `total` is what tallow will hold; `limit`
    is the budget minus the reserve (None: no budget was set)."""

    model: str
    n_ctx: int
    weights: int
    kv: int
    scratch: int
    prefix_cache: int
    runtime: int
    reserve: int = 0
    budget: int | None = None
    budget_text: str = ""
    kv_bytes_per_token: int = 0
    spec: ModelSpec | None = field(default=None, repr=False)
    header: GGUFFile | None = field(default=None, repr=False)
    linear_mode: str | None = None
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    kv_dtype: str = "f16"
    device: str = "cpu"  # on a GPU: weights, KV and scratch are GPU memory, the budget the GPU's
    state: int = 0  # recurrent layers' fixed state and its checkpoints (ssm_spec.py; 0: none)

    @property
    def resident(self) -> int:
        """What stays resident after loading, before the first token (weights, KV, runtime)."""
        return self.weights + self.kv + self.state + self.runtime

    @property
    def total(self) -> int:
        """Everything tallow will hold at its peak: resident plus scratch and the prefix cache."""
        return self.resident + self.scratch + self.prefix_cache

    @property
    def limit(self) -> int | None:
        return None if self.budget is None else self.budget - self.reserve

    @property
    def fits(self) -> bool:
        return self.limit is None or self.total <= self.limit

    def parts(self) -> list[tuple[str, int]]:
        return [
            ("weights", self.weights),
            (f"KV for {self.n_ctx} tokens", self.kv),
        ] + ([("recurrent state", self.state)] if self.state else []) + [
            ("scratch", self.scratch),
            ("prefix cache", self.prefix_cache),
            ("runtime", self.runtime),
        ]

    def with_ctx(self, n_ctx: int) -> "MemoryPlan":
        """The same plan at another context (only KV, scratch and prefix cache change)."""
        if self.spec is None:
            raise ValueError("this plan has no spec to re-plan from")
        if self.device.startswith("cuda"):
            scratch = gpu_scratch_bytes(self.spec, self.header, n_ctx, self.prefill_chunk, self.kv_dtype)
            prefix = 0
        else:
            scratch = scratch_bytes(self.spec, n_ctx, self.prefill_chunk, self.kv_dtype)
            prefix = prefix_cache_bytes(self.spec, n_ctx, self.kv_dtype)
        return MemoryPlan(
            self.model, n_ctx, self.weights, kv_bytes(self.spec, n_ctx, self.kv_dtype, self.prefill_chunk),
            scratch, prefix, self.runtime, self.reserve, self.budget, self.budget_text,
            self.kv_bytes_per_token, self.spec, self.header, self.linear_mode, self.prefill_chunk, self.kv_dtype,
            self.device, self.state,
        )

    def largest_fitting_ctx(self) -> int:
        """The largest context (≥ 16, ≤ the model's) that fits the limit, or 0 if none does."""
        if self.limit is None or self.spec is None:
            return self.spec.context_length if self.spec else self.n_ctx
        lo, hi = 0, self.spec.context_length
        if self.with_ctx(16).total > self.limit:
            return 0
        lo = 16
        while lo < hi:  # total grows with ctx: bisect for the last ctx that fits
            mid = (lo + hi + 1) // 2
            if self.with_ctx(mid).total <= self.limit:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def refusal(self) -> str:
        """One sentence: what is needed, part by part, what the budget leaves, what would fit."""
        parts = " + ".join(f"{name} {fmt_bytes(n)}" for name, n in self.parts())
        room = f"the budget of {fmt_bytes(self.budget or 0)}"
        if self.budget_text:
            room += f" ({self.budget_text})"
        if self.reserve:
            room += f" minus the reserve of {fmt_bytes(self.reserve)} leaves {fmt_bytes(self.limit or 0)}"
        best = self.largest_fitting_ctx()
        if best:
            advice = f"the largest context that would fit is {best} tokens (--ctx {best})"
        else:
            advice = "no context fits: even 16 tokens would need " + fmt_bytes(self.with_ctx(16).total)
        return f"{self.model} needs {fmt_bytes(self.total)} ({parts}) but {room}; {advice}."

    def check(self) -> None:
        """Raise MemoryBudgetError (exit code 3) when the plan does not fit its budget."""
        if not self.fits:
            raise MemoryBudgetError(self.refusal())

    def describe(self) -> str:
        """The account as a small table, for `tallow plan`."""
        rows = [(name, n) for name, n in self.parts()]
        if self.reserve:
            rows.append(("reserve", self.reserve))
        width = max(len(name) for name, _ in rows)
        rings = ""
        if self.spec is not None and any(layer.sliding_window for layer in self.spec.layers):
            slots = kv_layer_slots(self.spec, self.n_ctx, self.prefill_chunk)
            n_ring = sum(1 for sl in slots if sl < self.n_ctx)
            if n_ring:
                rings = f"; {n_ring} of {len(slots)} layers sliding-window rings of {min(slots)} slots"
        if self.spec is not None and any(not layer.owns_kv for layer in self.spec.layers):
            owners = sum(1 for layer in self.spec.layers if layer.owns_kv)
            rings += (f"; {owners} of {len(self.spec.layers)} layers own a cache, the rest share one"
                      f" ({kv_bytes_per_token(self.spec, self.kv_dtype, shared=False)} bytes per token without sharing)")
        if self.spec is not None and self.spec.ssm is not None:
            ssm = self.spec.ssm
            rings += (f"; {len(ssm.layers)} recurrent layers of {ssm.layer_state_bytes} state bytes each, fixed,"
                      f" plus up to {_state_checkpoints()} checkpoints of it and one copy for a verification pass")
        where = f" in {self.device} memory" if self.device.startswith("cuda") else ""
        lines = [f"memory plan for {self.model}{where} at ctx {self.n_ctx} (KV {self.kv_dtype}: {self.kv_bytes_per_token}"
                 f" bytes per token over all layers{rings}):"]
        lines += [f"  {name:<{width}}  {fmt_bytes(n):>10}" for name, n in rows]
        lines.append(f"  {'total':<{width}}  {fmt_bytes(self.total + self.reserve):>10}")
        if self.budget is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            text = f" ({self.budget_text})" if self.budget_text else ""
            lines.append(f"  budget {fmt_bytes(self.budget)}{text}: {verdict}; largest context that fits: {self.largest_fitting_ctx()}")
        return "\n".join(lines)


def fmt_bytes(n: int) -> str:
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB"


# ------------------------------------------------------------------------------ budgets

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2, "mib": MiB,
          "g": 1000**3, "gb": 1000**3, "gib": GiB, "t": 1000**4, "tb": 1000**4, "tib": 1 << 40,
          "ki": 1 << 10, "mi": MiB, "gi": GiB, "ti": 1 << 40}


def mem_available() -> int:
    """MemAvailable from /proc/meminfo (what the kernel can give without swapping), else physical RAM."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_size(text: str | int | float | None, what: str = "--mem-budget", available=None) -> tuple[int | None, str]:
    """'3GiB', '1.5G', '800MB', '80%' (of MemAvailable now) or a byte count -> (bytes, description).

    Decimal units (GB) are powers of 1000 and binary ones (GiB) powers of 1024, as `free` does.
    """
    if text is None:
        return None, ""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"{what} must not be negative, not {text!r}.")
        return int(text), ""
    s = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)(%|[kmgt]?i?b?)", s)
    if not m or m.group(2) not in _UNITS and m.group(2) != "%":
        raise UsageError(f"{what} takes a size like 3GiB, 800MB or 80% (of available memory), not {text!r}.")
    number = float(m.group(1))
    if m.group(2) == "%":
        if not 0 < number <= 100:
            raise UsageError(f"{what} as a fraction must be between 0% and 100%, not {text!r}.")
        avail = (available or mem_available)()
        where = "free on the GPU" if available is not None else "available"
        return int(avail * number / 100), f"{number:g}% of {fmt_bytes(avail)} {where}"
    return int(number * _UNITS[m.group(2)]), ""


def plan_memory(
    source: "str | os.PathLike | GGUFFile",
    n_ctx: int | None = None,
    mem_budget: str | int | None = None,
    reserve: str | int | None = None,
    linear_mode: str | None = None,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    spec: ModelSpec | None = None,
    default_ctx: int = 4096,
    kv_dtype: str | None = None,
    device: str = "cpu",
    numerics: str | None = None,
) -> MemoryPlan:
    """The account for a GGUF file (path or scanned header) at a context, against a budget.

    mem_budget None means no limit (the plan is only described); the API applies
    `default_budget()` when the user gave none. On a GPU (device "cuda[:N]") the account is
    of GPU memory — weights as planes, KV, dequant scratch and prefill activations, the CUDA
    runtime — and a budget given as a fraction is of the GPU's free memory. (The host then
    holds only the tokenizer and the mapped file's pages, released after loading.)
    numerics: the model's arithmetic (numerics_choice.choose; None: chosen here), which decides
    whether torch copies of the weights are made beside the file's.
    """
    header = scan_header(source) if isinstance(source, (str, os.PathLike)) else source  # or an open GGUFFile
    spec = spec or spec_from_gguf(header)  # type: ignore[arg-type]  # duck-typed header
    ctx = n_ctx or min(spec.context_length, default_ctx)
    on_gpu = device.startswith("cuda")
    available = (lambda: gpu_free_bytes(device)) if on_gpu else None
    budget, budget_text = parse_size(mem_budget, "--mem-budget", available)
    reserve_bytes, _ = parse_size(reserve, "--reserve", available)
    kv_dtype = kv_dtype_arg(kv_dtype) or default_kv_dtype(header)
    ggml = not on_gpu and (numerics or choose_numerics(header, device, linear_mode)) == GGML
    return MemoryPlan(
        model=os.path.basename(header.path),
        n_ctx=ctx,
        weights=gpu_weights_bytes(header) + gpu_rope_bytes(spec) if on_gpu else weights_bytes(header, linear_mode, ggml),
        kv=kv_bytes(spec, ctx, kv_dtype, prefill_chunk),
        scratch=(gpu_scratch_bytes(spec, header, ctx, prefill_chunk, kv_dtype) if on_gpu else
                 scratch_bytes(spec, ctx, prefill_chunk, kv_dtype, dequantizes_for_prefill(header, linear_mode, ggml))),
        prefix_cache=0 if on_gpu else prefix_cache_bytes(spec, ctx, kv_dtype),
        runtime=GPU_RUNTIME if on_gpu else runtime_bytes(header),
        reserve=reserve_bytes or 0,
        budget=budget,
        budget_text=budget_text,
        kv_bytes_per_token=kv_bytes_per_token(spec, kv_dtype),
        spec=spec,
        header=header,
        linear_mode=linear_mode,
        prefill_chunk=prefill_chunk,
        kv_dtype=kv_dtype,
        device=device,
        state=state_bytes(spec),
    )


def _state_checkpoints() -> int:
    return int(switches.value("TALLOW_STATE_CHECKPOINTS"))


def state_bytes(spec: ModelSpec) -> int:
    """The recurrent layers' state (conv + SSM, float32), live plus its checkpoints plus the copy
    a speculative verification pass keeps (memory/recurrent.py): fixed, whatever the context.
    0 for a model without recurrent layers."""
    if spec.ssm is None:
        return 0
    from ..ssm_spec import VERIFY_COPIES

    return spec.ssm.state_bytes * (1 + _state_checkpoints() + VERIFY_COPIES)


# The KV dtype a model gets when none is asked for: int8 where greedy text on the conformance
# prompts (tests/fixtures, 24 continuations of 64 tokens) stayed identical to f16, measured per
# model file (scripts/kv_dtype_survey.py, docs/performance.md); f16 for every other model.
# Keyed by the GGUF's (general.architecture, general.name). Measured 2026-11-29: int8 kept
# 10/24 (smollm2-135m), 12/24 (gemma3-270m), 12/24 (qwen2.5-coder-1.5b) continuations
# identical (all 24 within llama.cpp's near-tie rule) — so no model qualifies yet.
INT8_KV_MEASURED: frozenset[tuple[str, str]] = frozenset()


def default_kv_dtype(header: GGUFFile) -> str:
    """`INT8_KV_MEASURED` models default to int8 KV, others to f16 (TALLOW_KV_DTYPE overrides)."""
    env = switches.value("TALLOW_KV_DTYPE")
    if env:
        return kv_dtype_arg(env) or "f16"
    key = (str(header.get("general.architecture") or ""), str(header.get("general.name") or ""))
    return "int8" if key in INT8_KV_MEASURED else "f16"


def default_budget() -> str | None:
    """The budget when the user gives none: $TALLOW_MEM_BUDGET, else all of MemAvailable —
    so a model that cannot fit at all is refused up front rather than killed mid-answer.
    TALLOW_MEM_BUDGET=off disables the guard."""
    value = switches.value("TALLOW_MEM_BUDGET")
    return None if value.lower() in ("off", "none", "0", "") else value
