"""A linear layer with ggml's CPU arithmetic (TALLOW_NUMERICS=ggml): kind "ggml".

ggml's quantized product rounds the activations to the weight's vec_dot_type
(q8_activations.py), takes integer dot products per block and scales them:

  Q4_0/Q5_0/Q8_0 x Q8_0:  sum_b d_w d_x sum(q_w q_x)
  Q4_1/Q5_1 x Q8_1:       sum_b d_w d_x sum(q_w q_x) + m_w s_x        (s_x: fp16 block sum)
  K-quants x Q8_K:        sum_sb d_x (d_w sc_j sum(q_w q_x) - dmin_w m_j bsum_j)

Every term but the Q8_1 block sum is the product of the dequantized weight (exact in
float32: fp16 scales times small integers) with the rounded activations (scale times
code), so this layer computes x_hat @ W^T with an fp32 weight, plus the Q8_1 correction
min_w * (s_x - d_x sum q_x) as a second small product. What remains between this and
llama.cpp is the order of float32 additions (ggml sums 8 or 16 lanes, then reduces),
a relative ~1e-7 of the sum of |terms| -- measured against libggml-cpu itself on random
blocks in tests/test_ggml_numerics.py.

It holds the weight in fp32 (4 bytes per weight), so it is a reference-speed path.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from ...gguf_file import TensorInfo
from ...quant.reference import _as_uint8_tensor, block_dims, dequantize
from .linear import Linear
from .q8_activations import VEC_DOT_TYPE, round_activations

# Byte offset of the fp16 min in a block of the types paired with Q8_1.
_MIN_OFFSET = {QT.Q4_1: 2, QT.Q5_1: 2}


def block_mins(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int) -> torch.Tensor:
    """The fp16 per-block min m of a Q4_1/Q5_1 weight, (N, K/32) float32."""
    b = _as_uint8_tensor(raw)
    block_bytes = block_dims(qtype)[1]
    blocks = b.reshape(-1, block_bytes)
    off = _MIN_OFFSET[qtype]
    m = blocks[:, off : off + 2].contiguous().view(torch.float16).float()
    return m.reshape(b.shape[0], n_cols // 32)


class GgmlLinear(Linear):
    """y = ggml_mul_mat(W, x) as libggml-cpu computes it, up to float addition order."""

    kind = "ggml"

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None):
        super().__init__(tensor.name, tensor.n_cols, tensor.n_rows, bias)
        if tensor.qtype not in VEC_DOT_TYPE:
            raise ValueError(f"{tensor.name}: no ggml numerics for type {QT(tensor.qtype).name}")
        self.qtype = QT(tensor.qtype)
        w = torch.empty(tensor.n_rows, tensor.n_cols, dtype=torch.float32)
        step = max(1, (1 << 22) // max(tensor.n_cols, 1))
        for r0 in range(0, tensor.n_rows, step):  # chunked: the dequantizer's temporaries stay small
            w[r0 : r0 + step] = dequantize(tensor.data[r0 : r0 + step], tensor.qtype, tensor.n_cols)
        self.weight = w  # (N, K) fp32, exact dequantized values
        self.mins = block_mins(tensor.data, self.qtype, tensor.n_cols) if self.qtype in _MIN_OFFSET else None

    def _tensors(self) -> list[torch.Tensor]:
        extra = [self.mins] if self.mins is not None else []
        return [self.weight, *extra, *super()._tensors()]

    def _mm_native(self, xc: torch.Tensor) -> torch.Tensor:
        return self._mm(xc)  # compute_dtype is float32: FusedLinear hands over the input as is

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        x_hat, sum_correction = round_activations(x2.float(), self.qtype)  # (M, K), (M, K/32) or None
        y = F.linear(x_hat, self.weight)  # (M, N)
        if sum_correction is not None:
            y = y + F.linear(sum_correction, self.mins)
        return y
