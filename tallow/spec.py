"""ModelSpec: one normalized description of a model, built from GGUF metadata only.

Per-layer facts (sliding window, RoPE base, KV heads) live here so model files and the
memory planner never re-derive them. This module holds the types (ModelSpec, LayerSpec,
Hparams, the layer kinds) and the parsing every family shares (`Metadata`, the keys every
architecture has); what differs per architecture is declared by its family
(tallow/families/<family>.py), which `spec_from_gguf` looks up by `general.architecture`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .errors import ModelFileError
from .gguf_file import GGUFFile
from .ssm_spec import SSMSpec, ssm_layer_lines

# Layer kinds (LayerSpec.kind), as llama.cpp composes its memory: attention over the layer's
# own cache of every position, over its own sliding window (a ring where TALLOW_KV_RING), or
# over an earlier layer's cache (gemma4's shared-KV layers: no cache of their own).
# RECURRENT is reserved for the SSM issue's layers (conv + SSM state, no positional cache):
# its LayerSpec field and memory come with those families.
FULL_ATTENTION = "full"
SLIDING_ATTENTION = "sliding"
SHARED_KV = "shared_kv"
RECURRENT = "recurrent"
LAYER_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION, SHARED_KV, RECURRENT)


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
    def kind(self) -> str:
        """FULL_ATTENTION, SLIDING_ATTENTION or SHARED_KV (see LAYER_KINDS)."""
        if not self.owns_kv:
            return SHARED_KV
        return SLIDING_ATTENTION if self.sliding_window else FULL_ATTENTION

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


_REQUIRED = object()


class Metadata:
    """A file's `<architecture>.<key>` metadata, read and checked: every failure is one
    ModelFileError sentence naming the key. Families read their own keys through it."""

    def __init__(self, gf: GGUFFile):
        self.gf, self.path, self.arch = gf, gf.path, gf.architecture

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def get(self, name: str, default=None):
        """The raw value, unchecked (default where absent)."""
        return self.gf.arch_get(name, default)

    def need(self, name: str):
        value = self.gf.arch_get(name)
        if value is None:
            raise ModelFileError(f"{self.path}: the metadata key {self.key(name)} is missing.")
        return value

    def _value(self, name: str, default):
        return self.need(name) if default is _REQUIRED else self.gf.arch_get(name, default)

    def int(self, name: str, default=_REQUIRED, lo: int = 1, hi: int = MAX_WIDTH) -> int:
        """An integer within [lo, hi]; no default: the key is required."""
        return _int(self._value(name, default), self.key(name), self.path, lo, hi)

    def float(self, name: str, default=_REQUIRED, positive: bool = False) -> float:
        return _float(self._value(name, default), self.key(name), self.path, positive)

    def per_layer(self, name: str, n_layers: int, default=_REQUIRED, lo: int = 1) -> list[int]:
        """One integer per layer: an array of n_layers, or one value for all."""
        return _per_layer(self._value(name, default), n_layers, self.key(name), self.path, lo)


@dataclass(frozen=True)
class Hparams:
    """The keys every family reads (llama.cpp's shared LLM_KV keys), checked; the family's
    `layers` turns them and its own keys into LayerSpecs."""

    n_layers: int
    dim: int
    heads: list[int]
    kv_heads: list[int]
    ffn_dims: list[int]
    head_dim: int  # key/query head size (gemma4: of the global layers)
    v_head_dim: int
    rope_base: float
    rope_dim: int


def spec_from_gguf(gf: GGUFFile) -> ModelSpec:
    """The ModelSpec of a file, built by its architecture's family (tallow/families/)."""
    from .families import family

    return family(gf.architecture, gf.path).spec(gf)


def attention_spec(gf: GGUFFile, fam) -> ModelSpec:
    """The ModelSpec of a stack of attention + MLP blocks: the keys every such family shares,
    then the family's own (`fam`: a families.Family) for its layers and scales."""
    from .families.tensors import TOKEN_EMBD, is_tied, tensor_name

    md = Metadata(gf)
    path, key = gf.path, md.key

    n_layers = md.int("block_count", lo=1, hi=MAX_LAYERS)
    dim = md.int("embedding_length")
    heads = md.per_layer("attention.head_count", n_layers)
    kv_heads = md.per_layer("attention.head_count_kv", n_layers, heads[0])
    for h, kv in zip(heads, kv_heads):
        if h % kv:
            raise ModelFileError(f"{path}: {h} attention heads cannot share {kv} KV heads evenly.")
    ffn = md.need("feed_forward_length")
    if isinstance(ffn, np.ndarray) and len(ffn) == 0:
        raise ModelFileError(f"{path}: the metadata key {key('feed_forward_length')} is an empty array.")
    if isinstance(ffn, np.ndarray):
        if len(ffn) != n_layers:
            raise ModelFileError(f"{path}: {key('feed_forward_length')} has {len(ffn)} entries for {n_layers} layers.")
        ffn_dims = [_int(v, key("feed_forward_length"), path) for v in ffn]
    else:
        ffn_dims = [_int(ffn, key("feed_forward_length"), path)] * n_layers
    head_dim = md.int("attention.key_length", dim // heads[0])
    v_head_dim = md.int("attention.value_length", head_dim)
    embd_name = tensor_name(TOKEN_EMBD)
    if embd_name not in gf.tensors:
        raise ModelFileError(f"{path}: the tensor {embd_name} is missing.")
    embd = gf.tensors[embd_name].shape
    if len(embd) != 2 or embd[0] != dim or embd[1] < 1:
        raise ModelFileError(f"{path}: the tensor {embd_name} has shape {list(embd)}, not [{dim}, vocabulary].")
    vocab_size = embd[1]

    rope_base = md.float("rope.freq_base", 10000.0, positive=True)
    rope_dim = md.int("rope.dimension_count", head_dim, 0, head_dim)
    rope_scale = 1.0
    if md.get("rope.scaling.type") == "linear" and md.get("rope.scaling.factor"):
        rope_scale = md.float("rope.scaling.factor", positive=True)

    hp = Hparams(n_layers, dim, heads, kv_heads, ffn_dims, head_dim, v_head_dim, rope_base, rope_dim)
    layers = fam.layers(md, hp)
    per_layer_input_dim = fam.per_layer_input_dim(md)
    for layer in layers:
        if layer.kind not in fam.layer_kinds:  # a family bug, not the file's
            raise RuntimeError(f"the {fam.architecture} family built layer {layer.index} of kind {layer.kind!r}, "
                               f"not one of its declared kinds {fam.layer_kinds}")

    softcap = md.get("final_logit_softcapping")
    attn_softcap = md.get("attn_logit_softcapping")
    softcap = md.float("final_logit_softcapping") if softcap is not None else None
    attn_softcap = md.float("attn_logit_softcapping") if attn_softcap is not None else None

    name = gf.get("general.name")
    name = name if isinstance(name, str) and name else gf.path
    return ModelSpec(
        architecture=fam.architecture,
        name=str(name),
        n_layers=n_layers,
        dim=dim,
        ffn_dim=max(ffn_dims),
        n_heads=heads[0],
        n_kv_heads=kv_heads[0],
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        vocab_size=vocab_size,
        context_length=md.int("context_length", 2048, 1, MAX_CONTEXT),
        norm_eps=md.float("attention.layer_norm_rms_epsilon", 1e-6),
        rope_base=rope_base,
        rope_dim=rope_dim,
        rope_style=fam.rope_style,
        rope_scale=rope_scale,
        attn_scale=fam.attn_scale(hp),
        embed_scale=fam.embed_scale(hp),
        final_logit_softcap=float(softcap) if softcap else None,
        attn_logit_softcap=float(attn_softcap) if attn_softcap else None,
        tied_embeddings=is_tied(gf.tensors),
        layers=tuple(layers),
        per_layer_input_dim=per_layer_input_dim,
        **expert_counts(gf, ffn_dims, fam.routed_experts_required),
    )


def expert_counts(gf: GGUFFile, ffn_dims: list[int], required: bool) -> dict:
    """n_experts, n_experts_used and expert_ffn_dim from `expert_count`, `expert_used_count` and
    `expert_feed_forward_length` (llama.cpp's fallback when the last is absent: the FFN width
    over the experts used). A file without `expert_count` (or with 0, where the family's experts
    are optional: gemma4) is dense: {}. required: a routed family (qwen3moe) needs the key."""
    path, arch = gf.path, gf.architecture
    count = gf.arch_get("expert_count")
    if count is None and required:
        raise ModelFileError(f"{path}: the metadata key {arch}.expert_count is missing.")
    if count is None or (not required and count == 0):
        return {}
    n = _int(count, f"{arch}.expert_count", path, 1, MAX_HEADS)
    used = _int(gf.arch_get("expert_used_count", 0), f"{arch}.expert_used_count", path, 1, n)
    width = gf.arch_get("expert_feed_forward_length")
    width = _int(width, f"{arch}.expert_feed_forward_length", path) if width is not None else max(ffn_dims) // used
    return {"n_experts": n, "n_experts_used": used, "expert_ffn_dim": width}
