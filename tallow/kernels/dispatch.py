"""Chooses how each layer runs: by device (CPU torch kernels or GPU Triton kernels) and type.

Model files ask this module for their linears and embedding and never see a device; the
per-path switches (TALLOW_INT4, TALLOW_TRITON_GEMV, ...) live with the kernels they turn off.
"""

from __future__ import annotations

import numpy as np
import torch

from ..gguf_file import TensorInfo
from .block_ops import block_ops


class LinearGroup:
    """Several linears over one input, outputs side by side: on the GPU, the runs of Q/K/V or
    gate/up that could not be stacked into one weight (different quant types, as in Q4_K_M
    files). On the CPU `FusedLinear` plays this part."""

    def __init__(self, parts: list):
        self.parts = parts
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.kind = "+".join(p.kind for p in parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # Each part writes its own columns of one output: no concatenation kernel.
        out = torch.empty((*x.shape[:-1], self.out_features), dtype=torch.float32, device=x.device)
        flat, col = out.view(-1, self.out_features), 0
        if isinstance(x, torch.Tensor) and x.dim() == 2 and sum(getattr(p, "decode_q8", lambda _: False)(x)
                                                                for p in self.parts) > 1:
            from .gpu.linear import SharedQ8

            x = SharedQ8(x)  # one Q8_1 quantization for the parts' integer-dot GEMVs
        for part in self.parts:
            part(x, out=flat[:, col : col + part.out_features])
            col += part.out_features
        return out


class Placement:
    """Where a model's weights live and which kernels run them."""

    def __init__(self, device: torch.device | str = "cpu", linear_mode: str | None = None, weight_cache=None):
        self.device = torch.device(device)
        self.linear_mode = linear_mode
        self.weight_cache = weight_cache  # memory/weight_cache.WeightCache, or None: always build
        self._scratch = None
        self.ops = block_ops(self.on_gpu)
        if self.on_gpu:
            from .gpu.linear import Scratch

            self._scratch = Scratch(self.device)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def cached(self, names: list[str], build):
        """The layer over the GGUF tensors `names`: mapped from the weight cache when it holds
        it, else `build()` (then recorded for the cache file)."""
        return build() if self.weight_cache is None else self.weight_cache.layer(names, build)

    def linear(self, tensor: TensorInfo, bias: np.ndarray | None = None, role: str | None = None):
        """role: the tensor's model-wide role where the kernels treat it specially
        (families/tensors.OUTPUT: the output projection), else None."""
        if self.on_gpu:
            from .gpu.linear import GPULinear

            return GPULinear(tensor, bias, self.device, self._scratch)
        from .cpu.linear import make_linear

        return make_linear(tensor, bias, mode=self.linear_mode, role=role)

    def linear_group(self, parts: list):
        if self.on_gpu:
            # Consecutive parts of one quant type become one stacked weight (one launch).
            runs: list[list] = [[parts[0]]]
            for part in parts[1:]:
                if runs[-1][-1].can_stack(part):
                    runs[-1].append(part)
                else:
                    runs.append([part])
            merged = [type(run[0]).stacked(run) if len(run) > 1 else run[0] for run in runs]
            from .gpu.linear import join_q8

            join_q8(merged)
            return merged[0] if len(merged) == 1 else LinearGroup(merged)
        from .cpu.fused_linear import FusedLinear

        return FusedLinear(parts)

    def share_input(self, layers: list) -> None:
        """Linears (or groups) that read one input, e.g. Falcon-H1's Q/K/V and its mixer's
        in-projection: on the GPU, where one of them takes the integer-dot GEMV, the others of an
        integer-dot type join it and read the Q8_1 x it quantizes anyway (gpu/linear.join_q8;
        TALLOW_HYBRID_JOIN_Q8=0: each keeps its own kernel choice). Nothing on the CPU."""
        if not self.on_gpu:
            return
        from .. import switches
        from .gpu.linear import join_q8

        if switches.enabled("TALLOW_HYBRID_JOIN_Q8"):
            join_q8([p for layer in layers for p in (layer.parts if isinstance(layer, LinearGroup) else [layer])])

    def embedding(self, tensor: TensorInfo):
        if self.on_gpu:
            from .gpu.linear import GPUEmbedding

            return GPUEmbedding(tensor, self.device)
        from .cpu.linear import make_embedding

        return make_embedding(tensor)

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device)
