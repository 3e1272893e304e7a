"""gemma4 (dense: E2B/E4B, 31B): per-layer-type attention read as llama.cpp's gemma4 loader
reads it — a per-layer sliding-window flag array; sliding layers with their own head size,
RoPE base and rotated width; global layers with `rope_freqs` factors ("proportional" RoPE);
the trailing `shared_kv_layers` reading the cache of the last cached layer of their type;
per-layer embeddings (E2B/E4B); attention scale 1 and embeddings scaled by sqrt(dim)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import ModelFileError
from ..spec import (FULL_ATTENTION, MAX_CONTEXT, MAX_LAYERS, SHARED_KV, SLIDING_ATTENTION, Hparams, LayerSpec,
                    Metadata, _kind)
from .base import Family
from .gemma3 import GEMMA_BLOCK_ROLES
from .llama import MODEL_ROLES
from .qwen import MOE_ROLES
from .tensors import PER_LAYER_TOKEN_EMBD, ROPE_FREQS, TensorTable

ROPE_BASE_SWA = 10000.0  # llama.cpp's hparams default when rope.freq_base_swa is absent


class Gemma4(Family):
    architecture = "gemma4"
    model = "tallow.models.gemma4:Gemma4Model"
    tensors = TensorTable(*MODEL_ROLES, ROPE_FREQS, *GEMMA_BLOCK_ROLES, "layer_out_scale",
                          PER_LAYER_TOKEN_EMBD, "per_layer_model_proj", "per_layer_proj_norm",
                          "per_layer_inp_gate", "per_layer_proj", "per_layer_post_norm", *MOE_ROLES,
                          "ffn_gate_up_exps", "ffn_post_norm_1", "ffn_post_norm_2", "ffn_pre_norm_2")
    layer_kinds = (FULL_ATTENTION, SLIDING_ATTENTION, SHARED_KV)

    def layers(self, md: Metadata, hp: Hparams) -> list[LayerSpec]:
        path, key, n_layers = md.path, md.key, hp.n_layers
        pattern = md.need("attention.sliding_window_pattern")
        if not isinstance(pattern, np.ndarray) or len(pattern) != n_layers:
            raise ModelFileError(f"{path}: {key('attention.sliding_window_pattern')} must be an array of {n_layers} "
                                 f"per-layer flags, not {_kind(pattern)}.")
        is_swa = [bool(v) for v in pattern]
        window = md.int("attention.sliding_window", lo=1, hi=MAX_CONTEXT)
        head_dim_swa = md.int("attention.key_length_swa")
        v_head_dim_swa = md.int("attention.value_length_swa")
        if head_dim_swa != v_head_dim_swa or hp.head_dim != hp.v_head_dim:
            raise ModelFileError(f"{path}: Gemma 4 needs equal key and value head sizes (global {hp.head_dim}/"
                                 f"{hp.v_head_dim}, sliding {head_dim_swa}/{v_head_dim_swa}).")
        rope_dim_swa = md.int("rope.dimension_count_swa", hp.rope_dim, 0, head_dim_swa)
        base_swa = md.float("rope.freq_base_swa", ROPE_BASE_SWA, positive=True)
        n_shared = md.int("attention.shared_kv_layers", 0, 0, MAX_LAYERS)
        n_cached = n_layers - n_shared
        if n_shared and n_cached < 2:
            raise ModelFileError(f"{path}: {n_shared} shared-KV layers leave {n_cached} of {n_layers} layers with a "
                                 f"cache; Gemma 4 needs at least 2.")
        factors = None if all(is_swa) else self._rope_factors(md, hp.rope_dim)

        layers = []
        for i in range(n_layers):
            source = i
            if i >= n_cached:
                # llama.cpp's rule (llama-model.cpp, the gemma3n/gemma4 reuse callback): a sliding
                # layer reads layer n_cached - 2, a global one n_cached - 1.
                source = n_cached - (2 if is_swa[i] else 1)
                if is_swa[source] != is_swa[i]:
                    kind = "sliding" if is_swa[i] else "global"
                    raise ModelFileError(f"{path}: shared-KV layer {i} ({kind}) would read layer {source}, which is "
                                         f"not {kind}: the layer pattern does not end in a sliding and a global cached layer.")
            if is_swa[i]:
                layers.append(LayerSpec(i, hp.heads[i], hp.kv_heads[i], window, base_swa, head_dim=head_dim_swa,
                                        v_head_dim=v_head_dim_swa, rope_dim=rope_dim_swa, ffn_dim=hp.ffn_dims[i],
                                        kv_source=source))
            else:
                layers.append(LayerSpec(i, hp.heads[i], hp.kv_heads[i], None, hp.rope_base, head_dim=hp.head_dim,
                                        v_head_dim=hp.v_head_dim, rope_dim=hp.rope_dim, ffn_dim=hp.ffn_dims[i],
                                        kv_source=source, rope_factors=factors))
        for layer in layers:
            src = layers[layer.kv_source]
            if (src.n_kv_heads, src.head_dim) != (layer.n_kv_heads, layer.head_dim):
                raise ModelFileError(f"{path}: shared-KV layer {layer.index} has {layer.n_kv_heads} KV heads of "
                                     f"{layer.head_dim}, but its source layer {src.index} has {src.n_kv_heads} of "
                                     f"{src.head_dim}.")
        return layers

    def _rope_factors(self, md: Metadata, rope_dim: int) -> tuple[float, ...]:
        """The global layers' per-pair frequency divisors (`rope_freqs`, F32 or F16)."""
        name, path = self.tensors.name(ROPE_FREQS), md.path
        t = md.gf.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{path}: the tensor {name} (the global layers' RoPE factors) is missing.")
        if t.qtype not in (0, 1) or int(np.prod(t.shape)) != rope_dim // 2:  # F32 or F16
            raise ModelFileError(f"{path}: the tensor {name} must be {rope_dim // 2} F32/F16 values, "
                                 f"not {list(t.shape)} of type {t.qtype.name}.")
        raw = np.asarray(t.data).reshape(-1).view(np.float32 if t.qtype == 0 else np.float16).astype(np.float64)
        if not np.all(np.isfinite(raw)) or np.any(raw <= 0):
            raise ModelFileError(f"{path}: the tensor {name} holds values that are not finite and positive.")
        return tuple(float(v) for v in raw)

    def attn_scale(self, hp: Hparams) -> float:
        return 1.0  # llama.cpp: Gemma 4 scales Q·K by 1 (its Q/K RMSNorm sets the scale)

    def embed_scale(self, hp: Hparams) -> float:
        return math.sqrt(hp.dim)

    def per_layer_input_dim(self, md: Metadata) -> int:
        return md.int("embedding_length_per_layer_input", lo=0)
