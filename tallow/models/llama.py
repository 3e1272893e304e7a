"""The llama family block (SmolLM2, Llama 3.x): pre-norm attention with RoPE and a SwiGLU MLP.

Qwen reuses this block with Q/K/V biases (qwen2) or per-head Q/K RMSNorm (qwen3).
"""

from __future__ import annotations

import torch

from ..layers import attention, attention_mask, rms_norm, swiglu
from ..memory.kv_pool import KVPool
from .base import DecoderModel, LayerWeights


class LlamaModel(DecoderModel):
    qkv_bias = False
    qk_norm = False

    def load_layer(self, i: int) -> LayerWeights:
        p = f"blk.{i}."
        t = {
            "attn_norm": self.norm_weight(p + "attn_norm.weight"),
            "attn_q": self.linear(p + "attn_q.weight", p + "attn_q.bias" if self.qkv_bias else None),
            "attn_k": self.linear(p + "attn_k.weight", p + "attn_k.bias" if self.qkv_bias else None),
            "attn_v": self.linear(p + "attn_v.weight", p + "attn_v.bias" if self.qkv_bias else None),
            "attn_output": self.linear(p + "attn_output.weight"),
            "ffn_norm": self.norm_weight(p + "ffn_norm.weight"),
            "ffn_gate": self.linear(p + "ffn_gate.weight"),
            "ffn_up": self.linear(p + "ffn_up.weight"),
            "ffn_down": self.linear(p + "ffn_down.weight"),
        }
        if self.qk_norm:
            t["attn_q_norm"] = self.norm_weight(p + "attn_q_norm.weight")
            t["attn_k_norm"] = self.norm_weight(p + "attn_k_norm.weight")
        return LayerWeights(i, t)

    def block(self, w: LayerWeights, x: torch.Tensor, positions: torch.Tensor, kv: KVPool, start: int) -> torch.Tensor:
        spec, layer = self.spec, self.spec.layers[w.index]
        n = x.shape[0]
        h = rms_norm(x, w.attn_norm, spec.norm_eps)
        q = w.attn_q(h).view(n, layer.n_heads, spec.head_dim)
        k = w.attn_k(h).view(n, layer.n_kv_heads, spec.head_dim)
        v = w.attn_v(h).view(n, layer.n_kv_heads, spec.v_head_dim)
        if self.qk_norm:
            q = rms_norm(q, w.attn_q_norm, spec.norm_eps)
            k = rms_norm(k, w.attn_k_norm, spec.norm_eps)
        rope = self.rope[layer.rope_base]
        q = rope.apply(q, positions)
        k = rope.apply(k, positions)
        kv.store(w.index, start, k, v)
        keys, values = kv.view(w.index, start + n)
        mask = attention_mask(positions, start + n, layer.sliding_window) if n > 1 or layer.sliding_window else None
        a = attention(q.transpose(0, 1), keys, values, mask, spec.attn_scale, spec.attn_logit_softcap)
        x = x + w.attn_output(a)
        h = rms_norm(x, w.ffn_norm, spec.norm_eps)
        return x + w.ffn_down(swiglu(w.ffn_gate(h), w.ffn_up(h)))
