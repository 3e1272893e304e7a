"""Quantized linear layers on an NVIDIA GPU: GGUF blocks kept as byte planes in GPU memory.

Decode (at most 8 rows) runs the dequant-fused Triton GEMV, which reads every weight byte
once. Prefill dequantizes the weight to bf16 in one scratch buffer shared by all layers and calls
cuBLAS (measured 3-5x faster than the fused tensor-core kernel on the H200, see
docs/performance.md). Types without a Triton kernel are dequantized once at load to fp16.

The decode products `mmvq_wins` picks (the wide matrices but the short ones of TALLOW_GEMV_SHORT_K,
and from session 11 the narrow ones above a size) take the integer-dot GEMV (kernels/triton/mmvq.py: x rounded to Q8_1 as llama.cpp's
CUDA build does, then int8 dot products; TALLOW_GEMV_MMVQ=0: the fp32 GEMV): other numbers than
the fp32 GEMV's, so these layers say kind "mmvq_*". x is quantized once per input (SharedQ8,
LazyInput.q8), with a pending norm or GLU applied inside the quantization. Its rows are bit for bit its one-row products (scripts/gpu_speculate.py on the
H200), so speculative verification stays exact.

Switches: TALLOW_TRITON_GEMV=0 sends decode through the prefill path too.
"""

from __future__ import annotations


import numpy as np
import torch

from ... import switches
from ...gguf_file import TensorInfo
from ...quant.reference import dequantize
from ..block_ops import LazyInput, TritonOps
from ..triton.dequant import dequantize_to
from ..triton.mmvq import MMVQ_TYPES, Q8Act, mmvq, mmvq_q8, quantize_q8_1
from ..triton.planes import QTYPES, PlaneWeight, pack_planes
from ..triton.quant_gemv import SUPPORTED as GEMV_TYPES
from ..triton.quant_gemv import quant_gemv

GEMV_MAX_ROWS = 8
NARROW_MIN_WEIGHTS = 1 << 21  # a narrow product (N < 4096 or N < K) takes the integer-dot GEMV from
# this many weights when N > K (Q+K), from 4x that otherwise (o, down): below, both kernels sit at the
# ~3 µs launch floor (o 1536x2048: 3.4 µs either way) and x's own Q8_1 launch would cost more than the
# integer dots save (scripts/gpu_gemv_table.py, session 11)
SHORT_K = 256  # a wide product over at most this many columns and under NARROW_MIN_WEIGHTS weights reads x
# as it is through the fp32 GEMV (TALLOW_GEMV_SHORT_K): both GEMVs sit at the launch floor there, and the
# integer-dot one needs x's Q8_1 launch first
PROLOGUE_MAX_N = 16384  # above this (vocabulary projections) every program re-reading x costs more than a launch


def _switch_on(name: str) -> bool:
    return switches.enabled(name)


def mmvq_wins(qtype: str, n: int, k: int) -> bool:
    """Where the integer-dot GEMV beats quant_gemv on the H200 with its x quantization counted
    (scripts/gpu_mmvq.py, scripts/gpu_gemv_table.py, docs/performance.md): the wide matrices
    (Q+K, gate+up, the output projection) since session 9; with TALLOW_MMVQ_NARROW (session 11)
    the narrow ones too (V, o, down from NARROW_MIN_WEIGHTS, and V beside an integer-dot Q+K:
    join_q8), at mmvq_config's deeper configs and with x quantized once per input (shared by a
    group's parts, the norm or GLU before it folded into the quantization)."""
    if qtype not in MMVQ_TYPES:
        return False
    if k <= SHORT_K and n * k < NARROW_MIN_WEIGHTS and _switch_on("TALLOW_GEMV_SHORT_K"):
        return False  # Mamba's dt projection (4096 x dt_rank 128): x's own Q8_1 launch is most of its cost
    narrow = (n > k and n * k >= NARROW_MIN_WEIGHTS) or n * k >= 4 * NARROW_MIN_WEIGHTS
    return (n >= 4096 and n >= k) or (narrow and _switch_on("TALLOW_MMVQ_NARROW"))


def join_q8(parts: list) -> None:
    """Parts of one input group (Q+K with V of another type): where one part takes the
    integer-dot GEMV, the others of an MMVQ type join it whatever their size, since they read the
    Q8_1 x it quantizes anyway (V 1024x2560 Q6_K: 4.8 -> 3.5 µs, no launch of its own)."""
    if not (_switch_on("TALLOW_MMVQ_NARROW") and _switch_on("TALLOW_Q8_PROLOGUE")):
        return
    if any(getattr(p, "use_mmvq", False) for p in parts):
        for p in parts:
            if getattr(p, "planes", None) is not None and p.planes.qtype in MMVQ_TYPES and not p.use_mmvq:
                p.kind, p.use_mmvq = f"mmvq_{p.planes.qtype.lower()}", True


def _decode_kind(planes: PlaneWeight) -> tuple[str, bool]:
    """(kind, whether decode takes the integer-dot GEMV) for a layer's planes."""
    if _switch_on("TALLOW_GEMV_MMVQ") and mmvq_wins(planes.qtype, planes.n, planes.k):
        return f"mmvq_{planes.qtype.lower()}", True
    return f"triton_{planes.qtype.lower()}", False


class Scratch:
    """One flat bf16 buffer per device for dequantized weights, sized at load for the largest
    weight, so prefill never allocates per layer. bf16, not fp16: activations of some models
    (qwen's first position) exceed fp16's range."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffer = torch.empty(0, dtype=torch.bfloat16, device=device)

    def reserve(self, numel: int) -> None:
        if numel > self.buffer.numel():
            self.buffer = torch.empty(numel, dtype=torch.bfloat16, device=self.device)

    def view(self, n: int, k: int) -> torch.Tensor:
        return self.buffer[: n * k].view(n, k)


class GPULinear:
    """y = x @ W^T (+ b) for x float32 (..., K) on the GPU -> float32 (..., N)."""

    def __init__(self, tensor: TensorInfo, bias: np.ndarray | torch.Tensor | None, device: torch.device, scratch: Scratch):
        self.name = tensor.name
        self.in_features = tensor.n_cols
        self.out_features = tensor.n_rows
        self.scratch = scratch
        self.planes: PlaneWeight | None = None
        self.dense: torch.Tensor | None = None
        raw = torch.from_numpy(np.array(tensor.data))  # a writable copy of the mapped bytes
        if int(tensor.qtype) in QTYPES and QTYPES[int(tensor.qtype)][0] in GEMV_TYPES:
            self.planes = pack_planes(raw.to(device), tensor.qtype, tensor.n_cols)
            self.kind, self.use_mmvq = _decode_kind(self.planes)
            scratch.reserve(self.out_features * self.in_features)
        else:
            # F32/F16/BF16 and the quant types without a kernel: dense.
            w = dequantize(tensor.data, tensor.qtype, tensor.n_cols)
            # F32/F16 stay exact in fp32; the rest in bf16 (fp16 could overflow the activations).
            self.dense = w.to(device, torch.float32 if int(tensor.qtype) in (0, 1) else torch.bfloat16)
            self.kind, self.use_mmvq = "dense", False
        self.bias = None
        if bias is not None:
            self.bias = torch.as_tensor(np.asarray(bias, dtype=np.float32)).to(device)
        self.use_gemv = _switch_on("TALLOW_TRITON_GEMV")

    @classmethod
    def stacked(cls, parts: list["GPULinear"]) -> "GPULinear":
        """One layer whose weight is `parts` stacked along N (same quant type and K): Q/K/V or
        gate/up in one GEMV launch. Rows are independent, so each output equals its part's."""
        first = parts[0]
        layer = cls.__new__(cls)
        layer.name = "+".join(p.name for p in parts)
        layer.in_features = first.in_features
        layer.out_features = sum(p.out_features for p in parts)
        layer.scratch = first.scratch
        layer.dense = None
        layer.planes = PlaneWeight(first.planes.qtype, layer.out_features, first.planes.k,
                                   {f: torch.cat([p.planes.planes[f] for p in parts]) for f in first.planes.planes})
        layer.kind, layer.use_mmvq = _decode_kind(layer.planes)
        layer.use_gemv = first.use_gemv
        layer.bias = None
        if any(p.bias is not None for p in parts):
            layer.bias = torch.cat([p.bias if p.bias is not None else torch.zeros(p.out_features, device=first.planes.device)
                                    for p in parts])
        layer.scratch.reserve(layer.out_features * layer.in_features)
        return layer

    def can_stack(self, other) -> bool:
        return (isinstance(other, GPULinear) and self.planes is not None and other.planes is not None
                and self.planes.qtype == other.planes.qtype and self.in_features == other.in_features)

    @property
    def nbytes(self) -> int:
        total = self.planes.nbytes if self.planes is not None else self.dense.numel() * self.dense.element_size()
        return total + (self.bias.numel() * 4 if self.bias is not None else 0)

    def decode_q8(self, x) -> bool:
        """Whether this call takes the integer-dot GEMV (x: a tensor, LazyInput or SharedQ8)."""
        return self.dense is None and self.use_gemv and self.use_mmvq and x.shape[0] <= GEMV_MAX_ROWS

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None, add_bias: bool = True,
                 addend: torch.Tensor | None = None) -> torch.Tensor:
        """`out` (n, N) float32 with a unit last stride, e.g. this layer's columns of a group's
        output (dispatch.LinearGroup): written in place, so the group needs no concatenation.
        add_bias=False: x @ W^T alone, the bias left to the consumer (Mamba-1's scan adds dt's).
        `addend` (n, N): returns addend + x @ W^T (falcon-h1's attention branch joining the mixer).
        The decode GEMVs add the bias or the addend as they store y (TALLOW_GEMV_ADD_EPILOGUE)."""
        bias = self.bias if add_bias else None
        fold = _switch_on("TALLOW_GEMV_ADD_EPILOGUE") and (bias is None or addend is None)
        add = (addend if addend is not None else bias) if fold else None
        if isinstance(x, (LazyInput, SharedQ8)) and self.decode_q8(x) and _switch_on("TALLOW_Q8_PROLOGUE"):
            return self._rest(mmvq_q8(q8_of(x), self.planes, out=out, add=add), fold, bias, addend)
        if isinstance(x, SharedQ8):
            x = x.x
        if isinstance(x, LazyInput):
            # A norm or GLU the GEMV can fold into its x loads (not worth it over a vocabulary).
            if (self.dense is None and self.use_gemv and not self.use_mmvq and x.shape[0] <= GEMV_MAX_ROWS
                    and self.out_features <= PROLOGUE_MAX_N and self.in_features <= TritonOps.LAZY_MAX_K):
                return self._rest(quant_gemv(x.x, self.planes, out=out, prologue=x.take(), add=add), fold, bias, addend)
            x = x.materialize()
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.dense is None and x2.shape[0] <= GEMV_MAX_ROWS and self.use_gemv:
            y = (mmvq if self.use_mmvq else quant_gemv)(x2, self.planes, out=out, add=add)
            return self._rest(y, fold, bias, addend).reshape(*lead, self.out_features)
        if self.dense is not None:
            y = torch.matmul(x2.to(self.dense.dtype), self.dense.T)
        else:
            w = dequantize_to(self.planes, torch.bfloat16, out=self.scratch.view(self.out_features, self.in_features))
            y = torch.matmul(x2.bfloat16(), w.T)
        y = y.float() if out is None else out.copy_(y)
        return self._rest(y, False, bias, addend).reshape(*lead, self.out_features)

    @staticmethod
    def _rest(y: torch.Tensor, folded: bool, bias, addend) -> torch.Tensor:
        """What the GEMV's epilogue did not add: the bias into y (y is this call's own tensor, or
        `out`), then the addend in front, as `addend + (x @ W^T + b)` reads."""
        if folded:
            return y
        if bias is not None:
            y.add_(bias)
        return y if addend is None else addend + y


class SharedQ8:
    """A decode input several integer-dot GEMVs read (a group's parts): quantized to Q8_1 once,
    by the first of them."""

    def __init__(self, x: torch.Tensor, q8: Q8Act | None = None):
        self.x = x
        self.q8 = q8  # given where the producer wrote x's blocks itself (Mamba-1's scan)
        self.shape = x.shape
        self.device = x.device


def q8_of(x) -> Q8Act:
    """x's Q8_1 blocks, computed at the first ask: a LazyInput's norm or GLU folded into the
    quantization (its residual sum written then, by the prologue's one taker)."""
    if x.q8 is None:
        if isinstance(x, LazyInput):
            x.q8 = quantize_q8_1(x.x, prologue=x.take())
        else:
            x.q8 = quantize_q8_1(x.x)
    return x.q8


def _takes_q8(consumer, x: torch.Tensor) -> bool:
    """Whether a linear (or LinearGroup) reads decode input x as Q8_1 blocks (some part on the integer-dot GEMV)."""
    parts = getattr(consumer, "parts", [consumer])
    return _switch_on("TALLOW_Q8_PROLOGUE") and any(isinstance(p, GPULinear) and p.decode_q8(x) for p in parts)


def norm_add_norm_q8(ops, x, branch, weight, next_weight, eps, scale, consumer):
    """ops.norm_add_norm(x, branch, weight, next_weight, eps, scale) -> (stream, h), where h is the
    input of `consumer` alone: when that consumer reads h on the integer-dot GEMV, the norm's launch
    also writes h's Q8_1 blocks (mmvq.rmsnorm_add_q8, the bytes quantize_q8_1(h) writes) and h comes
    back as a SharedQ8 holding them, so the quantization's own launch is gone (TALLOW_NORM_ADD_Q8;
    Gemma 4's two norm pairs a block)."""
    if (isinstance(ops, TritonOps) and _switch_on("TALLOW_NORM_ADD_Q8") and weight.dim() == 1 and next_weight.dim() == 1
            and ops._rows(x) and ops._rows(branch) and x.shape[0] <= GEMV_MAX_ROWS and _takes_q8(consumer, branch)):
        from ..triton.mmvq import rmsnorm_add_q8

        r = rmsnorm_add_q8(branch, weight, eps, x, next_weight, scale)
        if r is not None:
            return r[0], SharedQ8(r[1], q8=r[2])
    return ops.norm_add_norm(x, branch, weight, next_weight, eps, scale)


class GPUEmbedding:
    """Token embedding from GGUF blocks on the GPU: the ids' rows are gathered from the byte
    planes and dequantized there, so a CUDA graph can look up a token the GPU just sampled."""

    def __init__(self, tensor: TensorInfo, device: torch.device):
        self.num_embeddings = tensor.n_rows
        self.embedding_dim = tensor.n_cols
        raw = torch.from_numpy(np.array(tensor.data)).to(device)  # a writable copy of the mapped bytes
        self.planes: PlaneWeight | None = None
        self.dense: torch.Tensor | None = None
        if int(tensor.qtype) in QTYPES:
            self.planes = pack_planes(raw, tensor.qtype, tensor.n_cols)
        else:
            self.dense = dequantize(tensor.data, tensor.qtype, tensor.n_cols).to(device)

    @property
    def nbytes(self) -> int:
        if self.planes is not None:
            return self.planes.nbytes
        return self.dense.numel() * self.dense.element_size()

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(self.planes.device if self.planes is not None else self.dense.device)
        if self.dense is not None:
            return self.dense[ids]
        rows = PlaneWeight(self.planes.qtype, ids.numel(), self.planes.k, {k: v[ids] for k, v in self.planes.planes.items()})
        # The Triton dequantization (fp32 out): no host tensors, so a CUDA graph can capture it.
        return dequantize_to(rows, torch.float32)  # (n, dim)
