"""Qwen3-MoE (GGUF `qwen3moe`, Qwen3-30B-A3B style), as llama.cpp's src/models/qwen3moe.cpp
computes it: qwen3's attention block (per-head Q/K RMSNorm, neox RoPE), and in place of the MLP
a router (`ffn_gate_inp`, n_experts x dim) whose softmax picks the top `expert_used_count`
experts per token, their probabilities renormalized to sum to 1; each chosen expert is a
SwiGLU MLP of width `expert_feed_forward_length` (`ffn_gate_exps` / `ffn_up_exps` /
`ffn_down_exps`, 3-D: one matrix per expert). No shared expert.

`moe_ffn(w, h, ...)` and `load_experts` are the routed FFN itself, shared with Gemma 4's
26B-A4B layers (models/gemma4.py). How the experts run is kernels/cpu/moe.py's (CPU) and
kernels/gpu/moe.py's (GPU) business.
"""

from __future__ import annotations

import torch

from .. import switches
from ..errors import ModelFileError
from ..families.tensors import EXPERT
from ..kernels.cpu.moe import ExpertBank, expert_slice
from .base import DecoderModel, LayerWeights
from .qwen import Qwen3Model

# The roles of one layer's routed-expert tensors (their GGUF names: families/tensors.py).
ROUTER = "ffn_gate_inp"
GATE_EXPS, UP_EXPS, GATE_UP_EXPS, DOWN_EXPS = "ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps", "ffn_down_exps"


def load_experts(model: DecoderModel, i: int) -> ExpertBank:
    """Layer i's routed experts: per expert one gate/up linear (from `ffn_gate_up_exps`, or
    `ffn_gate_exps` and `ffn_up_exps` stacked) and one down linear, each cut out of the 3-D
    tensor without a copy and packed by the dense layers' kernels; plus `ffn_down_exps.scale`,
    a per-expert output scale, where the file has it."""
    spec, gf, tn = model.spec, model.gf, model.tensor_names.block(i)
    n, width, dim = spec.n_experts, spec.expert_ffn_dim, spec.dim

    def tensor(name: str, shape: list[int]):
        t = model._tensor(tn(name))
        if list(t.shape) != shape:
            raise ModelFileError(f"{gf.path}: the tensor {t.name} has shape {list(t.shape)}, not {shape}.")
        return t

    down = tensor(DOWN_EXPS, [width, dim, n])
    merged = tn(GATE_UP_EXPS) in gf.tensors
    if model.place.on_gpu:  # stacked as the file stores them, the chosen experts found on the device
        from ..kernels.gpu.moe import stack_experts, stackable  # Triton: imported only for the GPU

        gate_up = [tensor(GATE_UP_EXPS, [dim, 2 * width, n])] if merged else [
            tensor(GATE_EXPS, [dim, width, n]), tensor(UP_EXPS, [dim, width, n])]
        gate_up_layers = [stack_experts(gate_up, n, model.device)] if stackable(gate_up) else [
            stack_experts([t], n, model.device) for t in gate_up]
        down_layer = stack_experts([down], n, model.device)
    elif merged:
        gate_up = tensor(GATE_UP_EXPS, [dim, 2 * width, n])
        gate_up_layers = [model.place.cached([f"{gate_up.name}[{e}]"],
                                             lambda e=e: model.place.linear(expert_slice(gate_up, e, n), role=EXPERT))
                          for e in range(n)]
    else:
        gate, up = tensor(GATE_EXPS, [dim, width, n]), tensor(UP_EXPS, [dim, width, n])
        gate_up_layers = [model.place.cached([f"{gate.name}[{e}]", f"{up.name}[{e}]"], lambda e=e: model.place.linear_group(
                          [model.place.linear(expert_slice(gate, e, n), role=EXPERT), model.place.linear(expert_slice(up, e, n), role=EXPERT)]))
                          for e in range(n)]
    if not model.place.on_gpu:
        down_layers = [model.place.cached([f"{down.name}[{e}]"], lambda e=e: model.place.linear(expert_slice(down, e, n), role=EXPERT))
                       for e in range(n)]
    def per_expert(name: str) -> torch.Tensor | None:
        if tn(name, "scale") not in gf.tensors:
            return None
        scale = model.norm_weight(tn(name, "scale"))
        if scale.numel() != n:
            raise ModelFileError(f"{gf.path}: the tensor {tn(name, 'scale')} has {scale.numel()} values for {n} experts.")
        return scale

    # Per-expert output scales: of the down product (gemma4's per_expert_scale; NVFP4 global
    # scales), and of gate and up (NVFP4; a merged gate/up takes ffn_up_exps.scale, as llama.cpp).
    gate_s, up_s = per_expert(GATE_EXPS), per_expert(UP_EXPS)
    gate_up_scale = None
    if merged:
        gate_up_scale = None if up_s is None else up_s[:, None].contiguous()  # (n, 1): both halves
    elif gate_s is not None or up_s is not None:
        ones = torch.ones(n, device=model.device)
        gate_up_scale = torch.stack((gate_s if gate_s is not None else ones, up_s if up_s is not None else ones), dim=1)
    if model.place.on_gpu:
        from ..kernels.gpu.moe import GPUExpertBank

        return GPUExpertBank(gate_up_layers, down_layer, per_expert(DOWN_EXPS), gate_up_scale, model.place._scratch)
    return ExpertBank(gate_up_layers, down_layers, per_expert(DOWN_EXPS), gate_up_scale)


# The `.scale` tensors these files may carry that tallow applies (the rest are refused); Gemma 4
# also scales its router's input (ffn_gate_inp.scale).
EXPERT_SCALES = (GATE_EXPS, UP_EXPS, DOWN_EXPS)


def refuse_unapplied_scales(model: DecoderModel, i: int, applied: tuple[str, ...] = EXPERT_SCALES) -> None:
    """NVFP4 files carry a per-tensor FP32 scale beside each weight (`<name>.scale`, multiplying
    the product's output); tallow applies the experts' and the router's only, so a file with
    others is refused in one sentence rather than run with them missing."""
    p = f"blk.{i}."
    for name in model.gf.tensors:
        if name.startswith(p) and name.endswith(".scale") and name[len(p) : -len(".scale")] not in applied:
            raise ModelFileError(f"{model.gf.path}: the weight scale {name} (an NVFP4 file's per-tensor scale) is "
                                 "not applied by this version of tallow; only routed experts' scales are.")


def moe_ffn(w: LayerWeights, h: torch.Tensor, logits: torch.Tensor, k: int, glu) -> torch.Tensor:
    """The routed experts' output for the normed rows h (n, dim): softmax of the router logits
    (n, n_experts), the top k experts per row with renormalized weights, their weighted sum.
    glu: the experts' gate/up activation, (m, 2 * width) -> (m, width)."""
    weights, ids = w.ffn_experts.route(logits, k)
    return w.ffn_experts(h, ids, weights, glu)


def load_gemma4_experts(model: DecoderModel, i: int) -> dict:
    """Gemma 4 26B-A4B's tensors of layer i beside its dense MLP (llama.cpp's gemma4.cpp): the
    router and its input scale, the routed experts, and the three extra norms."""
    refuse_unapplied_scales(model, i, EXPERT_SCALES + (ROUTER,))
    tn = model.tensor_names.block(i)
    router = model._tensor(tn(ROUTER))
    if list(router.shape) != [model.spec.dim, model.spec.n_experts]:
        raise ModelFileError(f"{model.gf.path}: the tensor {router.name} has shape {list(router.shape)}, "
                             f"not {[model.spec.dim, model.spec.n_experts]}.")
    norms = {"post_ffw_norm_1": "ffn_post_norm_1", "pre_ffw_norm_2": "ffn_pre_norm_2", "post_ffw_norm_2": "ffn_post_norm_2"}
    t = {key: model.norm_weight(tn(role)) for key, role in norms.items()}
    t["ffn_gate_inp"] = model.linear(router.name)
    t["ffn_gate_inp_scale"] = model.norm_weight(tn(ROUTER, "scale"))
    if model.place.on_gpu:  # the router input's two scalings as the norm's weight: two launches fewer a layer
        t["router_norm_weight"] = t["ffn_gate_inp_scale"] * (1.0 / model.spec.dim**0.5)
    t["ffn_experts"] = load_experts(model, i)
    return t


_ONES: dict = {}  # (dim, device) -> a weightless RMSNorm's row of ones


def gemma4_moe_ffn(w: LayerWeights, x: torch.Tensor, mlp: torch.Tensor, ops, eps: float, spec) -> torch.Tensor:
    """Gemma 4 26B-A4B's FFN output before post_ffw_norm, from the attention output x (n, dim)
    and the dense MLP's output `mlp`: post_ffw_norm_1(mlp) + post_ffw_norm_2(experts), the experts
    over pre_ffw_norm_2(x), routed by the logits of rms_norm(x) / sqrt(dim) * ffn_gate_inp.scale."""
    folded = w.get("router_norm_weight") if switches.enabled("TALLOW_MOE_SCALE_FOLD") else None
    if folded is not None:  # GPU: x * rstd * (scale / sqrt(dim)), the product's rounding order aside the same
        router_in = ops.norm(x, folded, eps)
    else:  # llama.cpp's order of operations (the CPU's routes are its routes)
        ones = _ONES.get((spec.dim, x.device))
        if ones is None:
            ones = _ONES[(spec.dim, x.device)] = torch.ones(spec.dim, device=x.device)
        router_in = ops.norm(x, ones, eps) * (1.0 / spec.dim**0.5) * w.ffn_gate_inp_scale
    routed = moe_ffn(w, ops.norm(x, w.pre_ffw_norm_2, eps), w.ffn_gate_inp(router_in), spec.n_experts_used,
                     lambda gu: ops.glu(gu, "geglu"))
    return ops.norm(mlp, w.post_ffw_norm_1, eps) + ops.norm(routed, w.post_ffw_norm_2, eps)


class Qwen3MoeModel(Qwen3Model):
    def __init__(self, gf, spec, linear_mode=None, device="cpu", weight_cache=None, numerics=None):
        if not spec.n_experts:
            raise ModelFileError(f"{gf.path}: a qwen3moe model needs {spec.architecture}.expert_count > 0.")
        super().__init__(gf, spec, linear_mode, device, weight_cache, numerics)

    def load_layer(self, i: int) -> LayerWeights:
        refuse_unapplied_scales(self, i)
        tn = self.tensor_names.block(i)  # role -> this block's GGUF name (families/qwen.py)
        layer = self.spec.layers[i]
        q_norm = self.norm_weight(tn("attn_q_norm"))
        k_norm = self.norm_weight(tn("attn_k_norm"))
        t = {
            "attn_norm": self.norm_weight(tn("attn_norm")),
            "attn_qkv": self.linear_group([tn("attn_q"), tn("attn_k"), tn("attn_v")]),
            "attn_output": self.linear(tn("attn_out")),
            # One norm over the Q and K heads side by side: each head keeps its own weight row.
            "attn_qk_norm": torch.cat((q_norm.expand(layer.n_heads, -1), k_norm.expand(layer.n_kv_heads, -1))),
            "ffn_norm": self.norm_weight(tn("ffn_norm")),
            "ffn_gate_inp": self.linear(tn(ROUTER)),  # (n, n_experts)
            "ffn_experts": load_experts(self, i),
        }
        router = self._tensor(tn(ROUTER))
        if list(router.shape) != [self.spec.dim, self.spec.n_experts]:
            raise ModelFileError(f"{self.gf.path}: the tensor {router.name} has shape {list(router.shape)}, "
                                 f"not {[self.spec.dim, self.spec.n_experts]}.")
        return LayerWeights(i, t)

    def mlp(self, w: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        """Routed experts in place of the MLP (the attention half is qwen3's block)."""
        return moe_ffn(w, h, w.ffn_gate_inp(h), self.spec.n_experts_used, lambda gu: self.ops.glu(gu, "swiglu"))
