"""llama.cpp's quantized products over the GGUF file's own bytes, through a small C library.

`ggml_dot.c` (built at install as tallow/kernels/cpu/_ggml_dot*.so, optional: without a compiler
the torch paths run) quantizes the activations to Q8_0/Q8_1/Q8_K exactly as ggml's x86 from_float
and takes the integer block dot products of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K rows, combining the
block sums in the float order of llama.cpp b11434's x86 vec_dot_* with weight repacking off (the
fixtures' configuration; with repacking on, Q4_K would take the repacked gemv's other order), and for
products of 8+ rows Q4_K/Q5_K/Q6_K in the order of llama.cpp's tiled K-quant product, as ggml_mul_mat does
for prompts: the same bits as libggml-cpu (scripts/cpudot_vs_ggml.py). It reads the weight
where it lies in the file map: the kernel itself costs the file's bytes and nothing else.

GgmlDotLinear (kind "ggml_dot") runs products of up to MAX_ROWS rows (decode) in C. Products of
more rows go to `fallback`: the layer make_linear would have built (prefill keeps its bf16 GEMM;
its weights are held beside the file's bytes), or where there is none (Q4_K/Q6_K under
TALLOW_CPU_GEMM, TALLOW_NUMERICS=ggml, and the output projection) to C as well: ggml_gemm.c's
register-tiled prefill product, llama.cpp's prompt arithmetic over the file's bytes only.
GgmlDotGroup runs several of them over one input (Q/K/V, gate/up) in one call.

Switch (read at load): TALLOW_CPU_GGML_DOT, on unless =0 where the library is built with its AVX-512
VNNI code. Under TALLOW_NUMERICS=ggml it makes the logits of the three real models llama.cpp's bit for
bit (llama.cpp's tiled order from 8 rows); in the default mode every row it takes is in vec_dot's
order, so decode steps and speculative verification (up to 8 rows) agree bit for bit, and prefill
keeps its torch layer (docs/performance.md, session 11).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import threading
import weakref
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from ... import switches
from ...gguf_file import TensorInfo
from ...quant.reference import _as_uint8_tensor
from .linear import Linear

__all__ = ["TYPES", "wanted", "available", "usable", "unavailable_reason", "simd", "set_simd", "AVX512", "AVX2", "PORTABLE", "status", "quantize", "gemv_quantized",
           "linear", "parallel_min_bytes", "prefetch_bytes", "GgmlDotLinear", "GgmlDotGroup"]

TYPES: frozenset[QT] = frozenset({QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q6_K, QT.Q4_K, QT.Q5_K})
_ACT = {QT.Q4_0: QT.Q8_0, QT.Q4_1: QT.Q8_1, QT.Q5_0: QT.Q8_0, QT.Q5_1: QT.Q8_1, QT.Q8_0: QT.Q8_0, QT.Q6_K: QT.Q8_K, QT.Q4_K: QT.Q8_K, QT.Q5_K: QT.Q8_K}
_ACT_BLOCK = {QT.Q8_0: (32, 34), QT.Q8_1: (32, 36), QT.Q8_K: (256, 292)}
_ABI = 10  # 6: code levels (tg_simd: 2 AVX-512 VNNI, 1 AVX2, 0 portable); 7: tg_set_row_pairs; 8: Q4_0; 9: Q5_K; 10: Q5_1
MAX_PARTS = 8  # ggml_dot.c's TG_MAX_PARTS
PORTABLE, AVX2, AVX512 = 0, 1, 2  # ggml_dot.c's code levels
_LEVEL_NAMES = {AVX512: "AVX-512 VNNI", AVX2: "AVX2", PORTABLE: "portable C (no AVX2 on this CPU)"}


class _Plan(ctypes.Structure):
    """ggml_dot.c's tg_plan_t: up to MAX_PARTS weights over one input."""

    _fields_ = [("nparts", ctypes.c_int32), ("row_invariant", ctypes.c_int32), ("k", ctypes.c_int64),
                ("types", ctypes.c_int64 * MAX_PARTS), ("w", ctypes.c_void_p * MAX_PARTS),
                ("row_bytes", ctypes.c_int64 * MAX_PARTS), ("n", ctypes.c_int64 * MAX_PARTS)]

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
    lib.tg_linear_multi.argtypes = [p, p, i64, p, p, i32]
    lib.tg_plan_scratch.argtypes = [p, i64]
    lib.tg_plan_scratch.restype = i64
    lib.tg_set_par_min.argtypes = [i64]
    lib.tg_set_par_min.restype = i64
    lib.tg_set_prefetch.argtypes = [i64]
    lib.tg_set_prefetch.restype = i64
    lib.tg_act_row_bytes.argtypes = [i32, i64]
    lib.tg_set_gemm.argtypes = [i32]
    lib.tg_gemm_takes.argtypes = [i32]
    lib.tg_set_row_pairs.argtypes = [i32]
    for f in (lib.tg_quantize, lib.tg_gemv_q, lib.tg_linear, lib.tg_linear_multi):
        f.restype = i32
    lib.tg_set_row_pairs(int(switches.enabled("TALLOW_CPU_ROW_PAIRS")))
    _lib, _reason = lib, ""
    return lib


_bound: dict[str, ctypes.CDLL | None] = {}


def bound(probe: str, declare) -> ctypes.CDLL | None:
    """The library for one C file's functions: None when it is not built or lacks `probe` (a build from
    before that file), else the library after `declare(lib)` has set those functions' argtypes, once."""
    if probe not in _bound:
        lib = _load()
        if lib is not None and hasattr(lib, probe):
            declare(lib)
        else:
            lib = None
        _bound[probe] = lib
    return _bound[probe]


def wanted() -> bool:
    """TALLOW_CPU_GGML_DOT: on unless =0 (where the library is built: `usable`)."""
    return switches.enabled("TALLOW_CPU_GGML_DOT")


def available() -> bool:
    return _load() is not None


def usable() -> bool:
    """Whether make_linear should use the C kernel: built, and with SIMD code for this CPU (AVX-512 VNNI
    or AVX2; the portable code gives the same numbers but is slower than the torch paths)."""
    return available() and simd() > PORTABLE


def unavailable_reason() -> str:
    _load()
    return _reason


def in_use_status() -> str:
    """status(), and whether make_linear uses it (`tallow inspect`, `tallow bench`)."""
    return status() + ("; in use" if wanted() and usable() else "; not in use" + ("" if wanted() else " (TALLOW_CPU_GGML_DOT=0)"))


def simd() -> int:
    """The code level in use: AVX512 (VNNI), AVX2 or PORTABLE (same results, several times slower)."""
    lib = _load()
    return int(lib.tg_simd()) if lib else PORTABLE


def set_simd(level: int | bool) -> int:
    """Run the best code this CPU has up to `level` (True: the best; False: the portable code); for tests
    and checks. Returns the level now in use."""
    lib = _load()
    return int(lib.tg_set_simd(-1 if level is True else int(level))) if lib else PORTABLE


def status() -> str:
    """One line for `tallow info` and the load log."""
    if not available():
        return f"off: {unavailable_reason()}"
    return "built, " + _LEVEL_NAMES[simd()]


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


def _scratch(need: int) -> int:
    scratch = getattr(_local, "scratch", None)
    if scratch is None or scratch.numel() < need:
        with torch.inference_mode(False):
            scratch = _local.scratch = torch.empty(max(need, 1 << 16), dtype=torch.uint8)
    return scratch.data_ptr()


def linear(w: torch.Tensor, qtype: QT, x: torch.Tensor) -> torch.Tensor:
    """x (M, K) float32 contiguous, w (N, row bytes) uint8 -> x @ W^T (M, N) float32, in one C call."""
    m, k = x.shape
    y = torch.empty(m, w.shape[0], dtype=torch.float32)
    (_lib or _load()).tg_linear(int(qtype), w.data_ptr(), w.stride(0), w.shape[0], k, x.data_ptr(), m,
                                _scratch(m * _act_row_bytes(qtype, k)), y.data_ptr(), _threads())
    return y


def gemm(on: bool | None = None) -> bool:
    """Whether products of more than MAX_ROWS rows take ggml_gemm.c's register-tiled product (the same bits
    as the row kernel); with `on`, set it (returns the previous value). For tests and measurements."""
    return bool((_lib or _load()).tg_set_gemm(-1 if on is None else int(on)))


def row_pairs(on: bool | None = None) -> bool:
    """Whether one-row products read two weight rows per call where the type has that form (Q4_1 on AVX2:
    the same bits; TALLOW_CPU_ROW_PAIRS); with `on`, set it (returns the previous value). For tests and
    measurements."""
    return bool((_lib or _load()).tg_set_row_pairs(-1 if on is None else int(on)))


# The types ggml_gemm.c's prefill product takes (AVX-512 VNNI or AVX2): the K-quants in llama.cpp's tiled prompt
# order, the others in vec_dot's (used wherever the C kernel serves many rows: TALLOW_NUMERICS=ggml, the output
# projection).
GEMM_TYPES: frozenset[QT] = frozenset({QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K})
# Those make_linear builds without a torch copy (TALLOW_CPU_GEMM), prefill in C: the K-quants, where one
# integer per super-block lets the product run faster than torch's bf16 GEMM. Q4_1/Q5_0/Q8_0 keep the torch
# layer for prefill: in vec_dot's order every 32 values cost a float convert, multiply and FMA per output, and
# smollm2/gemma3 prefilled 0.7x as fast (docs/performance.md, session 14). Declared here, not only in C, so
# that the weight cache's key (a digest of this file) changes with them.
PREFILL_TYPES: frozenset[QT] = frozenset({QT.Q4_K, QT.Q5_K, QT.Q6_K})
# ggml_dot.c's TG_TILED_MIN_ROWS: in llama.cpp's numerics a product of this many rows or more takes the
# K-quants' tiled order (each row's bits then the same for any such count), fewer vec_dot's.
TILED_MIN_ROWS = 8


def gemm_takes(qtype: QT) -> bool:
    """Whether the C prefill product runs this weight type here (GEMM_TYPES, with AVX-512 VNNI or AVX2)."""
    lib = _load()
    if lib is None or simd() == PORTABLE:
        return False
    return bool(qtype in GEMM_TYPES and lib.tg_gemm_takes(int(qtype)))


def prefills(qtype: QT) -> bool:
    """Whether a layer of this type prefills in C with no torch copy behind it (TALLOW_CPU_GEMM and
    PREFILL_TYPES): make_linear builds it so and the memory plan counts its file bytes only."""
    return switches.enabled("TALLOW_CPU_GEMM") and qtype in PREFILL_TYPES and gemm_takes(qtype)


def parallel_min_bytes(nbytes: int | None = None) -> int:
    """The weight bytes (times rows) under which a product stays on the calling thread; with
    `nbytes`, set it (returns the previous value). For measurements."""
    return int((_lib or _load()).tg_set_par_min(-1 if nbytes is None else int(nbytes)))


def prefetch_bytes(nbytes: int | None = None) -> int:
    """How far ahead of the weight row being read the kernel prefetches (bytes, 0: not at all); with
    `nbytes`, set it (returns the previous value). For measurements: results do not depend on it."""
    return int((_lib or _load()).tg_set_prefetch(-1 if nbytes is None else int(nbytes)))


class _Products:
    """The C side of one or more weights over the same input (ggml_dot.c's tg_plan_t), built at the
    first call and kept beside the layer (not an attribute: the weight cache stores attributes)."""

    __slots__ = ("plan", "addr", "n", "k", "act_bytes", "weights")

    def __init__(self, parts: list[tuple[QT, torch.Tensor]], k: int, row_invariant: bool = True):
        if not 1 <= len(parts) <= MAX_PARTS:
            raise ValueError(f"the C kernel takes 1 to {MAX_PARTS} weights per call, not {len(parts)}")
        self.weights = [w for _, w in parts]  # the plan holds their addresses
        p = self.plan = _Plan()
        p.nparts, p.k = len(parts), k
        p.row_invariant = int(row_invariant)  # 0: llama.cpp's tiled order from 8 rows (TALLOW_NUMERICS=ggml)
        for i, (qt, w) in enumerate(parts):
            p.types[i], p.w[i], p.row_bytes[i], p.n[i] = int(qt), w.data_ptr(), w.stride(0), w.shape[0]
        self.addr = ctypes.addressof(p)
        self.n = sum(w.shape[0] for _, w in parts)
        self.k = k
        self.act_bytes = int((_lib or _load()).tg_plan_scratch(self.addr, 1))  # per input row, each activation type once

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (M, K) float32 contiguous -> (M, sum of N) float32."""
        m = x.shape[0]
        y = torch.empty(m, self.n, dtype=torch.float32)
        if _lib.tg_linear_multi(self.addr, x.data_ptr(), m, _scratch(m * self.act_bytes), y.data_ptr(), _threads()):
            raise ValueError("the C kernel refused a product")  # checked at construction: not reached
        return y


_products: "weakref.WeakKeyDictionary[Linear, _Products]" = weakref.WeakKeyDictionary()


def products_of(layer) -> _Products:
    """The C plan of a layer's weights (`layer._weights()`, side by side), built at its first use and kept."""
    run = _products.get(layer)
    if run is None:
        from ...numerics_mode import ggml_enabled

        run = _products[layer] = _Products(layer._weights(), layer.in_features, row_invariant=not ggml_enabled())
    return run


def _in_c(layer, x2: torch.Tensor) -> torch.Tensor:
    """x2 (M, K) @ the layer's weights in one C call."""
    return products_of(layer)(x2 if x2.dtype == torch.float32 and x2.is_contiguous() else x2.float().contiguous())


def _falls_back(layer, rows: int) -> bool:
    """Whether `rows` go to the layer's torch fallback: prefill, or a cached layer restored where
    the library is missing."""
    return bool(layer.fallback) and (rows > layer.MAX_ROWS or _lib is None and not available())


class GgmlDotLinear(Linear):
    """One-row products in the C kernel over the file's bytes; more rows through `fallback` (a Linear
    over the same tensor) or, with fallback None, through the C kernel row by row."""

    kind = "ggml_dot"
    # Decode and speculative verification (up to speculate.K_MAX + 1 rows), each row in vec_dot's
    # order whatever their number, so a verified row is the decode step's; prefill goes to the
    # fallback, or without one to ggml_gemm.c (a chunk of 9-63 rows only ever holds a whole short
    # prompt: engine/prefill_plan.py).
    MAX_ROWS = 8

    def __init__(self, tensor: TensorInfo, bias: torch.Tensor | None = None, fallback: Linear | None = None):
        super().__init__(tensor.name, tensor.n_cols, tensor.n_rows, bias)
        if tensor.qtype not in TYPES or not available():
            raise ValueError(f"{tensor.name}: the C kernel does not take {QT(tensor.qtype).name}")
        self.qtype = QT(tensor.qtype)
        # (N, row bytes): the file's bytes, mapped (TALLOW_CPU_MAP_WEIGHTS=0: copied into memory)
        self.weight = torch.from_numpy(tensor.private_view() if switches.enabled("TALLOW_CPU_MAP_WEIGHTS") else
                                       np.array(tensor.data, copy=True))
        self.fallback = [fallback] if fallback is not None else []  # a list: memory/weight_cache.py restores lists

    def _tensors(self) -> list[torch.Tensor]:
        extra = self.fallback[0]._tensors() if self.fallback else []
        return [self.weight, *extra, *super()._tensors()]

    def _weights(self) -> list[tuple[QT, torch.Tensor]]:
        return [(QT(self.qtype), self.weight)]

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        if _falls_back(self, x2.shape[0]):
            return self.fallback[0]._mm(x2)
        return _in_c(self, x2)

    def _mm_native(self, xc: torch.Tensor) -> torch.Tensor:
        return self._mm(xc)


class GgmlDotGroup(Linear):
    """Several GgmlDotLinear over the same input (Q/K/V, gate/up; FusedLinear builds it): one C call
    quantizes the input once per activation type and runs every part's rows in one parallel region.
    The outputs are the parts' own (same row code), side by side. More rows than MAX_ROWS go to
    `fallback`: the FusedLinear of the parts' torch layers (prefill as without the C kernel)."""

    kind = "ggml_dot"
    MAX_ROWS = GgmlDotLinear.MAX_ROWS

    def __init__(self, parts: list[GgmlDotLinear]):
        from .fused_linear import FusedLinear, _stacked_bias

        k = parts[0].in_features
        super().__init__("+".join(p.name for p in parts), k, sum(p.out_features for p in parts), _stacked_bias(parts))
        self.qtypes = [int(p.qtype) for p in parts]
        self.parts = []  # the parts without their fallbacks (those are stacked in self.fallback)
        for p in parts:
            bare = object.__new__(GgmlDotLinear)
            Linear.__init__(bare, p.name, p.in_features, p.out_features, None)
            bare.qtype, bare.weight, bare.fallback = p.qtype, p.weight, []
            self.parts.append(bare)
        have = [bool(p.fallback) for p in parts]
        if any(have) and not all(have):
            raise ValueError("a GgmlDotGroup's parts all have a torch fallback or none has")
        self.fallback = [FusedLinear([p.fallback[0] for p in parts], fuse=True)] if all(have) else []

    def _tensors(self) -> list[torch.Tensor]:
        extra = self.fallback[0]._tensors() if self.fallback else []
        return [t for p in self.parts for t in p._tensors()] + extra + super()._tensors()

    def _weights(self) -> list[tuple[QT, torch.Tensor]]:
        return [(QT(p.qtype), p.weight) for p in self.parts]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _falls_back(self, x.numel() // self.in_features):
            return self.fallback[0](x)  # prefill: the stacked torch layers, biases included
        return super().__call__(x)

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        if _falls_back(self, x2.shape[0]):  # inside an outer FusedLinear that adds the biases itself
            runs = self.fallback[0].runs
            return torch.cat([r._mm(x2) for r in runs], dim=-1) if len(runs) > 1 else runs[0]._mm(x2)
        return _in_c(self, x2)

    def _mm_native(self, xc: torch.Tensor) -> torch.Tensor:
        return self._mm(xc)
