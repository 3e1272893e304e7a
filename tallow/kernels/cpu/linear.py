"""CPU linear layers and embeddings over GGUF tensors.

Model files call `make_linear(tensor, bias)` for every weight matrix and `make_embedding(tensor)`
for token tables; they never look at quantization types. The choice of kernel per type:

  Q4_0, Q4_1, Q4_K      -> Int4Linear   (tinygemm int4, exact codes, bf16 scale/zero)
  other quantized types -> Int8Linear   (lossy per-row int8 requantization)
  F32, F16              -> DenseLinear  fp32
  BF16                  -> DenseLinear  bf16

Environment switches, read when a layer is constructed (so tests and the CLI can flip them):
  TALLOW_INT4=0       int4 candidates become DenseLinear bf16 (dequantized weight in bf16)
  TALLOW_INT8=0       int8 candidates become DenseLinear bf16
  TALLOW_REFERENCE=1  every layer is a ReferenceLinear (fp32 dequantized weight, fp32 matmul),
                      as is mode="reference"
  TALLOW_INT4X2=1     opt-in: Q8_0/Q5_0/Q5_1/Q5_K become exact-code int4 over a doubled K
                      (kind "int4x2", as is mode="int4x2"): ~6x less weight error than int8
                      at equal decode speed, ~1.5x slower for multi-token prefill

All layers take and return float32; the quantized kernels run in bf16 internally (the only
vectorized dtype of these aten kernels on CPU), so their outputs carry up to 2^-8 relative rounding
from the activations and the output. When the private aten ops are missing from the torch
build, the layer falls back to DenseLinear bf16.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from ...errors import ModelFileError
from ...gguf_file import TensorInfo
from ...quant.pack import (HAS_INT4_OPS, HAS_INT8_OPS, INT4_TYPES, INT4X2_TYPES, INT8_TYPES, pack_int4,
                           pack_int8)
from ...quant.reference import SUPPORTED_TYPES, _as_uint8_tensor, dequantize

__all__ = [
    "Linear", "Int4Linear", "Int8Linear", "DenseLinear", "ReferenceLinear",
    "Embedding", "make_linear", "make_embedding", "MODES",
]

FLOAT_TYPES: frozenset[QT] = frozenset({QT.F32, QT.F16, QT.BF16})
MODES = ("auto", "reference", "int4", "int4x2", "int8", "dense")


def _bias_tensor(bias: np.ndarray | torch.Tensor | None, n: int, name: str) -> torch.Tensor | None:
    if bias is None:
        return None
    b = torch.as_tensor(np.array(bias, dtype=np.float32) if isinstance(bias, np.ndarray) else bias).float().reshape(-1)
    if b.numel() != n:
        raise ModelFileError(f"Bias for {name!r} has {b.numel()} elements but the weight has {n} output rows.")
    return b.contiguous()


def _check_2d(tensor: TensorInfo) -> None:
    if len(tensor.shape) != 2:
        raise ModelFileError(f"Tensor {tensor.name!r} has shape {tuple(tensor.shape)}; a linear weight must be 2-D.")
    if tensor.qtype not in SUPPORTED_TYPES:
        raise ModelFileError(f"Tensor {tensor.name!r} has type {QT(tensor.qtype).name}, which tallow does not support.")


class Linear:
    """y = x @ W^T (+ b). x float32 (..., in_features) -> float32 (..., out_features)."""

    kind: str = "abstract"

    def __init__(self, name: str, in_features: int, out_features: int, bias: torch.Tensor | None):
        self.name = name
        self.in_features = in_features
        self.out_features = out_features
        self.bias = bias  # float32 (N,) or None, added in fp32 after the matmul

    @property
    def nbytes(self) -> int:
        """Resident bytes held by this layer (weights, scales, bias)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def _tensors(self) -> list[torch.Tensor]:
        return [self.bias] if self.bias is not None else []

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 float32 (M, K) contiguous -> float32 (M, N), without bias."""
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        y = self._mm(x2)  # (M, N) float32
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.in_features}->{self.out_features}, kind={self.kind})"


class ReferenceLinear(Linear):
    """fp32 dequantized weight and fp32 F.linear: slow, but exactly the reference weights."""

    kind = "reference"

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None):
        super().__init__(tensor.name, tensor.n_cols, tensor.n_rows, bias)
        self.weight = dequantize(tensor.data, tensor.qtype, tensor.n_cols)  # (N, K) fp32

    def _tensors(self) -> list[torch.Tensor]:
        return [self.weight, *super()._tensors()]

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        return F.linear(x2.float(), self.weight)


class DenseLinear(Linear):
    """A float weight, kept as fp32 (F32/F16 sources) or bf16 (BF16 sources, and the fallback for
    quantized types when their fast kernel is switched off or missing)."""

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32):
        super().__init__(tensor.name, tensor.n_cols, tensor.n_rows, bias)
        if tensor.qtype == QT.BF16 and dtype == torch.bfloat16:
            raw = _as_uint8_tensor(tensor.data)
            w = raw.view(torch.bfloat16).reshape(tensor.n_rows, tensor.n_cols)  # exact, no fp32 detour
        else:
            w = torch.empty(tensor.n_rows, tensor.n_cols, dtype=dtype)
            step = max(1, (1 << 22) // max(tensor.n_cols, 1))
            for r0 in range(0, tensor.n_rows, step):  # chunked: never a full fp32 copy of a big table
                w[r0:r0 + step] = dequantize(tensor.data[r0:r0 + step], tensor.qtype, tensor.n_cols)
        self.weight = w.contiguous()  # (N, K)
        self.dtype = dtype
        self.kind = "dense_bf16" if dtype == torch.bfloat16 else "dense_f32"

    def _tensors(self) -> list[torch.Tensor]:
        return [self.weight, *super()._tensors()]

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        return F.linear(x2.to(self.dtype), self.weight).float()


class Int4Linear(Linear):
    """tinygemm int4 (group 32): exact codes, bf16 scale/zero, bf16 activations.

    Q4_0/Q4_1/Q4_K map directly (kind "int4"); Q8_0/Q5_0/Q5_1/Q5_K map as low and high code
    halves over a doubled K (kind "int4x2"), with the input duplicated to [x, x].
    """

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None):
        super().__init__(tensor.name, tensor.n_cols, tensor.n_rows, bias)
        p = pack_int4(tensor.data, tensor.qtype, tensor.n_cols)
        self.packed = p.packed                       # uint8 (N_pad, K*parts/2)
        self.scales_and_zeros = p.scales_and_zeros   # bf16 (K*parts/32, N_pad, 2)
        self.k_parts = p.k_parts
        self.kind = "int4" if p.k_parts == 1 else "int4x2"
        self._padded = p.packed.shape[0] != self.out_features

    def _tensors(self) -> list[torch.Tensor]:
        return [self.packed, self.scales_and_zeros, *super()._tensors()]

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        xb = x2.to(torch.bfloat16)
        xb = torch.cat([xb, xb], dim=1) if self.k_parts == 2 else xb.contiguous()  # (M, K*parts)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, 32, self.scales_and_zeros)  # (M, N_pad) bf16
        if self._padded:
            y = y[:, : self.out_features]
        return y.float()


class Int8Linear(Linear):
    """Per-output-channel int8 (lossy requantization of the GGUF blocks), bf16 activations."""

    kind = "int8"

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None):
        super().__init__(tensor.name, tensor.n_cols, tensor.n_rows, bias)
        self.weight, self.scales = pack_int8(tensor.data, tensor.qtype, tensor.n_cols)  # int8 (N, K), bf16 (N,)

    def _tensors(self) -> list[torch.Tensor]:
        return [self.weight, self.scales, *super()._tensors()]

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x2.to(torch.bfloat16).contiguous(), self.weight, self.scales).float()


def _env_off(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in ("0", "false", "no", "off")


def _env_on(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")


def make_linear(tensor: TensorInfo, bias: np.ndarray | torch.Tensor | None = None, mode: str | None = None) -> Linear:
    """Build the linear layer for a 2-D GGUF weight (ggml shape (K, N): rows of length K).

    mode: None/"auto" picks by type and the TALLOW_* switches; "reference" forces ReferenceLinear;
    "int4"/"int4x2"/"int8"/"dense" force a kind where the type allows it (else dense bf16).
    """
    _check_2d(tensor)
    b = _bias_tensor(bias, tensor.n_rows, tensor.name)
    mode = mode or "auto"
    if mode not in MODES:
        raise ValueError(f"unknown linear mode {mode!r}; expected one of {MODES}")
    qt = tensor.qtype
    if mode == "reference" or (mode == "auto" and _env_on("TALLOW_REFERENCE")):
        return ReferenceLinear(tensor, b)
    if qt in FLOAT_TYPES:
        return DenseLinear(tensor, b, torch.bfloat16 if qt == QT.BF16 else torch.float32)
    if mode == "dense":
        return DenseLinear(tensor, b, torch.bfloat16)
    if qt in INT4_TYPES and HAS_INT4_OPS and mode in ("auto", "int4", "int4x2") and (mode != "auto" or not _env_off("TALLOW_INT4")):
        return Int4Linear(tensor, b)
    if qt in INT4X2_TYPES and HAS_INT4_OPS and (mode == "int4x2" or (mode == "auto" and _env_on("TALLOW_INT4X2"))):
        return Int4Linear(tensor, b)
    if HAS_INT8_OPS and (mode == "int8" or (mode == "auto" and qt in INT8_TYPES and not _env_off("TALLOW_INT8"))):
        return Int8Linear(tensor, b)
    return DenseLinear(tensor, b, torch.bfloat16)


class Embedding:
    """Token embedding lookup straight from the GGUF bytes: only the requested rows are
    dequantized (with the reference, so embeddings are exact), the table is never copied."""

    kind = "embedding"

    def __init__(self, tensor: TensorInfo):
        _check_2d(tensor)
        self.name = tensor.name
        self.num_embeddings = tensor.n_rows
        self.embedding_dim = tensor.n_cols
        self._data = tensor.data  # uint8 (vocab, row_bytes), a view of the file map
        self._qtype = tensor.qtype

    @property
    def nbytes(self) -> int:
        """Resident bytes beyond the file map: none."""
        return 0

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """ids LongTensor (n,) -> float32 (n, embedding_dim)."""
        idx = ids.reshape(-1).cpu().numpy().astype(np.int64, copy=False)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_embeddings):
            bad = int(idx[(idx < 0) | (idx >= self.num_embeddings)][0])
            raise IndexError(f"token id {bad} is outside the vocabulary of {self.num_embeddings} ({self.name})")
        rows = self._data[idx]  # (n, row_bytes) copy of just these rows
        return dequantize(rows, self._qtype, self.embedding_dim).reshape(*ids.shape, self.embedding_dim)


def make_embedding(tensor: TensorInfo) -> Embedding:
    """Embedding over a GGUF token table (any supported type)."""
    return Embedding(tensor)
