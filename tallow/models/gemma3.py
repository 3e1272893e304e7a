"""Gemma 3: sandwich norms (pre and post) around attention and MLP, per-head Q/K RMSNorm,
GeGLU, embeddings scaled by sqrt(dim), and sliding-window layers with their own RoPE base."""

from __future__ import annotations

import torch

from ..memory.kv_pool import KVPool
from .base import DecoderModel, LayerWeights
from .step import Step


class Gemma3Model(DecoderModel):
    ggml_prescaled_q = True  # llama.cpp's gemma3.cpp: Qcur = ggml_scale(Qcur, f_attention_scale)

    def load_layer(self, i: int) -> LayerWeights:
        tn = self.tensor_names.block(i)  # role -> this block's GGUF name (families/gemma3.py)
        layer = self.spec.layers[i]
        norms = {"attn_norm": "attn_norm", "post_attention_norm": "attn_post_norm", "ffn_norm": "ffn_norm",
                 "post_ffw_norm": "ffn_post_norm"}
        t = {key: self.norm_weight(tn(role)) for key, role in norms.items()}
        q_norm = self.norm_weight(tn("attn_q_norm"))
        k_norm = self.norm_weight(tn("attn_k_norm"))
        # One norm over the Q and K heads side by side: each head keeps its own weight row.
        t["attn_qk_norm"] = torch.cat((q_norm.expand(layer.n_heads, -1), k_norm.expand(layer.n_kv_heads, -1)))
        t["attn_qkv"] = self.linear_group([tn("attn_q"), tn("attn_k"), tn("attn_v")])
        t["ffn_gate_up"] = self.linear_group([tn("ffn_gate"), tn("ffn_up")])
        t["attn_output"] = self.linear(tn("attn_out"))
        t["ffn_down"] = self.linear(tn("ffn_down"))
        return LayerWeights(i, t)

    def block(self, w: LayerWeights, x: torch.Tensor, delta: torch.Tensor | None, step: Step,
              kv: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
        eps, ops = self.spec.norm_eps, self.ops
        x, h = ops.add_norm(x, delta, w.attn_norm, eps)
        q = self.attention_inputs(w, w.attn_qkv(h), kv, step)
        x, attn = self.output_rows(w, x, w.attn_output(self.attend(w.index, q, kv, step)), step)
        attn = ops.norm(attn, w.post_attention_norm, eps)
        x, h = ops.add_norm(x, attn, w.ffn_norm, eps)
        return x, ops.norm(w.ffn_down(ops.glu(w.ffn_gate_up(h), "geglu")), w.post_ffw_norm, eps)
