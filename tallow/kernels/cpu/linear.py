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
  TALLOW_NUMERICS=ggml  every layer is a GgmlLinear (ggml_linear.py): llama.cpp's activation
                      rounding and block arithmetic over fp32 weights (before all the above);
                      GgmlDotLinear (ggml_dot.py, the C kernel over the file's bytes) where it
                      takes the type
  TALLOW_CPU_GGML_DOT Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K decode products in the C kernel (GgmlDotLinear
                      wrapping the layer above, which keeps prefill; the output projection in C
                      alone, it runs one row; not a routed expert's); on where built, =0 never
  TALLOW_CPU_GEMM     with TALLOW_CPU_GGML_DOT, K-quant prefill (9+ rows) in C as well (ggml_gemm.c:
                      llama.cpp's tiled prompt arithmetic), with no torch layer behind it; =0 keeps it
  TALLOW_INT4X2=1     opt-in: Q8_0/Q5_0/Q5_1/Q5_K become exact-code int4 over a doubled K
                      (kind "int4x2", as is mode="int4x2"): ~6x less weight error than int8
                      at equal decode speed, ~1.5x slower for multi-token prefill

All layers take and return float32; the quantized kernels run in bf16 internally (the only
vectorized dtype of these aten kernels on CPU), so their outputs carry up to 2^-8 relative rounding
from the activations and the output. When the private aten ops are missing from the torch
build, the layer falls back to DenseLinear bf16.
"""

from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from ... import switches
from ...errors import ModelFileError
from ...families.tensors import EXPERT, OUTPUT
from ...gguf_file import TensorInfo
from ...quant.pack import (_N_ALIGN, _PACK_ROWS, GROUP_SIZE, HAS_INT4_OPS, HAS_INT8_OPS, INT4_TYPES, INT4X2_TYPES,
                           INT8_TYPES, Int4Pack, _row_chunks, pack_int4, pack_int8)
from ...numerics_mode import ggml_enabled
from ...quant.reference import SUPPORTED_TYPES, _as_uint8_tensor, dequantize
from . import dequant_matmul

__all__ = [
    "Linear", "Int4Linear", "Int8Linear", "GroupInt8Linear", "DenseLinear", "ReferenceLinear",
    "Embedding", "make_linear", "make_embedding", "MODES",
]

FLOAT_TYPES: frozenset[QT] = frozenset({QT.F32, QT.F16, QT.BF16})
MODES = ("auto", "reference", "int4", "int4x2", "int8", "int8g", "dense")


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

    # The activation dtype the kernel consumes (bf16 for the quantized kernels) and produces.
    compute_dtype: torch.dtype = torch.float32

    def _mm_native(self, xc: torch.Tensor) -> torch.Tensor:
        """xc (M, K) contiguous in `compute_dtype` -> (M, N) in the kernel's output dtype, no bias."""
        raise NotImplementedError

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 float32 (M, K) contiguous -> float32 (M, N), without bias."""
        return self._mm_native(x2.to(self.compute_dtype).contiguous()).float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # the hot path: (M, K) in, (M, N) out, no reshapes
            y = self._mm(x)
            return y + self.bias if self.bias is not None else y
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

    def _mm_native(self, xc: torch.Tensor) -> torch.Tensor:
        return F.linear(xc, self.weight)

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
            step, rows = max(1, (1 << 22) // max(tensor.n_cols, 1)), tensor.streamed()
            for r0 in range(0, tensor.n_rows, step):  # chunked: never a full fp32 copy of a big table
                w[r0:r0 + step] = dequantize(rows[r0:r0 + step], tensor.qtype, tensor.n_cols)
        self.weight = w.contiguous()  # (N, K)
        self.dtype = dtype
        self.compute_dtype = dtype
        self.kind = "dense_bf16" if dtype == torch.bfloat16 else "dense_f32"

    def _tensors(self) -> list[torch.Tensor]:
        return [self.weight, *super()._tensors()]

    def _mm_native(self, xc: torch.Tensor) -> torch.Tensor:
        if self.dtype == torch.bfloat16:
            return dequant_matmul.bf16_linear(xc, self.weight)
        return F.linear(xc, self.weight)


class Int4Linear(Linear):
    """tinygemm int4 (group 32): exact codes, bf16 scale/zero, bf16 activations.

    Q4_0/Q4_1/Q4_K map directly (kind "int4"); Q8_0/Q5_0/Q5_1/Q5_K map as low and high code
    halves over a doubled K (kind "int4x2"), with the input duplicated to [x, x].
    """

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None):
        super().__init__(tensor.name, tensor.n_cols, tensor.n_rows, bias)
        p = pack_int4(tensor.streamed(), tensor.qtype, tensor.n_cols)
        self.packed = p.packed                       # uint8 (N_pad, K*parts/2)
        self.scales_and_zeros = p.scales_and_zeros   # bf16 (K*parts/32, N_pad, 2)
        self.k_parts = p.k_parts
        self.kind = "int4" if p.k_parts == 1 else "int4x2"
        self._padded = p.packed.shape[0] != self.out_features

    def _tensors(self) -> list[torch.Tensor]:
        return [self.packed, self.scales_and_zeros, *super()._tensors()]

    compute_dtype = torch.bfloat16

    def _mm_native(self, xc: torch.Tensor) -> torch.Tensor:
        if (xc.shape[0] >= dequant_matmul.MIN_ROWS and self.packed.shape[0] % dequant_matmul.PACK_BLOCK == 0
                and dequant_matmul.enabled()):  # prefill: dense bf16 GEMM on a dequantized tile
            return dequant_matmul.int4_dequant_mm(xc, self.packed, self.scales_and_zeros, self.out_features,
                                                  self.k_parts)
        xb = torch.cat([xc, xc], dim=1) if self.k_parts == 2 else xc  # (M, K*parts)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.packed, 32, self.scales_and_zeros)  # (M, N_pad) bf16
        return y[:, : self.out_features] if self._padded else y


def group_int8_codes(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Requantize a float32 weight (n, K) to int8 with one bf16 scale per 32 K-elements, in
    tinygemm's int4x2 form: codes uint8 (n, 2K) (low nibbles, then high nibbles + 8), and
    float32 scale/zero (n, 2K/32), such that `(q - 8) * scale + zero` summed over the two
    halves is s * round(w / s) with s = bf16(amax_group / 127). The scale is rounded to bf16
    before the codes are fitted, and 8s and 16s are exact in bf16, so the kernel adds no
    rounding of its own: the only error is the int8 rounding, at most s/2 per element.
    """
    n, k = w.shape
    groups = k // GROUP_SIZE
    wg = w.reshape(n, groups, GROUP_SIZE)
    scale = (wg.abs().amax(dim=2) / 127).to(torch.bfloat16).float()  # (n, groups)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(wg / safe[..., None]).clamp_(-127, 127).to(torch.int8).reshape(n, k)
    return _int8_planes(q, scale)


def _int8_planes(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int8 codes q (n, K) with a scale per 32 (n, K/32) in the int4x2 form of group_int8_codes."""
    lo, hi = q & 15, q >> 4  # 0..15, -8..7: q = 16 hi + lo
    codes = torch.cat([lo, hi + 8], dim=1).to(torch.uint8)
    scales = torch.cat([scale, 16 * scale], dim=1)
    zeros = torch.cat([8 * scale, torch.zeros_like(scale)], dim=1)
    return codes, scales, zeros


def pack_group_int8(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int) -> Int4Pack:
    """Any supported type (uint8 (N, row_bytes), or FileRows) -> group-32 int8 packed for the int4 kernel over
    a doubled K (see group_int8_codes); rows padded to a multiple of 16 like pack_int4."""
    if n_cols % GROUP_SIZE:
        raise ModelFileError(f"a row of {n_cols} elements is not a whole number of {GROUP_SIZE}-element groups")
    n = int(raw.shape[0])
    n_pad = -(-n // _N_ALIGN) * _N_ALIGN
    kk = 2 * n_cols
    packed = torch.empty(n_pad, kk // 2, dtype=torch.uint8)
    sz = torch.zeros(kk // GROUP_SIZE, n_pad, 2, dtype=torch.bfloat16)
    for r0, r1 in _row_chunks(n, kk, align=_PACK_ROWS):
        if qtype == QT.MXFP4:  # its own codes and power-of-two scales: exact, no requantization
            from ...quant.fp4 import mxfp4_group_codes

            q, scale, zero = _int8_planes(*mxfp4_group_codes(_as_uint8_tensor(raw[r0:r1]), n_cols))
        else:
            q, scale, zero = group_int8_codes(dequantize(raw[r0:r1], qtype, n_cols))
        r1p = min(r1 + (n_pad - n if r1 == n else 0), n_pad)
        q32 = torch.full((r1p - r0, kk), 8, dtype=torch.int32)
        q32[: r1 - r0] = q
        packed[r0:r1p] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q32, 1)
        sz[:, r0:r1, 0] = scale.T.to(torch.bfloat16)
        sz[:, r0:r1, 1] = zero.T.to(torch.bfloat16)
    return Int4Pack(packed, sz, n, n_cols, 2)


class GroupInt8Linear(Int4Linear):
    """int8 codes with a bf16 scale per 32 K-elements (kind "int8g"), run by the int4 kernel as
    two 4-bit planes over a doubled K (like int4x2). For types with no exact int4 form (Q6_K,
    Q3_K, Q2_K): ~1 byte/weight like per-row int8, but the scale follows each group rather than
    the whole row, so the requantization error is several times smaller, and for tall
    matrices (the output projection) the int4 kernel streams faster than _weight_int8pack_mm
    (measured in docs/performance.md). Slower than int8 for multi-token prefill, so make_linear
    uses it where that does not matter: mode="int8g" (the model asks for it on the output
    matrix, whose prefill product is one row)."""

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None):
        Linear.__init__(self, tensor.name, tensor.n_cols, tensor.n_rows, bias)
        p = pack_group_int8(tensor.streamed(), tensor.qtype, tensor.n_cols)
        self.packed = p.packed
        self.scales_and_zeros = p.scales_and_zeros
        self.k_parts = 2
        self.kind = "int8g"
        self._padded = p.packed.shape[0] != self.out_features


class Int8Linear(Linear):
    """Per-output-channel int8 (lossy requantization of the GGUF blocks), bf16 activations."""

    kind = "int8"

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None):
        super().__init__(tensor.name, tensor.n_cols, tensor.n_rows, bias)
        self.weight, self.scales = pack_int8(tensor.streamed(), tensor.qtype, tensor.n_cols)  # int8 (N, K), bf16 (N,)

    def _tensors(self) -> list[torch.Tensor]:
        return [self.weight, self.scales, *super()._tensors()]

    compute_dtype = torch.bfloat16

    def _mm_native(self, xc: torch.Tensor) -> torch.Tensor:
        if xc.shape[0] >= dequant_matmul.MIN_ROWS and dequant_matmul.enabled():
            return dequant_matmul.int8_dequant_mm(xc, self.weight, self.scales)
        return torch.ops.aten._weight_int8pack_mm(xc, self.weight, self.scales)


def _env_off(var: str) -> bool:
    return switches.value(var) is False


def _env_on(var: str) -> bool:
    return switches.value(var) is True




def _output_int8g(n_cols: int) -> bool:
    """Whether the output projection takes the group-32 forms (mode "int8g": exact int4x2 for
    Q8_0/Q5_x, group int8 for Q6_K and the like) instead of per-row int8. They carry 2-10x less
    weight error; for K >= 1024 they are faster too (qwen2.5's 151936x1536 Q6_K: 6.6 vs 7.5 ms
    per token), at K <= 640 per-row int8 is faster (smollm2 0.58 vs 0.85 ms, gemma3 4.9 vs 5.1),
    so it stays there. TALLOW_OUTPUT_INT8G=0 keeps per-row int8; =1 takes group-32 at any K."""
    forced = switches.value("TALLOW_OUTPUT_INT8G")  # None: by width
    return forced if forced is not None else n_cols >= 1024


def make_linear(tensor: TensorInfo, bias: np.ndarray | torch.Tensor | None = None, mode: str | None = None,
                role: str | None = None) -> Linear:
    """The layer of `_make_linear` (below); where the C kernel (ggml_dot.py) takes the type and
    TALLOW_CPU_GGML_DOT is on, wrapped so that one-row products (decode) run in C over the file's
    bytes with llama.cpp's arithmetic. Under TALLOW_NUMERICS=ggml, and for the output projection
    (role OUTPUT: one row per step, prefill projects only the last token), the C kernel serves
    every row count alone: no torch copy of the weight."""
    from . import ggml_dot

    # Not a routed expert's: a chunk groups an expert's rows (any number up to the chunk), and only
    # the torch kernels give a row the same bits at every count below 64 (engine/prefill_plan.py).
    use_c = (mode in (None, "auto") and tensor.qtype in ggml_dot.TYPES and len(tensor.shape) == 2 and role != EXPERT
             and ggml_dot.wanted() and ggml_dot.usable())
    # TALLOW_CPU_GEMM: prefill of the K-quants (ggml_dot.PREFILL_TYPES) in C too, in llama.cpp's prompt
    # arithmetic (ggml_gemm.c); no torch copy of those weights is made.
    if use_c and (ggml_enabled() or role == OUTPUT or ggml_dot.prefills(QT(tensor.qtype))):
        return ggml_dot.GgmlDotLinear(tensor, _bias_tensor(bias, tensor.n_rows, tensor.name))
    layer = _make_linear(tensor, bias, mode, role)
    if use_c and not isinstance(layer, ReferenceLinear):
        return ggml_dot.GgmlDotLinear(tensor, layer.bias, fallback=layer)
    return layer


def _make_linear(tensor: TensorInfo, bias: np.ndarray | torch.Tensor | None = None, mode: str | None = None,
                 role: str | None = None) -> Linear:
    """Build the linear layer for a 2-D GGUF weight (ggml shape (K, N): rows of length K).

    mode: None/"auto" picks by type and the TALLOW_* switches; "reference" forces ReferenceLinear;
    "int4"/"int4x2"/"int8"/"dense" force a kind where the type allows it (else dense bf16);
    "int8g" is "auto" with group-32 forms (int4x2, else GroupInt8Linear) instead of per-row int8;
    "auto" uses it for the output projection (role OUTPUT, families/tensors.py: the output
    weight or the tied embedding table) where that is faster (_output_int8g); it runs one row
    per step, as prefill projects only the last token.
    """
    _check_2d(tensor)
    b = _bias_tensor(bias, tensor.n_rows, tensor.name)
    mode = mode or "auto"
    if mode not in MODES:
        raise ValueError(f"unknown linear mode {mode!r}; expected one of {MODES}")
    if mode == "auto" and ggml_enabled():  # TALLOW_NUMERICS=ggml: llama.cpp's arithmetic, fp32 weights
        from .ggml_linear import GgmlLinear

        return GgmlLinear(tensor, b)
    qt = tensor.qtype
    if mode == "auto" and role == OUTPUT and _output_int8g(tensor.n_cols):
        mode = "int8g"
    if mode == "int8g":
        # "auto", except that the types auto sends to per-row int8 get a group-32 form instead:
        # exact int4x2 where the codes allow it (Q8_0, Q5_x), group int8 otherwise (Q6_K, Q3_K, ...).
        if (qt in INT8_TYPES and HAS_INT4_OPS and not _env_on("TALLOW_REFERENCE") and not _env_off("TALLOW_INT8")
                and tensor.n_cols % GROUP_SIZE == 0):
            return Int4Linear(tensor, b) if qt in INT4X2_TYPES else GroupInt8Linear(tensor, b)
        mode = "auto"
    if mode == "reference" or (mode == "auto" and _env_on("TALLOW_REFERENCE")):
        return ReferenceLinear(tensor, b)
    if (qt == QT.MXFP4 and HAS_INT4_OPS and mode in ("auto", "int8g") and switches.enabled("TALLOW_MXFP4_INT8G")
            and tensor.n_cols % GROUP_SIZE == 0):
        return GroupInt8Linear(tensor, b)  # exact: MXFP4's codes and scales are group-32 int8 (quant/fp4.py)
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
        self._tensor = tensor  # its rows are read from the file per lookup (TensorInfo.read_rows)
        self._qtype = tensor.qtype

    @property
    def nbytes(self) -> int:
        """Resident bytes: none (rows are read from the file per lookup)."""
        return 0

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """ids LongTensor (n,) -> float32 (n, embedding_dim)."""
        idx = ids.reshape(-1).cpu().numpy().astype(np.int64, copy=False)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_embeddings):
            bad = int(idx[(idx < 0) | (idx >= self.num_embeddings)][0])
            raise IndexError(f"token id {bad} is outside the vocabulary of {self.num_embeddings} ({self.name})")
        rows = self._tensor.read_rows(idx)  # (n, row_bytes) copy of just these rows
        return dequantize(rows, self._qtype, self.embedding_dim).reshape(*ids.shape, self.embedding_dim)


def make_embedding(tensor: TensorInfo) -> Embedding:
    """Embedding over a GGUF token table (any supported type)."""
    return Embedding(tensor)
