"""`Family`: the facts one architecture declares (see the package docstring for how to add one)."""

from __future__ import annotations

import math

from ..spec import FULL_ATTENTION, Hparams, LayerSpec, Metadata
from .tensors import TensorTable


class Family:
    architecture: str
    model: str  # "module:Class" of its DecoderModel
    tensors: TensorTable
    layer_kinds: tuple[str, ...] = (FULL_ATTENTION,)
    # RoPE pairing: "norm" rotates adjacent pairs (llama's converter permutes Q/K for it),
    # "neox" the two halves of each head, as llama.cpp's rope types.
    rope_style: str = "neox"

    def layers(self, md: Metadata, hp: Hparams) -> list[LayerSpec]:
        """Per-layer facts from the metadata; by default every layer alike, global attention."""
        return [LayerSpec(i, hp.heads[i], hp.kv_heads[i], None, hp.rope_base, head_dim=hp.head_dim,
                          v_head_dim=hp.v_head_dim, rope_dim=hp.rope_dim, ffn_dim=hp.ffn_dims[i], kv_source=i)
                for i in range(hp.n_layers)]

    def attn_scale(self, hp: Hparams) -> float:
        """What q·k is multiplied by."""
        return 1.0 / math.sqrt(hp.head_dim)

    def embed_scale(self, hp: Hparams) -> float:
        """What the token embedding is multiplied by."""
        return 1.0

    def per_layer_input_dim(self, md: Metadata) -> int:
        """Width of each layer's slice of the per-layer embeddings (gemma4 E2B/E4B); 0: none."""
        return 0
