"""qwen2 (the llama block with Q/K/V biases) and qwen3 (with per-head Q/K RMSNorm); RoPE on halves."""

from __future__ import annotations

from .base import Family
from .llama import BLOCK_ROLES, MODEL_ROLES
from .tensors import TensorTable


class Qwen2(Family):
    architecture = "qwen2"
    model = "tallow.models.qwen:Qwen2Model"
    tensors = TensorTable(*MODEL_ROLES, *BLOCK_ROLES)  # attn_q/k/v also with .bias


class Qwen3(Family):
    architecture = "qwen3"
    model = "tallow.models.qwen:Qwen3Model"
    tensors = TensorTable(*MODEL_ROLES, *BLOCK_ROLES, "attn_q_norm", "attn_k_norm")
