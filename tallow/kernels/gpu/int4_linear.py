"""Q4_0/Q4_1/Q4_K weights on the GPU through torch's tinygemm int4 kernel (opt-in experiment).

The GGUF nibbles are exact int4 codes; each 32-element group's scale and offset become
tinygemm's bf16 (scale, zero) pair, the same affine form the CPU int4 path uses (its bf16
rounding is measured by the CPU conformance suite). tinygemm is torch's tuned batch-1 int4
kernel (`aten._weight_int4pack_mm`, sm80+); this layer exists to measure it against the
Triton GEMV on the same weights. TALLOW_GPU_TINYGEMM=1 turns it on.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ...gguf_file import TensorInfo
from ...quant.pack import INT4_TYPES, int4_codes

INNER_K_TILES = 8


def tinygemm_enabled() -> bool:
    return os.environ.get("TALLOW_GPU_TINYGEMM", "0") == "1"


def can_use(tensor: TensorInfo) -> bool:
    return tensor.qtype in INT4_TYPES and tensor.n_cols % 1024 == 0 and tensor.n_rows % 8 == 0


class GPUInt4Linear:
    """y = x @ W^T (+ b), x float32 (..., K) -> float32 (..., N), W as tinygemm int4."""

    kind = "tinygemm_int4"

    def __init__(self, tensor: TensorInfo, bias: np.ndarray | None, device: torch.device):
        self.tensor = tensor
        self.name = tensor.name
        self.in_features = tensor.n_cols
        self.out_features = tensor.n_rows
        q, scale, zero = int4_codes(tensor.data, tensor.qtype, tensor.n_cols)  # (N, K) uint8, (N, K/32) x2
        q = q.to(torch.int32)
        w_uint8 = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8).to(device)  # (N, K/2)
        self.packed = torch.ops.aten._convert_weight_to_int4pack(w_uint8, INNER_K_TILES)
        # (K/32, N, 2) bf16: tinygemm's layout of per-group (scale, zero)
        self.scales_zeros = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous().to(device, torch.bfloat16)
        self.bias = None if bias is None else torch.as_tensor(np.asarray(bias, dtype=np.float32)).to(device)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + self.scales_zeros.numel() * 2

    def can_stack(self, other) -> bool:
        return isinstance(other, GPUInt4Linear) and other.tensor.qtype == self.tensor.qtype and other.in_features == self.in_features

    @classmethod
    def stacked(cls, parts: list["GPUInt4Linear"]) -> "GPUInt4Linear":
        """One layer over the parts' GGUF rows stacked along N (same type and K)."""
        from dataclasses import replace

        first = parts[0].tensor
        data = np.concatenate([p.tensor.data for p in parts])
        n = data.shape[0]
        tensor = replace(first, name="+".join(p.name for p in parts), shape=(first.shape[0], n), n_bytes=data.nbytes, data=data)
        bias = None
        if any(p.bias is not None for p in parts):
            bias = np.concatenate([p.bias.cpu().numpy() if p.bias is not None else np.zeros(p.out_features, np.float32) for p in parts])
        return cls(tensor, bias, parts[0].packed.device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm(x2, self.packed, 32, self.scales_zeros).float()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)
