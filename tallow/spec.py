"""ModelSpec: one normalized description of a model, built from GGUF metadata only.

Per-layer facts (sliding window, RoPE base, KV heads) live here so model files and the
memory planner never re-derive them. Where llama.cpp fixes a fact per architecture rather
than reading it from the file (gemma3's sliding-window pattern of 6 and local RoPE base of
10000), we read the metadata key when a file carries it and fall back to llama.cpp's value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import ModelFileError
from .gguf_file import GGUFFile
from .ssm_spec import HYBRID_ARCHITECTURES, SSM_ARCHITECTURES, SSMSpec, hybrid_model_spec, ssm_layer_lines, ssm_model_spec

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "gemma4") + SSM_ARCHITECTURES + HYBRID_ARCHITECTURES

# RoPE pairing: llama's converter permutes Q/K so adjacent pairs rotate ("norm");
# the others rotate the two halves of each head ("neox"), as in llama.cpp's rope types.
_ROPE_STYLE = {"llama": "norm", "qwen2": "neox", "qwen3": "neox", "qwen3moe": "neox", "gemma3": "neox", "gemma4": "neox",
               "falcon-h1": "neox"}

# llama.cpp's per-architecture defaults where the GGUF may not carry the key.
_GEMMA3_SWA_PATTERN = 6
_GEMMA3_ROPE_BASE_SWA = 10000.0
_GEMMA4_ROPE_BASE_SWA = 10000.0  # llama.cpp's hparams default when rope.freq_base_swa is absent


@dataclass(frozen=True)
class LayerSpec:
    index: int
    n_heads: int
    n_kv_heads: int
    sliding_window: int | None  # None: global attention over the whole context
    rope_base: float
    head_dim: int  # key/query head size of this layer (gemma4: one per layer type)
    v_head_dim: int
    rope_dim: int  # leading dims of each head that rotate
    ffn_dim: int
    # The layer whose K/V cache this layer attends over: itself, or for gemma4's shared-KV
    # layers an earlier layer of the same type (this layer then computes no K/V and owns no cache).
    kv_source: int
    # Per rotated pair, a divisor of its frequency (ggml's rope freq_factors; gemma4's global
    # layers rotate only the first pairs, the rest get 1e30 so they stay put). None: all 1.
    rope_factors: tuple[float, ...] | None = None

    @property
    def owns_kv(self) -> bool:
        return self.kv_source == self.index

    @property
    def rope_key(self) -> tuple:
        """What identifies this layer's RoPE tables (layers with equal keys share one)."""
        return (self.rope_base, self.rope_dim, self.rope_factors)


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    name: str
    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # key/query head size
    v_head_dim: int
    vocab_size: int
    context_length: int
    norm_eps: float
    rope_base: float
    rope_dim: int
    rope_style: str  # "norm" | "neox"
    rope_scale: float  # linear position scaling (1.0 = none)
    attn_scale: float  # multiplies q·k
    embed_scale: float  # multiplies the token embedding (gemma: sqrt(dim))
    final_logit_softcap: float | None
    attn_logit_softcap: float | None
    tied_embeddings: bool
    layers: tuple[LayerSpec, ...] = field(repr=False)
    per_layer_input_dim: int = 0  # gemma4's per-layer embeddings, width per layer (0: none)
    # Routed experts (qwen3moe, gemma4 26B-A4B): how many, how many each token uses, and one
    # expert's FFN width (`expert_feed_forward_length`). 0: a dense model.
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn_dim: int = 0
    ssm: SSMSpec | None = None  # the recurrent (Mamba) layers and their fixed state (ssm_spec.py); None: none

    @property
    def kv_bytes_per_token_f16(self) -> int:
        """Bytes of f16 K+V one token costs across the layers that own a cache (no window savings)."""
        return sum(2 * layer.n_kv_heads * (layer.head_dim + layer.v_head_dim) for layer in self.layers if layer.owns_kv)


def layer_kind_lines(spec: ModelSpec) -> list[str]:
    """`tallow inspect`'s lines on per-layer kinds, for models whose layers differ in more than
    the sliding window (gemma4: head sizes, KV heads, RoPE per type, shared-KV layers); none
    for the others."""
    kinds: dict[tuple, list[int]] = {}
    for layer in spec.layers:
        if layer.owns_kv:
            kinds.setdefault((layer.sliding_window, layer.head_dim, layer.n_kv_heads, layer.rope_base, layer.rope_dim,
                              layer.rope_factors), []).append(layer.index)
    shared = [layer for layer in spec.layers if not layer.owns_kv]
    if spec.ssm is not None and not spec.layers:
        return ssm_layer_lines(spec.ssm)
    if spec.ssm is not None:  # a hybrid: its attention layers, then the recurrent ones beside them
        return ["layer kinds", f"  attention beside the mixer in every block: {len(spec.layers)} layers"] + ssm_layer_lines(spec.ssm)
    if len(kinds) < 2 and not shared and len({layer.ffn_dim for layer in spec.layers}) < 2:
        return []
    lines = []
    for (window, hd, nkv, base, rope_dim, factors), idx in kinds.items():
        rope = f"RoPE base {base:g} on {rope_dim} dims"
        if factors is not None:
            rope += f", {sum(1 for f in factors[: rope_dim // 2] if f < 1e20)} of {rope_dim // 2} pairs turning"
        kind = f"sliding (window {window})" if window else "global"
        lines.append(f"  {kind:<22s} head {hd}, {nkv} KV heads, {rope}: layers {_ranges(idx)}")
    if shared:
        pairs = ", ".join(f"{layer.index}->{layer.kv_source}" for layer in shared)
        lines.append(f"  shared KV (no cache)   {len(shared)} layers read an earlier layer's: {pairs}")
    widths = sorted({layer.ffn_dim for layer in spec.layers})
    if len(widths) > 1:
        lines.append(f"  ffn widths             {', '.join(str(w) for w in widths)}")
    if spec.per_layer_input_dim:
        lines.append(f"  per-layer embeddings   {spec.per_layer_input_dim} per layer (table memory-mapped)")
    return ["layer kinds"] + lines


def expert_lines(spec: ModelSpec, gf: GGUFFile) -> list[str]:
    """`tallow inspect`'s line on routed experts (none for a dense model): how many, how many per
    token, their width and layers, and the file bytes a token reads (every tensor but the experts,
    plus n_used / n_experts of them: the bandwidth floor of a decode step)."""
    if not spec.n_experts:
        return []
    expert_tensors = [t for t in gf.tensors.values() if len(t.shape) == 3 and t.shape[-1] == spec.n_experts]
    layers = sorted({int(t.name.split(".")[1]) for t in expert_tensors if t.name.startswith("blk.")})
    expert_bytes = sum(t.n_bytes for t in expert_tensors)
    other = sum(t.n_bytes for t in gf.tensors.values()) - expert_bytes
    active = other + expert_bytes * spec.n_experts_used // spec.n_experts
    shared = any(f"blk.{i}.ffn_gate.weight" in gf.tensors for i in layers)
    return [f"experts       {spec.n_experts} routed, {spec.n_experts_used} per token, width {spec.expert_ffn_dim}"
            + (", beside a shared MLP" if shared else "") + f", on layers {_ranges(layers) if layers else 'none'}",
            f"              expert tensors {expert_bytes / 2**20:.1f} MiB; a token reads {active / 2**20:.1f} MiB of the file"]


def _ranges(idx: list[int]) -> str:
    """[0, 1, 2, 4] -> '0-2, 4'."""
    out, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return ", ".join(out)


# Bounds on what a file may claim, far past any real model: a hostile or corrupt file must end
# in one sentence here, not in a ZeroDivisionError, a wrapped int or a multi-GB allocation.
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # embedding, FFN, head size
MAX_HEADS = 4096
MAX_CONTEXT = 1 << 24


def _int(value, what: str, path: str, lo: int = 1, hi: int = MAX_WIDTH) -> int:
    """A metadata integer within [lo, hi], or a ModelFileError naming the key."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ModelFileError(f"{path}: the metadata key {what} is {_kind(value)}, not an integer.")
    if not lo <= int(value) <= hi:
        raise ModelFileError(f"{path}: the metadata key {what} is {int(value)}, outside {lo}..{hi}.")
    return int(value)


def _float(value, what: str, path: str, positive: bool = False) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ModelFileError(f"{path}: the metadata key {what} is {_kind(value)}, not a number.")
    x = float(value)
    if not math.isfinite(x) or (positive and x <= 0) or x < 0:
        raise ModelFileError(f"{path}: the metadata key {what} is {x}, not a finite {'positive' if positive else 'non-negative'} number.")
    return x


def _kind(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {len(value)}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}"


def _per_layer(value, n_layers: int, what: str, path: str, lo: int = 1) -> list[int]:
    if isinstance(value, np.ndarray):
        if len(value) != n_layers:
            raise ModelFileError(f"{path}: {what} has {len(value)} entries for {n_layers} layers.")
        return [_int(v, what, path, lo, MAX_HEADS) for v in value]
    return [_int(value, what, path, lo, MAX_HEADS)] * n_layers


def spec_from_gguf(gf: GGUFFile) -> ModelSpec:
    arch = gf.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelFileError(
            f"{gf.path}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})."
        )

    def need(key: str):
        value = gf.arch_get(key)
        if value is None:
            raise ModelFileError(f"{gf.path}: the metadata key {arch}.{key} is missing.")
        return value

    path = gf.path
    if arch in SSM_ARCHITECTURES:  # no attention layers: the recurrent ones are in ModelSpec.ssm
        import sys

        return ssm_model_spec(gf, sys.modules[__name__])

    def key(name: str) -> str:
        return f"{arch}.{name}"

    n_layers = _int(need("block_count"), key("block_count"), path, 1, MAX_LAYERS)
    dim = _int(need("embedding_length"), key("embedding_length"), path)
    heads = _per_layer(need("attention.head_count"), n_layers, key("attention.head_count"), path)
    kv_heads = _per_layer(gf.arch_get("attention.head_count_kv", heads[0]), n_layers, key("attention.head_count_kv"), path)
    for h, kv in zip(heads, kv_heads):
        if h % kv:
            raise ModelFileError(f"{path}: {h} attention heads cannot share {kv} KV heads evenly.")
    ffn = need("feed_forward_length")
    if isinstance(ffn, np.ndarray) and len(ffn) == 0:
        raise ModelFileError(f"{path}: the metadata key {key('feed_forward_length')} is an empty array.")
    if isinstance(ffn, np.ndarray):
        if len(ffn) != n_layers:
            raise ModelFileError(f"{path}: {key('feed_forward_length')} has {len(ffn)} entries for {n_layers} layers.")
        ffn_dims = [_int(v, key("feed_forward_length"), path) for v in ffn]
    else:
        ffn_dims = [_int(ffn, key("feed_forward_length"), path)] * n_layers
    head_dim = _int(gf.arch_get("attention.key_length", dim // heads[0]), key("attention.key_length"), path)
    v_head_dim = _int(gf.arch_get("attention.value_length", head_dim), key("attention.value_length"), path)
    if "token_embd.weight" not in gf.tensors:
        raise ModelFileError(f"{path}: the tensor token_embd.weight is missing.")
    embd = gf.tensors["token_embd.weight"].shape
    if len(embd) != 2 or embd[0] != dim or embd[1] < 1:
        raise ModelFileError(f"{path}: the tensor token_embd.weight has shape {list(embd)}, not [{dim}, vocabulary].")
    vocab_size = embd[1]

    rope_base = _float(gf.arch_get("rope.freq_base", 10000.0), key("rope.freq_base"), path, positive=True)
    rope_dim = _int(gf.arch_get("rope.dimension_count", head_dim), key("rope.dimension_count"), path, 0, head_dim)
    rope_scale = 1.0
    if gf.arch_get("rope.scaling.type") == "linear" and gf.arch_get("rope.scaling.factor"):
        rope_scale = _float(gf.arch_get("rope.scaling.factor"), key("rope.scaling.factor"), path, positive=True)

    window = gf.arch_get("attention.sliding_window")
    per_layer_input_dim = 0
    if arch == "gemma4":
        layers, per_layer_input_dim = _gemma4_layers(gf, n_layers, heads, kv_heads, ffn_dims, head_dim, v_head_dim,
                                                     rope_base, rope_dim)
    else:
        layers = []
        for i in range(n_layers):
            sliding = None
            base = rope_base
            if arch == "gemma3" and window:
                pattern = _int(gf.arch_get("attention.sliding_window_pattern", _GEMMA3_SWA_PATTERN), key("attention.sliding_window_pattern"), path, 1, MAX_LAYERS)
                if i % pattern < pattern - 1:
                    sliding = _int(window, key("attention.sliding_window"), path, 1, MAX_CONTEXT)
                    base = _float(gf.arch_get("rope.freq_base_swa", _GEMMA3_ROPE_BASE_SWA), key("rope.freq_base_swa"), path, positive=True)
            layers.append(LayerSpec(i, heads[i], kv_heads[i], sliding, base, head_dim=head_dim, v_head_dim=v_head_dim,
                                    rope_dim=rope_dim, ffn_dim=ffn_dims[i], kv_source=i))

    if arch == "gemma4":
        attn_scale = 1.0  # llama.cpp: Gemma 4 scales Q·K by 1 (its Q/K RMSNorm sets the scale)
        embed_scale = math.sqrt(dim)
    elif arch == "gemma3":
        attn_scale = 1.0 / math.sqrt(head_dim)  # llama.cpp: 1/sqrt(n_embd_head_k) for all but 27B
        embed_scale = math.sqrt(dim)
    else:
        attn_scale = 1.0 / math.sqrt(head_dim)
        embed_scale = 1.0
    softcap = gf.arch_get("final_logit_softcapping")
    attn_softcap = gf.arch_get("attn_logit_softcapping")
    softcap = _float(softcap, key("final_logit_softcapping"), path) if softcap is not None else None
    attn_softcap = _float(attn_softcap, key("attn_logit_softcapping"), path) if attn_softcap is not None else None

    name = gf.get("general.name")
    name = name if isinstance(name, str) and name else gf.path
    spec = ModelSpec(
        architecture=arch,
        name=str(name),
        n_layers=n_layers,
        dim=dim,
        ffn_dim=max(ffn_dims),
        n_heads=heads[0],
        n_kv_heads=kv_heads[0],
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        vocab_size=vocab_size,
        context_length=_int(gf.arch_get("context_length", 2048), key("context_length"), path, 1, MAX_CONTEXT),
        norm_eps=_float(gf.arch_get("attention.layer_norm_rms_epsilon", 1e-6), key("attention.layer_norm_rms_epsilon"), path),
        rope_base=rope_base,
        rope_dim=rope_dim,
        rope_style=_ROPE_STYLE[arch],
        rope_scale=rope_scale,
        attn_scale=attn_scale,
        embed_scale=embed_scale,
        final_logit_softcap=float(softcap) if softcap else None,
        attn_logit_softcap=float(attn_softcap) if attn_softcap else None,
        tied_embeddings="output.weight" not in gf.tensors,
        layers=tuple(layers),
        per_layer_input_dim=per_layer_input_dim,
        **_expert_counts(gf, ffn_dims),
    )
    if arch in HYBRID_ARCHITECTURES:  # attention beside Mamba-2 in every block (ssm_spec.py)
        import sys

        spec = hybrid_model_spec(gf, spec, sys.modules[__name__])
    return spec


def _expert_counts(gf: GGUFFile, ffn_dims: list[int]) -> dict:
    """n_experts, n_experts_used and expert_ffn_dim from `expert_count`, `expert_used_count` and
    `expert_feed_forward_length` (llama.cpp's fallback when the last is absent: the FFN width
    over the experts used). A file without `expert_count` is dense: all three 0."""
    path, arch = gf.path, gf.architecture
    count = gf.arch_get("expert_count")
    if count is None and arch == "qwen3moe":
        raise ModelFileError(f"{path}: the metadata key {arch}.expert_count is missing.")
    if count is None or (arch != "qwen3moe" and count == 0):
        return {}
    n = _int(count, f"{arch}.expert_count", path, 1, MAX_HEADS)
    used = _int(gf.arch_get("expert_used_count", 0), f"{arch}.expert_used_count", path, 1, n)
    width = gf.arch_get("expert_feed_forward_length")
    width = _int(width, f"{arch}.expert_feed_forward_length", path) if width is not None else max(ffn_dims) // used
    return {"n_experts": n, "n_experts_used": used, "expert_ffn_dim": width}


def _gemma4_layers(gf: GGUFFile, n_layers: int, heads: list[int], kv_heads: list[int], ffn_dims: list[int],
                   head_dim_full: int, v_head_dim_full: int, rope_base: float,
                   rope_dim_full: int) -> tuple[list[LayerSpec], int]:
    """Gemma 4's per-layer facts, read as llama.cpp's gemma4 loader reads them: a per-layer
    sliding-window flag array; sliding layers with their own head size, RoPE base and rotated
    width; global layers with `rope_freqs` factors ("proportional" RoPE); and the trailing
    `shared_kv_layers` layers reading the cache of the last cached layer of their type."""
    path, arch = gf.path, gf.architecture

    def key(name: str) -> str:
        return f"{arch}.{name}"

    def need(name: str):
        value = gf.arch_get(name)
        if value is None:
            raise ModelFileError(f"{path}: the metadata key {key(name)} is missing.")
        return value

    pattern = need("attention.sliding_window_pattern")
    if not isinstance(pattern, np.ndarray) or len(pattern) != n_layers:
        raise ModelFileError(f"{path}: {key('attention.sliding_window_pattern')} must be an array of {n_layers} "
                             f"per-layer flags, not {_kind(pattern)}.")
    is_swa = [bool(v) for v in pattern]
    window = _int(need("attention.sliding_window"), key("attention.sliding_window"), path, 1, MAX_CONTEXT)
    head_dim_swa = _int(need("attention.key_length_swa"), key("attention.key_length_swa"), path)
    v_head_dim_swa = _int(need("attention.value_length_swa"), key("attention.value_length_swa"), path)
    if head_dim_swa != v_head_dim_swa or head_dim_full != v_head_dim_full:
        raise ModelFileError(f"{path}: Gemma 4 needs equal key and value head sizes (global {head_dim_full}/"
                             f"{v_head_dim_full}, sliding {head_dim_swa}/{v_head_dim_swa}).")
    rope_dim_swa = _int(gf.arch_get("rope.dimension_count_swa", rope_dim_full), key("rope.dimension_count_swa"),
                        path, 0, head_dim_swa)
    base_swa = _float(gf.arch_get("rope.freq_base_swa", _GEMMA4_ROPE_BASE_SWA), key("rope.freq_base_swa"), path,
                      positive=True)
    per_layer_dim = _int(need("embedding_length_per_layer_input"), key("embedding_length_per_layer_input"), path, 0)
    n_shared = _int(gf.arch_get("attention.shared_kv_layers", 0), key("attention.shared_kv_layers"), path, 0, MAX_LAYERS)
    n_cached = n_layers - n_shared
    if n_shared and n_cached < 2:
        raise ModelFileError(f"{path}: {n_shared} shared-KV layers leave {n_cached} of {n_layers} layers with a "
                             f"cache; Gemma 4 needs at least 2.")

    factors = None
    if not all(is_swa):
        t = gf.tensors.get("rope_freqs.weight")
        if t is None:
            raise ModelFileError(f"{path}: the tensor rope_freqs.weight (the global layers' RoPE factors) is missing.")
        if t.qtype not in (0, 1) or int(np.prod(t.shape)) != rope_dim_full // 2:  # F32 or F16
            raise ModelFileError(f"{path}: the tensor rope_freqs.weight must be {rope_dim_full // 2} F32/F16 values, "
                                 f"not {list(t.shape)} of type {t.qtype.name}.")
        raw = np.asarray(t.data).reshape(-1).view(np.float32 if t.qtype == 0 else np.float16).astype(np.float64)
        if not np.all(np.isfinite(raw)) or np.any(raw <= 0):
            raise ModelFileError(f"{path}: the tensor rope_freqs.weight holds values that are not finite and positive.")
        factors = tuple(float(v) for v in raw)

    layers = []
    for i in range(n_layers):
        source = i
        if i >= n_cached:
            # llama.cpp's rule (llama-model.cpp, the gemma3n/gemma4 reuse callback): a sliding
            # layer reads layer n_cached - 2, a global one n_cached - 1.
            source = n_cached - (2 if is_swa[i] else 1)
            if is_swa[source] != is_swa[i]:
                kind = "sliding" if is_swa[i] else "global"
                raise ModelFileError(f"{path}: shared-KV layer {i} ({kind}) would read layer {source}, which is not "
                                     f"{kind}: the layer pattern does not end in a sliding and a global cached layer.")
        if is_swa[i]:
            layers.append(LayerSpec(i, heads[i], kv_heads[i], window, base_swa, head_dim=head_dim_swa,
                                    v_head_dim=v_head_dim_swa, rope_dim=rope_dim_swa, ffn_dim=ffn_dims[i],
                                    kv_source=source))
        else:
            layers.append(LayerSpec(i, heads[i], kv_heads[i], None, rope_base, head_dim=head_dim_full,
                                    v_head_dim=v_head_dim_full, rope_dim=rope_dim_full, ffn_dim=ffn_dims[i],
                                    kv_source=source, rope_factors=factors))
    for layer in layers:
        src = layers[layer.kv_source]
        if (src.n_kv_heads, src.head_dim) != (layer.n_kv_heads, layer.head_dim):
            raise ModelFileError(f"{path}: shared-KV layer {layer.index} has {layer.n_kv_heads} KV heads of "
                                 f"{layer.head_dim}, but its source layer {src.index} has {src.n_kv_heads} of {src.head_dim}.")
    return layers, per_layer_dim
