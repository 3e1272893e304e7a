"""llama (SmolLM2, Llama 3.x): uniform global-attention layers, RoPE on adjacent pairs."""

from __future__ import annotations

from .base import Family
from .tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, TensorTable

# The tensors of a pre-norm attention + SwiGLU block (llama, and qwen over it).
BLOCK_ROLES = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_out", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
MODEL_ROLES = (TOKEN_EMBD, OUTPUT_NORM, OUTPUT)


class Llama(Family):
    architecture = "llama"
    model = "tallow.models.llama:LlamaModel"
    ggml_step = True
    tensors = TensorTable(*MODEL_ROLES, *BLOCK_ROLES)
    rope_style = "norm"  # llama's converter permutes Q/K so adjacent pairs rotate
