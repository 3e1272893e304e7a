"""Routed experts on the CPU: each expert's matrices as ordinary linears, run only when chosen.

A GGUF expert tensor is 3-D (ggml shape [row length, rows, n_experts]): expert e's matrix is
the e-th run of `rows` consecutive rows, so `expert_slice` cuts it out of the file map without a
copy and the dense layers' kernels (int4 / int8 / dense, kernels/cpu/linear.py) pack it as any
2-D weight. Per token only the chosen experts' packed bytes are read: decode calls k experts'
linears, a multi-token chunk groups its rows by expert and calls each chosen expert once.

The combination follows llama.cpp's build_moe_ffn: expert outputs, each scaled by its routing
weight (and a per-expert output scale where the file has one), summed in the order of the
top-k slots (slot 0, the most probable expert, first), so float32 runs add in the same order.

TALLOW_MOE_GROUPED=0 runs a multi-token chunk token by token (each token's experts in slot
order, as decode does): the reference the grouped path is tested against.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ... import switches
from ...errors import ModelFileError
from ...gguf_file import TensorInfo

__all__ = ["expert_slice", "route_softmax", "ExpertBank", "grouped_enabled"]

# llama.cpp clamps the sum of the chosen probabilities to the smallest normal fp16 before dividing.
MIN_WEIGHT_SUM = 6.103515625e-5


def grouped_enabled() -> bool:
    return switches.enabled("TALLOW_MOE_GROUPED")


def expert_slice(t: TensorInfo, e: int, n_experts: int) -> TensorInfo:
    """Expert e's 2-D matrix of the 3-D expert tensor t, a view of the file map (no copy)."""
    if len(t.shape) != 3 or t.shape[2] != n_experts:
        raise ModelFileError(f"The tensor {t.name} has shape {list(t.shape)}, not [row length, rows, {n_experts}].")
    rows = t.shape[1]
    row_bytes = t.data.shape[1]
    return TensorInfo(f"{t.name}[{e}]", t.qtype, (t.shape[0], rows), t.offset + e * rows * row_bytes,
                      rows * row_bytes, t.data[e * rows : (e + 1) * rows])


def route_softmax(logits: torch.Tensor, k: int, normalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts' router logits (n, n_experts) fp32, the k most probable experts per
    row, most probable first. Returns (weights (n, k) fp32, ids (n, k) int64); with `normalize`
    the k weights are divided by their sum (llama.cpp's norm_w, qwen3moe and gemma4)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, k, dim=-1, sorted=True)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True).clamp(min=MIN_WEIGHT_SUM)
    return weights, ids


class ExpertBank:
    """The routed experts of one layer: per expert a gate/up linear (gate and up side by side,
    (m, 2 * ffn)) and a down linear, and an optional per-expert output scale (n_experts,)."""

    def __init__(self, gate_up: list, down: list, out_scale: torch.Tensor | None = None,
                 gate_up_scale: torch.Tensor | None = None):
        """gate_up_scale: per expert the multipliers of its gate/up output, (n_experts, 2) for gate
        and up, or (n_experts, 1) for both (NVFP4 files' per-expert global scales,
        `ffn_gate_exps.scale` / `ffn_up_exps.scale`), or None."""
        if len(gate_up) != len(down) or not gate_up:
            raise ValueError("an expert bank needs one gate/up and one down linear per expert")
        self.gate_up, self.down, self.out_scale = gate_up, down, out_scale
        self.gate_up_scale = gate_up_scale
        self.n_experts = len(gate_up)
        self.dim = down[0].out_features
        # The kinds of its kernels, as a fused linear names them, plus "routed": the engine's
        # walks over the model's linears read this (speculation's row-exactness, the prefill
        # plan's row invariance, the KV store's numerics key), and a bank is not row-invariant:
        # how many rows an expert gets decides its kernel (below or above dequant_matmul's
        # MIN_ROWS), so a row's numbers depend on the other rows of its chunk.
        self.kind = "+".join(["routed", *sorted({part for p in self.linears() for part in str(p.kind).split("+")})])

    @property
    def nbytes(self) -> int:
        scale = sum(t.numel() * 4 for t in (self.out_scale, self.gate_up_scale) if t is not None)
        return sum(p.nbytes for p in self.gate_up) + sum(p.nbytes for p in self.down) + scale

    def linears(self) -> list:
        return [*self.gate_up, *self.down]

    def expert(self, e: int, x: torch.Tensor, glu: Callable) -> torch.Tensor:
        """Expert e's FFN of the rows x (m, dim): down(glu(gate_up(x))) (m, dim) fp32."""
        gate_up = self.gate_up[e](x)
        if self.gate_up_scale is not None:  # llama.cpp scales the product's output, before the GLU
            m, parts = gate_up.shape[0], self.gate_up_scale.shape[1]
            gate_up = (gate_up.view(m, parts, -1) * self.gate_up_scale[e].view(1, parts, 1)).view(m, -1)
        return self.down[e](glu(gate_up))

    def route(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return route_softmax(logits, k)

    def __call__(self, h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, glu: Callable) -> torch.Tensor:
        """sum over slots s of weights[:, s] * scale[e] * expert_e(h) for e = ids[:, s]; h (n, dim)
        fp32, ids/weights (n, k) from `route_softmax`. Returns (n, dim) fp32."""
        n, k = ids.shape
        out = torch.empty((n, k, self.dim), dtype=torch.float32, device=h.device)
        chosen = ids.tolist()  # the experts to run are decided on the host
        if n == 1 or not grouped_enabled():
            for t in range(n):
                for s, e in enumerate(chosen[t]):
                    out[t, s] = self.expert(e, h[t : t + 1], glu)[0]
        else:
            flat = out.view(n * k, self.dim)
            by_expert: dict[int, list[int]] = {}
            for t, row in enumerate(chosen):
                for s, e in enumerate(row):
                    by_expert.setdefault(e, []).append(t * k + s)
            for e, slots in by_expert.items():  # each chosen expert once, over all its rows
                idx = torch.tensor(slots, device=h.device)
                flat[idx] = self.expert(e, h.index_select(0, idx // k), glu)
        if self.out_scale is not None:  # llama.cpp scales the expert's output, then weights it
            out = out * self.out_scale[ids].unsqueeze(-1)
        out = out * weights.unsqueeze(-1)
        acc = out[:, 0]
        for s in range(1, k):  # slot order, as llama.cpp adds its expert views
            acc = acc + out[:, s]
        return acc
