"""gemma3: sandwich norms, per-head Q/K RMSNorm, embeddings scaled by sqrt(dim), and of every
`sliding_window_pattern` layers all but the last attend over a sliding window with their own
RoPE base. Where llama.cpp fixes a fact rather than reading it (the pattern of 6, the local
base of 10000) the key is read when the file carries it, else llama.cpp's value is used."""

from __future__ import annotations

import math

from ..spec import FULL_ATTENTION, MAX_CONTEXT, MAX_LAYERS, SLIDING_ATTENTION, Hparams, LayerSpec, Metadata
from .base import Family
from .llama import BLOCK_ROLES, MODEL_ROLES
from .tensors import TensorTable

SWA_PATTERN = 6
ROPE_BASE_SWA = 10000.0

# The sandwich norms and Q/K norms over the llama block's tensors.
GEMMA_BLOCK_ROLES = (*BLOCK_ROLES, "attn_q_norm", "attn_k_norm", "attn_post_norm", "ffn_post_norm")


class Gemma3(Family):
    architecture = "gemma3"
    model = "tallow.models.gemma3:Gemma3Model"
    ggml_step = True
    tensors = TensorTable(*MODEL_ROLES, *GEMMA_BLOCK_ROLES)
    layer_kinds = (FULL_ATTENTION, SLIDING_ATTENTION)

    def layers(self, md: Metadata, hp: Hparams) -> list[LayerSpec]:
        window = md.get("attention.sliding_window")
        layers = []
        for i in range(hp.n_layers):
            sliding, base = None, hp.rope_base
            if window:
                pattern = md.int("attention.sliding_window_pattern", SWA_PATTERN, 1, MAX_LAYERS)
                if i % pattern < pattern - 1:
                    sliding = md.int("attention.sliding_window", lo=1, hi=MAX_CONTEXT)
                    base = md.float("rope.freq_base_swa", ROPE_BASE_SWA, positive=True)
            layers.append(LayerSpec(i, hp.heads[i], hp.kv_heads[i], sliding, base, head_dim=hp.head_dim,
                                    v_head_dim=hp.v_head_dim, rope_dim=hp.rope_dim, ffn_dim=hp.ffn_dims[i],
                                    kv_source=i))
        return layers

    # attn_scale: llama.cpp's 1/sqrt(n_embd_head_k) for all but 27B (the default).

    def embed_scale(self, hp: Hparams) -> float:
        return math.sqrt(hp.dim)
