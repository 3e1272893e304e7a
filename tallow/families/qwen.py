"""qwen2 (the llama block with Q/K/V biases), qwen3 (with per-head Q/K RMSNorm) and qwen3moe (qwen3
attention, routed experts instead of the MLP: softmax top-k, no shared expert); RoPE on halves."""

from __future__ import annotations

from .base import Family
from .llama import BLOCK_ROLES, MODEL_ROLES
from .tensors import TensorTable


class Qwen2(Family):
    architecture = "qwen2"
    model = "tallow.models.qwen:Qwen2Model"
    ggml_step = True
    tensors = TensorTable(*MODEL_ROLES, *BLOCK_ROLES)  # attn_q/k/v also with .bias


class Qwen3(Family):
    architecture = "qwen3"
    model = "tallow.models.qwen:Qwen3Model"
    ggml_step = True
    tensors = TensorTable(*MODEL_ROLES, *BLOCK_ROLES, "attn_q_norm", "attn_k_norm")


# The routed experts' tensors: the router, then each projection of all experts as one 3-D tensor.
MOE_ROLES = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


class Qwen3Moe(Family):
    architecture = "qwen3moe"
    model = "tallow.models.qwen3moe:Qwen3MoeModel"
    tensors = TensorTable(*MODEL_ROLES, "attn_norm", "attn_q", "attn_k", "attn_v", "attn_out", "attn_q_norm",
                          "attn_k_norm", "ffn_norm", *MOE_ROLES, "ffn_gate_up_exps")
    routed_experts_required = True
