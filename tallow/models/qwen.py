"""Qwen families over the llama block: qwen2 adds Q/K/V biases, qwen3 per-head Q/K RMSNorm."""

from __future__ import annotations

from .llama import LlamaModel


class Qwen2Model(LlamaModel):
    qkv_bias = True


class Qwen3Model(LlamaModel):
    qk_norm = True
