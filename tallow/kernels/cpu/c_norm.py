"""RMSNorm of fp32 rows in C (row_norm.c, built into the optional C library with ggml_dot.c), in
ggml's arithmetic: squares summed in double, the mean and 1/sqrtf in float, (x * scale) * weight —
numerics.ggml_rms_norm's bits (tests/test_c_norm.py), so TALLOW_NUMERICS=ggml uses it too. Used by
layers.rms_norm for CPU fp32 rows when the library is built and TALLOW_CPU_C_NORM is on: one C call
where torch runs ~6 ops, for a decode step's ~200 norms (Gemma 4 E2B) and every prefill row alike."""

from __future__ import annotations

import ctypes

import torch

from . import ggml_dot

__all__ = ["usable", "rms_norm", "norm_add"]

_ready: bool | None = None


def _lib() -> ctypes.CDLL | None:
    global _ready
    lib = ggml_dot._load()
    if lib is None or not hasattr(lib, "rn_rms_norm"):
        return None
    if _ready is None:
        p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        lib.rn_rms_norm.argtypes = [p, i64, i64, i64, i64, i64, p, i64, f32, p, p, p, i32]
        lib.rn_rms_norm.restype = None
        _ready = True
    return lib


def usable() -> bool:
    return _lib() is not None


def _layout(x: torch.Tensor) -> tuple[int, int, int] | None:
    """(inner, outer stride, inner stride) of x's rows as a (rows / inner, inner, n) view, or None."""
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        return None
    if x.dim() == 1:
        return 1, x.shape[0], 0
    if x.dim() == 2:
        return 1, x.stride(0), 0
    if x.dim() == 3:
        return x.shape[1], x.stride(0), x.stride(1)
    return (1, x.shape[-1], 0) if x.is_contiguous() else None


def applies(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Rows this kernel takes: fp32 on the CPU, the last dim contiguous (rows may be heads sliced out
    of a projection), a weight of the row's width (or rows of it, one per head) in fp32."""
    n = x.shape[-1]
    return (x.device.type == "cpu" and x.dtype == torch.float32 and _layout(x) is not None
            and (weight is None or (weight.dtype == torch.float32 and weight.shape[-1] == n and weight.dim() <= 2
                                    and weight.is_contiguous())))


def _call(x, weight, eps, add, mul) -> torch.Tensor:
    n = x.shape[-1]
    rows = x.numel() // n if n else 0
    y = torch.empty(x.shape, dtype=torch.float32)
    inner, s_outer, s_inner = _layout(x)
    w_rows = 0 if weight is None else (weight.shape[0] if weight.dim() == 2 else 1)
    _lib().rn_rms_norm(x.data_ptr(), rows, n, inner, s_outer, s_inner, None if weight is None else weight.data_ptr(), w_rows, float(eps),
                       None if add is None else add.data_ptr(), None if mul is None else mul.data_ptr(), y.data_ptr(),
                       torch.get_num_threads())
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x (..., n) fp32 contiguous; weight (n,), (heads, n) for rows of heads, or None."""
    return _call(x, weight, eps, None, None)


def norm_add(x: torch.Tensor, branch: torch.Tensor, weight: torch.Tensor, eps: float,
             scale: torch.Tensor | None = None) -> torch.Tensor:
    """(x + rms_norm(branch) * weight) * scale in one call: the same float operations as the torch
    composition over this module's norm (block_ops.TorchOps.norm_add)."""
    return _call(branch, weight, eps, x.contiguous(), None if scale is None else scale.float().contiguous())
