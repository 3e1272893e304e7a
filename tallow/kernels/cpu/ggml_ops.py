"""TALLOW_NUMERICS=ggml's elementwise ops in C (ggml_ops.c, built into the optional library with
ggml_dot.c): RMSNorm, the RoPE rotation, SwiGLU, GeGLU and attention over the f16 KV
cache, each bit-identical to its torch emulation in tallow/numerics.py (the reference, and
llama.cpp b11434's arithmetic) in one C call instead of many small torch calls.

Switch (read per call): TALLOW_GGML_C_OPS=0 runs the torch emulations; on by default where the
library is built. Callers (layers.py, models/step.py) ask `usable()` and otherwise run the emulation.
"""

from __future__ import annotations

import ctypes

import torch

from ... import switches
from . import ggml_dot

__all__ = ["usable", "set_simd", "rms_norm", "rope", "swiglu", "geglu", "attend", "cos_sin"]


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.go_rms_norm.argtypes = [p, i64, p, p, i64, i64, p, i64, f32, p]
    lib.go_rope.argtypes = [p, i64, i64, i64, i64, i32, i32, p, p, i32, p]
    lib.go_swiglu.argtypes = [p, i64, p, i64, i64, i64, p, i64]
    lib.go_geglu.argtypes = [p, i64, p, i64, i64, i64, p, p, i64]
    lib.go_attend.argtypes = [p, i64, i64, i32, i32, i32, i32, i32, p, p, i64, i64, i64, i64, i64, i64, i64, i64, i64, f32, p,
                              i32]
    lib.go_attend.restype = i32
    lib.go_cos_sin.argtypes = [p, i64, p, p]
    lib.go_cos_sin.restype = None
    lib.go_set_simd.argtypes = [i32]
    lib.go_set_simd.restype = i32
    for f in (lib.go_rms_norm, lib.go_rope, lib.go_swiglu, lib.go_geglu):
        f.restype = None


def _lib() -> ctypes.CDLL | None:
    return ggml_dot.bound("go_attend", _declare)


def built() -> bool:
    """The library is built (with these functions)."""
    return _lib() is not None


def usable() -> bool:
    """TALLOW_GGML_C_OPS (default on) and the library built."""
    return switches.enabled("TALLOW_GGML_C_OPS") and built()


def norm_fits(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether `rms_norm` takes x and weight: CPU float32 rows, a weight of the row's width or one
    row of it per head (x (..., heads, n) with weight (heads, n))."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight is None:
        return weight is None and x.device.type == "cpu" and x.dtype == torch.float32
    n = x.shape[-1]
    if weight.dim() == 1:
        return weight.shape[0] == n
    return weight.dim() == 2 and x.dim() > 2 and tuple(weight.shape) == (x.shape[-2], n)


def set_simd(level: int | bool) -> int:
    """Tests: the best code up to `level` (ggml_dot.AVX512 / AVX2 / PORTABLE; True: the best, False: the portable
    C, the same float operations without SIMD; ssm_step.c's code follows it too). Returns the level now in use."""
    return int(_lib().go_set_simd(-1 if level is True else int(level)))


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (rows, n) float32 with a contiguous last dim and one row stride (a view where it can be)."""
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    if x2.dtype != torch.float32 or x2.stride(-1) != 1:
        x2 = x2.float().contiguous()
    return x2


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, delta: torch.Tensor | None = None):
    """numerics.ggml_rms_norm: x (..., n); weight (n,) or (R, n) with R = x.shape[-2] (per-head rows).
    With `delta` (x's shape): the norm of x + delta, returned with that sum as (sum, norm)."""
    n = x.shape[-1]
    x2 = _rows(x)
    y = torch.empty(x.shape, dtype=torch.float32)
    w_rows = 1
    if weight is not None:
        if weight.dtype != torch.float32 or not weight.is_contiguous():
            weight = weight.float().contiguous()
        w_rows = weight.numel() // n
        if weight.numel() != w_rows * n or (w_rows > 1 and (x.dim() < 2 or x.shape[-2] != w_rows)):
            raise ValueError(f"rms_norm: a weight of shape {tuple(weight.shape)} does not fit rows of {tuple(x.shape)}")
    d = total = None
    if delta is not None:
        d = delta if delta.dtype == torch.float32 and delta.is_contiguous() else delta.float().contiguous()
        total = torch.empty(x.shape, dtype=torch.float32)
    _lib().go_rms_norm(x2.data_ptr(), x2.stride(0), None if d is None else d.data_ptr(),
                                       None if total is None else total.data_ptr(), x2.shape[0], n,
                                       None if weight is None else weight.data_ptr(), w_rows, eps, y.data_ptr())
    return y if delta is None else (total, y)


def rope(x: torch.Tensor, cos_full: torch.Tensor, sin_signed: torch.Tensor, rope_dim: int, neox: bool) -> torch.Tensor:
    """numerics.ggml_rope_rotate on x (n, heads, head_dim) (any strides, last dim contiguous), the first
    rope_dim values of each head rotated, the rest copied; cos_full, sin_signed (n, 1, rope_dim) float32.
    Returns a new contiguous (n, heads, head_dim) tensor."""
    n, heads, head_dim = x.shape
    if x.dtype != torch.float32 or x.stride(-1) != 1:
        x = x.float().contiguous()
    c, s = cos_full.contiguous(), sin_signed.contiguous()
    out = torch.empty((n, heads, head_dim), dtype=torch.float32)
    _lib().go_rope(x.data_ptr(), x.stride(0), x.stride(1), n, heads, head_dim, rope_dim, c.data_ptr(), s.data_ptr(),
                       int(neox), out.data_ptr())
    return out


def _glu_args(gate: torch.Tensor, up: torch.Tensor):
    g2, u2 = _rows(gate), _rows(up)
    if g2.shape != u2.shape:
        raise ValueError(f"glu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    return g2, u2, torch.empty(gate.shape, dtype=torch.float32)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """numerics.ggml_swiglu: silu(gate) * up, silu by ggml_v_expf."""
    g2, u2, y = _glu_args(gate, up)
    _lib().go_swiglu(g2.data_ptr(), g2.stride(0), u2.data_ptr(), u2.stride(0), g2.shape[0], g2.shape[1], y.data_ptr(),
                         g2.shape[1])
    return y


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """numerics.ggml_geglu: ggml's fp16 GELU table of gate, times up."""
    from ...numerics import ggml_gelu_table

    table = ggml_gelu_table()  # built once, 65536 float32
    g2, u2, y = _glu_args(gate, up)
    _lib().go_geglu(g2.data_ptr(), g2.stride(0), u2.data_ptr(), u2.stride(0), g2.shape[0], g2.shape[1],
                        table.data_ptr(), y.data_ptr(), g2.shape[1])
    return y


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lo: int, start: int, window: int | None,
           scale: float, threads: int | None = None) -> torch.Tensor:
    """numerics.ggml_attention for the query rows q (n, n_heads, head_dim) float32 (any strides, last dim
    contiguous) at positions start.. over the keys at positions lo..start+n-1 of the f16 caches
    (n_kv, capacity, dim) (position p in slot p % capacity: a ring or the whole context), causal, and
    with `window` each row sees only its last `window` positions. One row sums as ggml_vec_dot_f16,
    more as llamafile's tinyBLAS, as llama.cpp does. Returns (n, n_heads * v_head_dim) float32."""
    n_q, n_heads, dk = q.shape
    n_kv, cap, dv = v_cache.shape
    end = start + n_q
    if k_cache.dtype != torch.float16 or v_cache.dtype != torch.float16 or k_cache.stride(2) != 1 or v_cache.stride(2) != 1:
        raise ValueError("attend wants float16 K and V caches with a contiguous last dim.")
    if end - lo > cap or lo > start:
        raise ValueError(f"positions {lo}..{end - 1} do not fit {cap} slots")
    if q.dtype != torch.float32 or q.stride(-1) != 1:
        q = q.float().contiguous()
    out = torch.empty((n_q, n_heads * dv), dtype=torch.float32)
    rc = _lib().go_attend(q.data_ptr(), q.stride(0), q.stride(1), n_q, n_heads, n_kv, dk, dv,
                                          k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0), k_cache.stride(1),
                                          v_cache.stride(0), v_cache.stride(1), cap, lo, end - lo, start, window or 0,
                                          float(scale), out.data_ptr(), threads or torch.get_num_threads())
    if rc != 0:
        raise MemoryError("ggml attention: the C kernel could not allocate its scratch.")
    return out


def cos_sin(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """libm's cosf and sinf of float32 angles in one C call (numerics.ggml_rope_cos_sin's values), or None where the
    library is not built. Not behind TALLOW_GGML_C_OPS: the values are libm's either way."""
    lib = _lib()
    if lib is None:
        return None
    a = angles.detach().float().contiguous()
    c, s = torch.empty_like(a), torch.empty_like(a)
    lib.go_cos_sin(a.data_ptr(), a.numel(), c.data_ptr(), s.data_ptr())
    return c, s
