"""`Family`: the facts one architecture declares (see the package docstring for how to add one)."""

from __future__ import annotations

import math

from ..gguf_file import GGUFFile
from ..spec import FULL_ATTENTION, Hparams, LayerSpec, Metadata, ModelSpec, attention_spec
from .tensors import TensorTable


class Family:
    architecture: str
    model: str  # "module:Class" of its DecoderModel
    tensors: TensorTable
    layer_kinds: tuple[str, ...] = (FULL_ATTENTION,)
    # RoPE pairing: "norm" rotates adjacent pairs (llama's converter permutes Q/K for it),
    # "neox" the two halves of each head, as llama.cpp's rope types.
    rope_style: str = "neox"
    # Routed experts (spec.expert_counts): a routed family (qwen3moe) needs `expert_count`;
    # for the others (gemma4: the 26B-A4B variant) a file without it is dense.
    routed_experts_required: bool = False
    # Its decode step is one the C step computes in llama.cpp's arithmetic (kernels/cpu/decode_layer.py:
    # the llama block and gemma3's), so the CPU may run it in llama.cpp's numerics (numerics_choice.py).
    ggml_step: bool = False

    def spec(self, gf: GGUFFile) -> ModelSpec:
        """The file's ModelSpec. For attention + MLP blocks the shared reading (spec.attention_spec)
        calls the hooks below; a family whose blocks are otherwise overrides this: one with
        model-wide facts of its own (routed experts) returns dataclasses.replace(super().spec(gf),
        ...), a hybrid adds its recurrent layers to super().spec(gf), a pure recurrent one
        (no attention keys at all) builds its ModelSpec itself."""
        return attention_spec(gf, self)

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
