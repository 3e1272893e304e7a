"""Gemma 3: sandwich norms (pre and post) around attention and MLP, per-head Q/K RMSNorm,
GeGLU, embeddings scaled by sqrt(dim), and sliding-window layers with their own RoPE base."""

from __future__ import annotations

import torch

from ..layers import geglu, rms_norm
from ..memory.kv_pool import KVPool
from .base import DecoderModel, LayerWeights


class Gemma3Model(DecoderModel):
    def load_layer(self, i: int) -> LayerWeights:
        p = f"blk.{i}."
        layer = self.spec.layers[i]
        names = ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm")
        t = {name: self.norm_weight(p + name + ".weight") for name in names}
        q_norm = self.norm_weight(p + "attn_q_norm.weight")
        k_norm = self.norm_weight(p + "attn_k_norm.weight")
        # One norm over the Q and K heads side by side: each head keeps its own weight row.
        t["attn_qk_norm"] = torch.cat((q_norm.expand(layer.n_heads, -1), k_norm.expand(layer.n_kv_heads, -1)))
        t["attn_qkv"] = self.linear_group([p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
        t["ffn_gate_up"] = self.linear_group([p + "ffn_gate.weight", p + "ffn_up.weight"])
        for name in ("attn_output", "ffn_down"):
            t[name] = self.linear(p + name + ".weight")
        return LayerWeights(i, t)

    def block(self, w: LayerWeights, x: torch.Tensor, positions: torch.Tensor, kv: KVPool, start: int) -> torch.Tensor:
        spec, layer = self.spec, self.spec.layers[w.index]
        n = x.shape[0]
        nh, nkv, hd = layer.n_heads, layer.n_kv_heads, spec.head_dim
        h = rms_norm(x, w.attn_norm, spec.norm_eps)
        qkv = w.attn_qkv(h)  # (n, (nh + nkv) * hd + nkv * v_head_dim)
        qk = rms_norm(qkv[:, : (nh + nkv) * hd].view(n, nh + nkv, hd), w.attn_qk_norm, spec.norm_eps)
        v = qkv[:, (nh + nkv) * hd :].view(n, nkv, spec.v_head_dim)
        qk = self.rope[layer.rope_base].apply_at(qk, start)
        kv.store(w.index, start, qk[:, nh:], v)
        a = self.attend(w.index, qk[:, :nh], kv, start)
        x = x + rms_norm(w.attn_output(a), w.post_attention_norm, spec.norm_eps)
        h = rms_norm(x, w.ffn_norm, spec.norm_eps)
        gate_up = w.ffn_gate_up(h)  # (n, 2 * ffn)
        f = gate_up.shape[1] // 2
        return x + rms_norm(w.ffn_down(geglu(gate_up[:, :f], gate_up[:, f:])), w.post_ffw_norm, spec.norm_eps)
