"""llama.cpp's quantized products over the GGUF file's own bytes, through a small C library.

`ggml_dot.c` (built at install as tallow/kernels/cpu/_ggml_dot*.so, optional: without a compiler
the torch paths run) quantizes the activations to Q8_0/Q8_1/Q8_K exactly as ggml's x86 from_float
and takes the integer block dot products of Q4_1, Q5_0, Q8_0, Q6_K and Q4_K rows, combining the
block sums in the float order llama.cpp b11434 runs on x86 (vec_dot's eight lanes; the repacked
gemv for Q4_K): the same bits as libggml-cpu (scripts/cpudot_vs_ggml.py). It reads the weight
where it lies in the file map: the kernel itself costs the file's bytes and nothing else.

GgmlDotLinear (kind "ggml_dot") runs products of up to MAX_ROWS rows (decode) in C. Products of
more rows go to `fallback`: the layer make_linear would have built (prefill keeps its bf16 GEMM;
its weights are held beside the file's bytes), or under TALLOW_NUMERICS=ggml (no fallback) the C
kernel row by row: the file's bytes only, ggml's arithmetic per row.

Switch (read at load): TALLOW_CPU_GGML_DOT=1 on, =0 off; unset, on under TALLOW_NUMERICS=ggml only
(in the default mode it is opt-in: it adds the file's bytes to the torch layer it wraps, and its
decode speed against that layer is in docs/performance.md).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import threading
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from ...gguf_file import TensorInfo
from ...quant.reference import _as_uint8_tensor
from .linear import Linear

__all__ = ["TYPES", "wanted", "available", "usable", "unavailable_reason", "simd", "set_simd", "status", "quantize", "gemv_quantized",
           "linear", "GgmlDotLinear"]

TYPES: frozenset[QT] = frozenset({QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q6_K, QT.Q4_K})
_ACT = {QT.Q4_1: QT.Q8_1, QT.Q5_0: QT.Q8_0, QT.Q8_0: QT.Q8_0, QT.Q6_K: QT.Q8_K, QT.Q4_K: QT.Q8_K}
_ACT_BLOCK = {QT.Q8_0: (32, 34), QT.Q8_1: (32, 36), QT.Q8_K: (256, 292)}
_ABI = 1

_lib: ctypes.CDLL | None = None
_reason = "not loaded yet"


def _load() -> ctypes.CDLL | None:
    global _lib, _reason
    if _lib is not None or _reason != "not loaded yet":
        return _lib
    here = Path(__file__).resolve().parent
    found = [here / f"_ggml_dot{s}" for s in importlib.machinery.EXTENSION_SUFFIXES if (here / f"_ggml_dot{s}").exists()]
    if not found:
        _reason = "the C kernel was not built at install (no compiler?); the torch paths run"
        return None
    try:
        lib = ctypes.CDLL(str(found[0]))
        if lib.tg_abi_version() != _ABI:
            _reason = f"{found[0].name} is from another version of tallow (ABI {lib.tg_abi_version()}, expected {_ABI}); reinstall"
            return None
    except OSError as e:
        _reason = f"{found[0].name} could not be loaded ({e})"
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.tg_quantize.argtypes = [i32, p, p, i64, i64]
    lib.tg_gemv_q.argtypes = [i32, p, i64, i64, i64, p, i64, p, i32]
    lib.tg_linear.argtypes = [i32, p, i64, i64, i64, p, i64, p, p, i32]
    lib.tg_act_row_bytes.restype = i64
    lib.tg_act_row_bytes.argtypes = [i32, i64]
    for f in (lib.tg_quantize, lib.tg_gemv_q, lib.tg_linear):
        f.restype = i32
    _lib, _reason = lib, ""
    return lib


def wanted() -> bool:
    """TALLOW_CPU_GGML_DOT: =1 on, =0 off, unset: on under TALLOW_NUMERICS=ggml only."""
    from ... import switches
    from ...numerics import ggml_enabled

    forced = switches.value("TALLOW_CPU_GGML_DOT")
    return forced if forced is not None else ggml_enabled()


def available() -> bool:
    return _load() is not None


def usable() -> bool:
    """Whether make_linear should use the C kernel: built, and with its AVX-512 VNNI code (the
    portable code gives the same numbers but is slower than the torch paths)."""
    return available() and simd()


def unavailable_reason() -> str:
    _load()
    return _reason


def simd() -> bool:
    """Whether the AVX-512 VNNI code runs (else the portable C, same results, several times slower)."""
    lib = _load()
    return bool(lib and lib.tg_simd())


def set_simd(on: bool) -> bool:
    """Force the portable code (False) or the best this CPU runs (True); for tests and checks."""
    lib = _load()
    return bool(lib and lib.tg_set_simd(int(on)))


def status() -> str:
    """One line for `tallow info` and the load log."""
    if not available():
        return f"off: {unavailable_reason()}"
    return "built, " + ("AVX-512 VNNI" if simd() else "portable C (no AVX-512 VNNI on this CPU)")


def _act_row_bytes(qtype: QT, k: int) -> int:
    block, size = _ACT_BLOCK[_ACT[qtype]]
    return k // block * size


def quantize(x: np.ndarray | torch.Tensor, weight_type: QT) -> np.ndarray:
    """x (M, K) float32 -> (M, bytes) uint8: the activation blocks ggml pairs with `weight_type`."""
    lib = _load()
    xs = np.ascontiguousarray(x.numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float32)
    m, k = xs.shape
    out = np.empty((m, _act_row_bytes(weight_type, k)), np.uint8)
    if lib.tg_quantize(int(_ACT[weight_type]), xs.ctypes.data, out.ctypes.data, m, k):
        raise ValueError(f"a row of {k} values is not a whole number of {_ACT[weight_type].name} blocks")
    return out


def _threads() -> int:
    return max(1, torch.get_num_threads())


def gemv_quantized(raw: np.ndarray | torch.Tensor, qtype: QT, k: int, xq: np.ndarray) -> np.ndarray:
    """raw (N, row bytes) uint8 weight rows, xq (M, bytes) from `quantize` -> (M, N) float32."""
    lib = _load()
    w = _as_uint8_tensor(raw)
    xq = np.ascontiguousarray(xq)
    y = np.empty((xq.shape[0], w.shape[0]), np.float32)
    if lib.tg_gemv_q(int(qtype), w.data_ptr(), w.stride(0), w.shape[0], k, xq.ctypes.data, xq.shape[0], y.ctypes.data,
                     _threads()):
        raise ValueError(f"the C kernel does not take {QT(qtype).name} rows of {k} values")
    return y


_local = threading.local()  # the quantized activations' buffer, one per calling thread


def linear(w: torch.Tensor, qtype: QT, x: torch.Tensor) -> torch.Tensor:
    """x (M, K) float32 contiguous, w (N, row bytes) uint8 -> x @ W^T (M, N) float32, in one C call."""
    m, k = x.shape
    need = m * _act_row_bytes(qtype, k)
    scratch = getattr(_local, "scratch", None)
    if scratch is None or scratch.numel() < need:
        with torch.inference_mode(False):
            scratch = _local.scratch = torch.empty(need, dtype=torch.uint8)
    y = torch.empty(m, w.shape[0], dtype=torch.float32)
    (_lib or _load()).tg_linear(int(qtype), w.data_ptr(), w.stride(0), w.shape[0], k, x.data_ptr(), m, scratch.data_ptr(),
                                y.data_ptr(), _threads())
    return y


class GgmlDotLinear(Linear):
    """One-row products in the C kernel over the file's bytes; more rows through `fallback` (a Linear
    over the same tensor) or, with fallback None, through the C kernel row by row."""

    kind = "ggml_dot"
    MAX_ROWS = 4  # llama.cpp's gemv also serves up to 3 rows; beyond, prefill GEMMs win

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None, fallback: Linear | None = None):
        super().__init__(tensor.name, tensor.n_cols, tensor.n_rows, bias)
        if tensor.qtype not in TYPES or not available():
            raise ValueError(f"{tensor.name}: the C kernel does not take {QT(tensor.qtype).name}")
        self.qtype = QT(tensor.qtype)
        self.weight = _as_uint8_tensor(tensor.data)  # (N, row bytes): a view of the file map, no copy
        self.fallback = [fallback] if fallback is not None else []  # a list: memory/weight_cache.py restores lists

    def _tensors(self) -> list[torch.Tensor]:
        extra = self.fallback[0]._tensors() if self.fallback else []
        return [self.weight, *extra, *super()._tensors()]

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        if self.fallback and (x2.shape[0] > self.MAX_ROWS or _lib is None and not available()):
            return self.fallback[0]._mm(x2)  # prefill, or a cached layer restored where the library is missing
        return linear(self.weight, QT(self.qtype), x2.float().contiguous())

    def _mm_native(self, xc: torch.Tensor) -> torch.Tensor:
        return self._mm(xc)
