"""The llama family block (SmolLM2, Llama 3.x): pre-norm attention with RoPE and a SwiGLU MLP.

Qwen reuses this block with Q/K/V biases (qwen2) or per-head Q/K RMSNorm (qwen3).
"""

from __future__ import annotations

import torch

from ..memory.kv_pool import KVPool
from .base import DecoderModel, LayerWeights
from .step import Step


class LlamaModel(DecoderModel):
    qkv_bias = False
    qk_norm = False

    def load_layer(self, i: int) -> LayerWeights:
        tn = self.tensor_names.block(i)  # role -> this block's GGUF name (families/llama.py, qwen.py)
        layer = self.spec.layers[i]
        qkv = ("attn_q", "attn_k", "attn_v")
        t = {
            "attn_norm": self.norm_weight(tn("attn_norm")),
            # Q, K, V side by side (one product where their storage allows): (n, (nh+nkv)*hd + nkv*vhd)
            "attn_qkv": self.linear_group([tn(r) for r in qkv], [tn(r, "bias") for r in qkv] if self.qkv_bias else None),
            "attn_output": self.linear(tn("attn_out")),
            "ffn_norm": self.norm_weight(tn("ffn_norm")),
            "ffn_gate_up": self.linear_group([tn("ffn_gate"), tn("ffn_up")]),  # (n, 2*ffn)
            "ffn_down": self.linear(tn("ffn_down")),
        }
        if self.qk_norm:
            # One norm over the Q and K heads side by side: each head keeps its own weight row.
            q_norm = self.norm_weight(tn("attn_q_norm"))
            k_norm = self.norm_weight(tn("attn_k_norm"))
            t["attn_qk_norm"] = torch.cat((q_norm.expand(layer.n_heads, -1), k_norm.expand(layer.n_kv_heads, -1)))
        return LayerWeights(i, t)

    def block(self, w: LayerWeights, x: torch.Tensor, delta: torch.Tensor | None, step: Step,
              kv: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
        eps, ops = self.spec.norm_eps, self.ops
        x, h = ops.add_norm(x, delta, w.attn_norm, eps)
        q = self.attention_inputs(w, w.attn_qkv(h), kv, step)
        x, attn = self.output_rows(w, x, w.attn_output(self.attend(w.index, q, kv, step)), step)
        x, h = ops.add_norm(x, attn, w.ffn_norm, eps)
        return x, self.mlp(w, h)

    def mlp(self, w: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        """The block's feed-forward part over the normed rows h (qwen3moe: routed experts)."""
        return w.ffn_down(self.ops.glu(w.ffn_gate_up(h), "swiglu"))  # gate/up side by side: (n, 2 * ffn)
