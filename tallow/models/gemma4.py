"""Gemma 4, dense variants (GGUF `gemma4`), as llama.cpp's src/models/gemma4.cpp computes them.

Per block: sandwich RMSNorms around attention and the GELU-gated MLP (per-layer widths: the
shared-KV layers of E2B/E4B are double wide); per-head RMSNorm of Q and K and a weightless
RMSNorm of V; attention scale 1; RoPE per layer type (sliding layers: their own base, head
size and window; global layers: `rope_freqs` factors that leave all but the first pairs
unrotated, "proportional" RoPE). The trailing `shared_kv_layers` compute only Q and attend
over an earlier layer's cache (spec.LayerSpec.kv_source; memory/kv_pool.py aliases it).

Per-layer embeddings (E2B/E4B, spec.per_layer_input_dim > 0): every token gathers one row of
`per_layer_token_embd` (n_layers x d values, read from the file per token, never dequantized whole),
adds a projection of its scaled embedding, and each block mixes its slice in after the MLP
through a GELU gate. An optional per-layer scalar scales each block's output; embeddings are
scaled by sqrt(dim) and logits soft-capped.
"""

from __future__ import annotations

import math

import torch

from ..families.tensors import PER_LAYER_TOKEN_EMBD
from ..layers import ggml_table_geglu, rms_norm
from ..memory.kv_pool import KVPool
from .base import DecoderModel, LayerWeights
from .step import FusedHeads, Step


class Gemma4Model(DecoderModel):
    def __init__(self, gf, spec, linear_mode=None, device="cpu", weight_cache=None, numerics=None):
        self.v_is_k: set[int] = set()  # layers whose V is their K projection (no attn_v)
        super().__init__(gf, spec, linear_mode, device, weight_cache, numerics)
        self.per_layer = None
        if spec.per_layer_input_dim:
            d, n_layers = spec.per_layer_input_dim, spec.n_layers
            names = self.tensor_names
            table = self._tensor(names.name(PER_LAYER_TOKEN_EMBD))
            if table.n_cols != d * n_layers or table.n_rows != spec.vocab_size:
                raise self._shape_error(table, [d * n_layers, spec.vocab_size])
            self.per_layer = {
                "token_embd": self.place.embedding(table),  # rows read per token from the file
                "model_proj": self.linear(names.name("per_layer_model_proj")),
                "proj_norm": self.norm_weight(names.name("per_layer_proj_norm")),
            }
            # Also listed with block 0's tensors, where the engine's walks over the model's
            # linears look (speculation's row-exactness, the prefill plan, nbytes).
            self.layers[0].tensors["per_layer_model_proj"] = self.per_layer["model_proj"]
            self.layers[0].tensors["per_layer_proj_norm"] = self.per_layer["proj_norm"]
        # V's RMSNorm has no weight: a row of ones keeps the fused one-call norm (x * 1 is exact).
        self.v_norm_ones = {}
        for layer in spec.layers:
            self.v_norm_ones.setdefault(layer.v_head_dim, torch.ones(layer.v_head_dim, device=self.device))

    def _shape_error(self, t, expected):
        from ..errors import ModelFileError

        return ModelFileError(f"{self.gf.path}: the tensor {t.name} has shape {list(t.shape)}, not {expected}.")

    def load_layer(self, i: int) -> LayerWeights:
        tn = self.tensor_names.block(i)  # role -> this block's GGUF name (families/gemma4.py)
        layer = self.spec.layers[i]
        norms = {"attn_norm": "attn_norm", "post_attention_norm": "attn_post_norm", "ffn_norm": "ffn_norm",
                 "post_ffw_norm": "ffn_post_norm"}
        t = {key: self.norm_weight(tn(role)) for key, role in norms.items()}
        q_norm = self.norm_weight(tn("attn_q_norm")).expand(layer.n_heads, -1)
        if layer.owns_kv:
            k_norm = self.norm_weight(tn("attn_k_norm")).expand(layer.n_kv_heads, -1)
            # One norm over the Q and K heads side by side: each head keeps its own weight row.
            t["attn_qk_norm"] = torch.cat((q_norm, k_norm))
            qkv = [tn("attn_q"), tn("attn_k")]
            # Without attn_v (llama.cpp: "use_alternative_attention") V is the K projection.
            if tn("attn_v") in self.gf.tensors:
                qkv.append(tn("attn_v"))
            else:
                self.v_is_k.add(i)
            t["attn_qkv"] = self.linear_group(qkv)
        else:  # a shared-KV layer: Q only, attending over its source layer's cache
            t["attn_q_norm"] = q_norm[0].contiguous()  # (hd,): the same weight for every head
            t["attn_q"] = self.linear(tn("attn_q"))
        t["ffn_gate_up"] = self.linear_group([tn("ffn_gate"), tn("ffn_up")])
        if tn("ffn_gate_inp") in self.gf.tensors:  # 26B-A4B: routed experts beside the MLP
            from .qwen3moe import load_gemma4_experts

            t.update(load_gemma4_experts(self, i))
        t["attn_output"] = self.linear(tn("attn_out"))
        t["ffn_down"] = self.linear(tn("ffn_down"))
        if tn("layer_out_scale") in self.gf.tensors:
            t["out_scale"] = self.norm_weight(tn("layer_out_scale"))  # (1,)
        if self.spec.per_layer_input_dim:
            t["ple_gate"] = self.linear(tn("per_layer_inp_gate"))  # dim -> d
            t["ple_proj"] = self.linear(tn("per_layer_proj"))  # d -> dim
            t["ple_post_norm"] = self.norm_weight(tn("per_layer_post_norm"))
        return LayerWeights(i, t)

    # -- forward ---------------------------------------------------------------------------
    def per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Each token's input to every block (n, n_layers, d): its row of the per-layer table
        scaled by sqrt(d), plus the normed projection of its scaled embedding x (n, dim) scaled
        by 1/sqrt(dim), the sum scaled by 1/sqrt(2) (llama.cpp's project_per_layer_inputs)."""
        spec, pl = self.spec, self.per_layer
        n, d = ids.shape[0], spec.per_layer_input_dim
        rows = pl["token_embd"](ids).view(n, spec.n_layers, d) * math.sqrt(d)
        proj = (pl["model_proj"](x) * (1.0 / math.sqrt(spec.dim))).view(n, spec.n_layers, d)
        proj = rms_norm(proj, pl["proj_norm"], spec.norm_eps)
        return (proj + rows) * (1.0 / math.sqrt(2.0))

    def _blocks(self, step: Step, kv: KVPool):
        x = self.embedding(step.ids) * self.spec.embed_scale  # (n, dim)
        inputs = self.per_layer_inputs(step.ids, x) if self.per_layer is not None else None
        if self.c_decode is not None and self.c_decode.applies(step, kv):  # every block in one C call
            return self.c_decode.run(x, step, kv, inputs)
        delta = h = None
        last = len(self.layers) - 1
        for w in self.layers:
            # A block that ends in a norm of the joined stream also computes the next block's
            # first norm in that launch (`h`); the last one leaves the output norm to run().
            next_norm = self.layers[w.index + 1].attn_norm if w.index < last else None
            x, delta, h = self.block(w, x, delta, step, kv, None if inputs is None else inputs[:, w.index], h, next_norm)
        return x, delta

    def attention_heads(self, w: LayerWeights, proj: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        """Q (n, nh, hd) of this block from its projection `proj`, normed and rotated at the step's
        positions: for a layer that owns its cache proj is Q, K (and V) side by side, and K
        (normed, rotated) and V (weightless-normed) are written to the pool; for a shared-KV
        layer proj is Q alone. (DecoderModel.attention_heads, which the backends call.)"""
        spec, layer = self.spec, self.spec.layers[w.index]
        n, eps = proj.shape[0], spec.norm_eps
        nh, nkv, hd = layer.n_heads, layer.n_kv_heads, layer.head_dim
        rope = self.rope[layer.rope_key]
        if not layer.owns_kv:
            return step.rotate(rope, rms_norm(proj.view(n, nh, hd), w.attn_q_norm, eps))
        qk = proj[:, : (nh + nkv) * hd].view(n, nh + nkv, hd)  # Q heads then K heads
        v = qk[:, nh:] if w.index in self.v_is_k else proj[:, (nh + nkv) * hd :].view(n, nkv, hd)
        v = rms_norm(v, self.v_norm_ones[layer.v_head_dim], eps)
        qk = step.rotate(rope, rms_norm(qk, w.attn_qk_norm, eps))
        step.store(kv, w.index, qk[:, nh:], v)
        return qk[:, :nh]

    def fused_heads(self, w: LayerWeights, proj: torch.Tensor):
        """attention_heads' views for the fused decode launch (models/step.py): Q only for a
        shared-KV layer; V weightless-normed, and K itself where the layer has no attn_v."""
        layer = self.spec.layers[w.index]
        n, nh, nkv, hd = proj.shape[0], layer.n_heads, layer.n_kv_heads, layer.head_dim
        if not layer.owns_kv:
            return FusedHeads(proj.view(n, nh, hd), None, None, w.attn_q_norm, None)
        k = proj[:, nh * hd : (nh + nkv) * hd].view(n, nkv, hd)
        v = k if w.index in self.v_is_k else proj[:, (nh + nkv) * hd :].view(n, nkv, hd)
        return FusedHeads(proj[:, : nh * hd].view(n, nh, hd), k, v, w.attn_qk_norm[0], w.attn_qk_norm[nh], True)

    def block(self, w: LayerWeights, x: torch.Tensor, delta: torch.Tensor | None, step: Step, kv: KVPool,
              per_layer: torch.Tensor | None = None, h: torch.Tensor | None = None,
              next_norm: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One block over x + delta; per_layer (n, d): this block's per-layer input (from _blocks,
        which computes them from the token ids; None without per-layer embeddings); h: this
        block's attention norm of x when the previous block computed it; next_norm: the next
        block's attention-norm weight. Returns the stream, a pending delta (as
        DecoderModel.block) and the next block's h where this block computed it."""
        eps, ops = self.spec.norm_eps, self.ops
        if h is None:
            x, h = ops.add_norm(x, delta, w.attn_norm, eps)
        proj = w.attn_qkv(h) if self.spec.layers[w.index].owns_kv else w.attn_q(h)
        q = self.attention_inputs(w, proj, kv, step)
        x, h = self._norm_add_norm(x, w.attn_output(self.attend(w.index, q, kv, step)), w.post_attention_norm,
                                   w.ffn_norm, eps, None, w.ffn_gate_up)
        mlp = w.ffn_down(ops.glu(w.ffn_gate_up(h), "geglu"))
        if w.get("ffn_experts") is not None:
            from .qwen3moe import gemma4_moe_ffn

            mlp = gemma4_moe_ffn(w, x, mlp, ops, eps, self.spec)
        if per_layer is None:
            if w.get("out_scale") is None:
                return x, ops.norm(mlp, w.post_ffw_norm, eps), None  # pending for the next block's norm
            # The scale applies to the whole stream: nothing pending.
            return ops.norm_add(x, mlp, w.post_ffw_norm, eps, w.out_scale), None, None
        x = ops.norm_add(x, mlp, w.post_ffw_norm, eps)
        gate = w.ple_gate(x)
        # With the Triton ops one launch (kernels/triton/glu.py's GeGLU); the CPU keeps ggml's table, whose
        # GELU moves the tiny model's logits 7e-3 closer to llama.cpp's than torch's fp16 GELU does.
        gate = ops.gated(gate, per_layer, "geglu") if ops.fused_step else ggml_table_geglu(gate, per_layer)
        branch, scale = w.ple_proj(gate), w.get("out_scale")
        if next_norm is None:
            return ops.norm_add(x, branch, w.ple_post_norm, eps, scale), None, None
        nxt = self.layers[w.index + 1]  # h is its attention input alone
        x, h = self._norm_add_norm(x, branch, w.ple_post_norm, next_norm, eps, scale,
                                   nxt.attn_qkv if self.spec.layers[nxt.index].owns_kv else nxt.attn_q)
        return x, None, h

    def _norm_add_norm(self, x, branch, weight, next_weight, eps, scale, consumer):
        """ops.norm_add_norm, whose normed output h only `consumer` reads: with the GPU's Triton ops
        the norm's launch also writes h's Q8_1 blocks where consumer takes them (gpu/linear.py
        norm_add_norm_q8, TALLOW_NORM_ADD_Q8)."""
        if self.ops.fused_step:
            from ..kernels.gpu.linear import norm_add_norm_q8

            return norm_add_norm_q8(self.ops, x, branch, weight, next_weight, eps, scale, consumer)
        return self.ops.norm_add_norm(x, branch, weight, next_weight, eps, scale)
