"""Falcon-H1 (GGUF `falcon-h1`), as llama.cpp's src/models/falcon-h1.cpp builds it.

Every block runs attention and a Mamba-2 mixer side by side on the same normed input and adds
both to the residual, then a SwiGLU MLP:
    h = RMSNorm(x, attn_norm)
    x = x + Attention(h) + Mamba2(h)         (llama-style attention, NEOX RoPE, GQA)
    x = x + MLP(RMSNorm(x, ffn_norm))
Falcon-H1's multipliers (attention in/out, key, SSM in/out and per-segment, MLP, embedding,
LM head) are folded into the weights by llama.cpp's converter, so the graph has none. Every
layer owns a K/V cache and a recurrent state (memory/recurrent.RecurrentMemory holds both).

On the CPU a one-row decode step runs every block in one C call (kernels/cpu/decode_layer.py, TALLOW_CPU_C_LAYER):
the same calls as `block` below with its C mixer, so the same bits; `block` runs where it steps aside.
"""

from __future__ import annotations

import torch

from .. import switches
from ..kernels.cpu import c_ssm
from .base import LayerWeights
from .mamba import MambaModel


class FalconH1Model(MambaModel):
    # Its attention inputs are llama's (Q/K/V split, NEOX RoPE, no Q/K norm): the GPU decode step
    # may run them as the one fused Triton launch (models/step.py); MambaModel has no attention.
    fused_attention_inputs = True

    def load_layer(self, i: int) -> LayerWeights:
        w = super().load_layer(i)  # attn_norm and the Mamba-2 mixer's tensors
        tn = self.tensor_names.block(i)  # families/falcon_h1.py
        t = w.tensors
        if self.stacks_in_projection():
            # The mixer's in-projection and Q/K/V read the same normed input: on the GPU one weight stacked
            # from them (in-projection first, so Q/K/V stay side by side and a V of another quant type is
            # the group's second part), one decode launch instead of two or three; no `ssm_in`, `attn_qkv`.
            t["in_qkv"] = self.linear_group([tn("ssm_in"), tn("attn_q"), tn("attn_k"), tn("attn_v")])
        else:
            t["attn_qkv"] = self.linear_group([tn("attn_q"), tn("attn_k"), tn("attn_v")])
        t["attn_output"] = self.linear(tn("attn_out"))
        # Falcon-H1 files name it `blk.N.ffn_norm` (no `.weight`: llama.cpp's converter maps the
        # whole `pre_ff_layernorm.weight` to it); accept either name.
        t["ffn_norm"] = self.norm_weight(tn("ffn_norm", "") if tn("ffn_norm", "") in self.gf.tensors else tn("ffn_norm"))
        t["ffn_gate_up"] = self.linear_group([tn("ffn_gate"), tn("ffn_up")])
        t["ffn_down"] = self.linear(tn("ffn_down"))
        # Q/K/V read the same normed input as the mixer's in-projection: on the GPU they share its
        # Q8_1 quantization (integer-dot GEMVs) instead of fp32 GEMVs re-applying the norm
        if "in_qkv" not in t:
            self.place.share_input([t["attn_qkv"], t["ssm_in"]])
        return w

    def block(self, w: LayerWeights, x: torch.Tensor, delta, step, kv):
        eps, ops = self.spec.norm_eps, self.ops
        x, h = ops.add_norm(x, delta, w.attn_norm, eps)
        c_step = self._c_decode_mixer(w, h, kv, step)
        if c_step is not None:  # CPU decode: Q/K/V and the mixer's in-projection in one product, the mixer in one C call
            plan, mixer = c_step
            both = plan(h)
            nqkv = w.attn_qkv.out_features
            q = self.attention_inputs(w, both[:, :nqkv], kv, step)
            m = mixer(None, kv.state.conv[w.index], kv.state.scan[w.index], proj=both[:, nqkv:])
            mixed = w.attn_output(self.attend(w.index, q, kv, step)) + m
        else:
            proj = None
            if w.get("in_qkv") is not None:  # one product, the in-projection's columns first
                both = w.in_qkv(h)
                d_in = both.shape[1] - self.qkv_width(w.index)
                proj, qkv = both[:, :d_in], both[:, d_in:]
            else:
                qkv = w.attn_qkv(h)
            q = self.attention_inputs(w, qkv, kv, step)
            attn = w.attn_output(self.attend(w.index, q, kv, step))
            mixed = self.mixer(w, h, kv, step.scratch.get("n_valid"), proj=proj, addend=attn)  # attn + the mixer's output
        x, h = ops.add_norm(x, mixed, w.ffn_norm, eps)
        return x, w.ffn_down(ops.glu(w.ffn_gate_up(h), "swiglu"))

    def stacks_in_projection(self) -> bool:
        return self.place.on_gpu and switches.enabled("TALLOW_HYBRID_STACK_IN")

    def qkv_width(self, index: int) -> int:
        layer = self.spec.layers[index]
        return (layer.n_heads + layer.n_kv_heads) * layer.head_dim + layer.n_kv_heads * layer.v_head_dim

    def _c_decode_mixer(self, w: LayerWeights, h: torch.Tensor, kv, step):
        """(the Q/K/V + in-projection plan, the layer's C mixer) for a one-row host decode step on the CPU
        (TALLOW_CPU_C_MIXER), or None: the composed block runs."""
        if (self.c_mixers is None or h.shape[0] != 1 or not step.on_host or kv.keeping_rows or "in_qkv" in w.tensors
                or step.scratch.get("n_valid") is not None or h.dtype != torch.float32 or not h.is_contiguous()):
            return None
        plans = self.__dict__.setdefault("_qkv_in_plans", {})
        if w.index not in plans:
            plans[w.index] = c_ssm.products([w.attn_qkv, w.ssm_in])  # None where a part is not C-kernel or has a bias
        fused = plans[w.index]
        mixer = self.c_mixer(w, kv, in_plan=fused) if fused is not None else None
        return None if mixer is None else (fused, mixer)
