"""Decode attention over an f16 KV cache in C (decode_attention.c, built into the optional C
library with ggml_dot.c): each K and V row read once in f16, where the torch path copies the
whole window to fp32 at every step. Used by layers.decode_attention for one query token over an
f16 cache when the library is built (TALLOW_CPU_C_ATTENTION=0: torch's SDPA), and query by query for
speculative verification (models/step.EagerRowsAttention), so a verified row is the decode step's.
Prefill keeps SDPA: its sums run in another order, but decode steps never write canonical K/V."""

from __future__ import annotations

import ctypes

import torch

from . import ggml_dot

__all__ = ["usable", "attend_f16", "set_simd"]


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    lib.ta_attend_f16.argtypes = [p, i32, i32, i32, i32, p, p, i64, i64, i64, i64, i64, i64, i64, f32, f32, p, i32]
    lib.ta_attend_f16.restype = i32
    lib.ta_set_simd.argtypes = [i32]
    lib.ta_simd.restype = i32


def _lib() -> ctypes.CDLL | None:
    return ggml_dot.bound("ta_attend_f16", _declare)


def usable() -> bool:
    """The library is built (layers.c_attention_enabled also asks TALLOW_CPU_C_ATTENTION)."""
    return _lib() is not None


def set_simd(level: int | bool) -> int:
    """Tests: the best code up to `level` (ggml_dot.AVX512 / AVX2 / PORTABLE; True: the best, False: the
    portable C, the same algorithm without SIMD). Returns the level now in use."""
    _lib().ta_set_simd(-1 if level is True else int(level))
    return int(_lib().ta_simd())


def attend_f16(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, begin: int, end: int, scale: float,
               softcap: float | None = None, threads: int | None = None, ring: bool = False) -> torch.Tensor:
    """q (1, n_heads, dk) float32; k_cache (n_kv, n_ctx, dk), v_cache (n_kv, n_ctx, dv) float16, last dim
    contiguous; the keys of positions [begin, end) -> (1, n_heads * dv) float32. `ring`: the caches are a
    sliding-window layer's ring, position p in row p % its length (memory/kv_pool.py), read in position
    order. `threads`: torch's count by default (the keys of a KV head are split into chunks across them,
    merged as split-K decoding does)."""
    lib = _lib()
    n_heads, dk = q.shape[1], q.shape[2]
    n_kv, dv = k_cache.shape[0], v_cache.shape[2]
    if k_cache.dtype != torch.float16 or v_cache.dtype != torch.float16 or k_cache.stride(2) != 1 or v_cache.stride(2) != 1:
        raise ValueError("attend_f16 wants float16 K and V caches with a contiguous last dim.")
    qc = q.reshape(n_heads, dk).float().contiguous()
    out = torch.empty((1, n_heads * dv), dtype=torch.float32)
    rc = lib.ta_attend_f16(qc.data_ptr(), n_heads, n_kv, dk, dv, k_cache.data_ptr(), v_cache.data_ptr(),
                           k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), begin, end,
                           k_cache.shape[1] if ring else 0, float(scale), float(softcap or 0.0), out.data_ptr(),
                           threads or torch.get_num_threads())
    if rc == -2:
        raise ValueError(f"positions {begin}..{end - 1} do not fit a ring of {k_cache.shape[1]} rows.")
    if rc != 0:
        raise MemoryError("decode attention: the C kernel could not allocate its scratch.")
    return out
