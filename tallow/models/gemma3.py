"""Gemma 3: sandwich norms (pre and post) around attention and MLP, per-head Q/K RMSNorm,
GeGLU, embeddings scaled by sqrt(dim), and sliding-window layers with their own RoPE base."""

from __future__ import annotations

import torch

from ..layers import attention, attention_mask, geglu, rms_norm
from ..memory.kv_pool import KVPool
from .base import DecoderModel, LayerWeights


class Gemma3Model(DecoderModel):
    def load_layer(self, i: int) -> LayerWeights:
        p = f"blk.{i}."
        names = ("attn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
        t = {name: self.norm_weight(p + name + ".weight") for name in names}
        for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            t[name] = self.linear(p + name + ".weight")
        return LayerWeights(i, t)

    def block(self, w: LayerWeights, x: torch.Tensor, positions: torch.Tensor, kv: KVPool, start: int) -> torch.Tensor:
        spec, layer = self.spec, self.spec.layers[w.index]
        n = x.shape[0]
        h = rms_norm(x, w.attn_norm, spec.norm_eps)
        q = rms_norm(w.attn_q(h).view(n, layer.n_heads, spec.head_dim), w.attn_q_norm, spec.norm_eps)
        k = rms_norm(w.attn_k(h).view(n, layer.n_kv_heads, spec.head_dim), w.attn_k_norm, spec.norm_eps)
        v = w.attn_v(h).view(n, layer.n_kv_heads, spec.v_head_dim)
        rope = self.rope[layer.rope_base]
        q = rope.apply(q, positions)
        k = rope.apply(k, positions)
        kv.store(w.index, start, k, v)
        keys, values = kv.view(w.index, start + n)
        mask = attention_mask(positions, start + n, layer.sliding_window) if n > 1 or layer.sliding_window else None
        a = attention(q.transpose(0, 1), keys, values, mask, spec.attn_scale, spec.attn_logit_softcap)
        x = x + rms_norm(w.attn_output(a), w.post_attention_norm, spec.norm_eps)
        h = rms_norm(x, w.ffn_norm, spec.norm_eps)
        f = w.ffn_down(geglu(w.ffn_gate(h), w.ffn_up(h)))
        return x + rms_norm(f, w.post_ffw_norm, spec.norm_eps)
