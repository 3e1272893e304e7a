"""ggml's arithmetic for the elementwise parts of a forward pass (llama.cpp's numerics: the CPU
default where numerics_choice.py finds every part in C, and TALLOW_NUMERICS=ggml).

llama.cpp's CPU backend rounds in places tallow's default path does not, and in the fixtures'
configuration (scripts/numerics_reference.py: flash attention off, f16 K/V, no repacking) those
roundings decide greedy near-ties. This module holds the device-free emulations; the quantized
products live in kernels/cpu/ggml_linear.py. Each op below is bit-identical to llama.cpp b11434
on this machine class when fed llama.cpp's own input (scripts/numerics_layers.py, measured on
every layer kind of smollm2, gemma3 and qwen2.5; tests/test_ggml_numerics.py on a fixture). What
each mirrors (ggml-cpu/ops.cpp, vec.h, llamafile/sgemm.cpp, as GCC compiles them: contracted FMAs):

- RMSNorm: the sum of squares in double, mean and 1/sqrtf in float (sqrt correctly rounded:
  torch's float32 sqrt is not on this CPU), then (x * scale) * weight.
- RoPE: theta by the float32 recurrence theta *= powf(base, -2/n_dims) from the position,
  libm's cosf/sinf, and rotate_pairs' two contracted FMAs.
- Attention with flash attention off: K and V from the f16 cache; Q and the softmax weights
  rounded to f16 by the products' vec_dot_type; the two products summed in llamafile's F16
  lane order for prompts and ggml_vec_dot_f16's for one-token steps; softmax with ggml's own
  SIMD exponential (ggml_v_expf), block sums in double.
- SwiGLU: silu by ggml_v_expf; GeGLU: ggml's fp16 GELU table (built with libm's tanhf).

The switch is read at call time except where a table is built (RotaryTables, linears).

These emulations are the reference: on the CPU the layers run RMSNorm, the RoPE rotation, SwiGLU/GeGLU
and the attention through kernels/cpu/ggml_ops.c instead (one C call each, the same bits, checked
against the functions below by tests/test_ggml_numerics.py); TALLOW_GGML_C_OPS=0 runs these.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import torch


def ggml_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """ggml_compute_forward_rms_norm_f32 followed by the weight's ggml_mul: float32 squares
    summed in double, mean rounded to float, scale = 1/sqrtf(mean + eps) in float, then
    (x * scale) * weight. The square root is taken in double and rounded: torch's float32
    sqrt on this CPU is not correctly rounded (17% of random inputs differ from sqrtf by an ulp)."""
    mean = ((x * x).double().sum(-1, keepdim=True) / x.shape[-1]).float()
    scale = 1.0 / torch.sqrt((mean + torch.tensor(eps, dtype=torch.float32)).double()).float()
    y = x * scale
    return y * weight if weight is not None else y


def _libm():
    """The C library's float functions (cosf, sinf, powf, expf, tanhf), which ggml calls: they
    are not correctly rounded (cosf differs from the rounded double cosine on ~1% of RoPE
    angles), so only calling them gives ggml's bits."""
    global _LIBM
    if _LIBM is None:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        for name, n_args in (("cosf", 1), ("sinf", 1), ("expf", 1), ("tanhf", 1), ("powf", 2)):
            f = getattr(lib, name)
            f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float] * n_args
        _LIBM = lib
    return _LIBM


_LIBM = None


def libm_map(name: str, x: torch.Tensor) -> torch.Tensor:
    """The libm float function `name` applied to every element of x (float32), one C call each."""
    f = getattr(_libm(), name)
    flat = x.detach().float().reshape(-1).tolist()
    return torch.tensor([f(v) for v in flat], dtype=torch.float32).reshape(x.shape)


def ggml_rope_angles(n_positions: int, rope_dim: int, base: float, freq_scale: float = 1.0) -> torch.Tensor:
    """Angles (n_positions, rope_dim/2) float32 as ggml_rope_cache_init makes them: theta
    starts at the position and is multiplied by theta_scale = powf(base, -2/n_dims) once per
    pair, in float32, so the error of the recurrence is llama.cpp's too."""
    theta_scale = _libm().powf(float(np.float32(base)), float(np.float32(-2.0) / np.float32(rope_dim)))
    theta = torch.arange(n_positions, dtype=torch.float32)
    step = torch.tensor(float(theta_scale), dtype=torch.float32)
    cols = []
    for _ in range(rope_dim // 2):
        cols.append(theta * freq_scale if freq_scale != 1.0 else theta)
        theta = theta * step
    return torch.stack(cols, dim=1)


def ggml_rope_cos_sin(angles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cosf and sinf of the angles, by libm itself (rope_yarn with mscale 1): in one C call where the optional
    library is built (kernels/cpu/ggml_ops.c's go_cos_sin, the same libm functions), else one ctypes call each."""
    from .kernels.cpu import ggml_ops  # (imported here: the kernels import this module)

    both = ggml_ops.cos_sin(angles)
    return both if both is not None else (libm_map("cosf", angles), libm_map("sinf", angles))


def fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 a*b + c rounded once, as an FMA instruction: the product of two floats is exact in
    double, the sum is rounded to double and then to float (a double rounding that can differ
    from one rounding only when the double sum lands on a float halfway point: ~2^-29 per op)."""
    return (a.double() * b.double() + c.double()).float()


def ggml_rope_rotate(x: torch.Tensor, swapped: torch.Tensor, cos_full: torch.Tensor, sin_signed: torch.Tensor,
                     second: torch.Tensor) -> torch.Tensor:
    """ggml's rotate_pairs as GCC compiles it (floating-point contraction on): the first member
    of a pair x0*cos - x1*sin is fma(x0, cos, -(x1*sin)), the second x0*sin + x1*cos is
    fma(x0, sin, x1*cos). x: the values being rotated, swapped: each one's partner, cos_full,
    sin_signed: RotaryTables' full-width tables (sin negated on first members), second: bool
    (rope_dim,) True on the second member of each pair."""
    first_out = fma(x, cos_full, swapped * sin_signed)  # x = x0, partner x1, sin_signed = -sin
    second_out = fma(swapped, sin_signed, x * cos_full)  # x = x1, partner x0, sin_signed = +sin
    return torch.where(second, second_out, first_out)


# ggml_v_expf (ggml-cpu/vec.h, the AVX-512 form this machine runs): exp(x) = 2^n * p(b) with
# n = round(x * log2(e)) by the 1.5*2^23 trick, b = x - n*ln2 in two parts, p a degree-5
# polynomial in Horner/Estrin form; every fused multiply-add rounded once.
_EXP_R = float.fromhex("0x1.8p23")
_EXP_LOG2E = float.fromhex("0x1.715476p+0")
_EXP_LN2_HI = float.fromhex("0x1.62e4p-1")
_EXP_LN2_LO = float.fromhex("0x1.7f7d1cp-20")
_EXP_C = [float.fromhex(h) for h in ("0x1.ffffecp-1", "0x1.fffdb6p-2", "0x1.555e66p-3", "0x1.573e2ep-5", "0x1.0e4020p-7")]


def ggml_v_expf(x: torch.Tensor) -> torch.Tensor:
    """exp(x) float32 bit for bit as ggml_v_expf (the SIMD exponential ggml's softmax and SiLU use)."""
    x = x.float()
    full = lambda v: torch.full_like(x, v)  # noqa: E731
    z = fma(x, full(_EXP_LOG2E), full(_EXP_R))
    n = z - _EXP_R
    b = fma(-n, full(_EXP_LN2_LO), fma(-n, full(_EXP_LN2_HI), x))
    u = b * b
    c1, c2, c3, c4, c5 = (full(c) for c in _EXP_C)
    j = fma(fma(fma(c5, b, c4), u, fma(c3, b, c2)), u, fma(c1, b, full(1.0)))
    res = (j.double() * torch.exp2(n.double())).float()  # _mm512_scalef_ps: j * 2^n, rounded once
    big = n.abs() > 192
    if bool(big.any()):
        res = torch.where(big, torch.where(n <= 0, torch.zeros_like(x), torch.full_like(x, float("inf"))), res)
    return res


def ggml_silu(x: torch.Tensor) -> torch.Tensor:
    """ggml_v_silu: x / (1 + ggml_v_expf(-x)) in float32 (SIMD blocks of 16; every MLP width
    tallow meets is a multiple of 16, so ggml's scalar tail never runs)."""
    return x / (1.0 + ggml_v_expf(-x))


def ggml_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """ggml_vec_swiglu_f32: silu(gate) * up."""
    return ggml_silu(gate) * up


_GELU_TABLE = None


def ggml_gelu_table() -> torch.Tensor:
    """ggml_table_gelu_f16 (65536 float32 values, one per fp16 bit pattern), built as ggml_cpu_init
    builds it: fp16(0.5f*x*(1.0f + tanhf(SQRT_2_OVER_PI*x*(1.0f + GELU_COEF_A*x*x)))) with libm's
    tanhf and GCC's contraction of 1 + a*x*x into one fused multiply-add. Non-finite inputs give 0
    (ggml never reads those entries: it answers |x| >= 10 without the table)."""
    global _GELU_TABLE
    if _GELU_TABLE is None:
        x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
        x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
        a = torch.tensor(0.044715, dtype=torch.float32)
        s = torch.tensor(0.79788456080286535587989211986876, dtype=torch.float32)
        inner = (s * x) * fma(a * x, x, torch.ones_like(x))
        _GELU_TABLE = (0.5 * x * (1.0 + libm_map("tanhf", inner))).half().float()
    return _GELU_TABLE


def ggml_geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """ggml_vec_geglu_f32: 0 where gate <= -10, gate * up where gate >= 10, else the fp16 table's
    GELU of fp16(gate) times up."""
    idx = gate.half().view(torch.int16).to(torch.int64) & 0xFFFF
    g = ggml_gelu_table().to(gate.device)[idx]
    out = g * up
    out = torch.where(gate >= 10.0, gate * up, out)
    return torch.where(gate <= -10.0, torch.zeros_like(out), out)


def _reduce16(v: torch.Tensor) -> torch.Tensor:
    """_mm512_reduce_add_ps over the last axis (16 lanes) in GCC's order: halves, quarters, pairs."""
    v = v[..., :8] + v[..., 8:]
    v = v[..., :4] + v[..., 4:]
    v = v[..., :2] + v[..., 2:]
    return v[..., 0] + v[..., 1]


def ggml_softmax(scores: torch.Tensor) -> torch.Tensor:
    """ggml_vec_soft_max_f32 over rows of whole 16-value blocks (llama.cpp pads the keys to 256):
    exp by ggml_v_expf of (x - max), each block's 16 values summed in float by the SIMD tree,
    the block sums added in double, then x * (float)(1/sum). A row whose length is not a multiple
    of 16 is padded with -inf (exp 0: the sums do not change). Fully masked rows (all -inf) give
    zeros, as ggml's skipped rows do."""
    n = scores.shape[-1]
    pad = -n % 16
    if pad:
        scores = torch.nn.functional.pad(scores, (0, pad), value=float("-inf"))
    top = scores.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = ggml_v_expf(scores - top)
    block_sums = _reduce16(e.unflatten(-1, (-1, 16)))  # (..., n_blocks) float32
    total = torch.zeros(block_sums.shape[:-1], dtype=torch.float64)
    for i in range(block_sums.shape[-1]):  # ggml adds the block sums one by one, in double
        total += block_sums[..., i].double()
    inv = (1.0 / total).float().unsqueeze(-1)
    return (e * inv)[..., :n]


def ggml_dot_f16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (..., M, K) @ b (..., N, K)^T with both rounded to f16, summed as ggml's mul_mat sums for
    an F16 weight (b) on AVX-512; each product of two f16 is exact in float32, so every FMA is
    one rounded add, and only the order of the adds matters:
    - M >= 2 (prompt rows): llamafile's tinyBLAS, 16 lanes, lane k adding the products k, k+16,
      k+32, ... one by one, then the lanes by _mm512_reduce_add_ps;
    - M == 1 (a decode step; llamafile_sgemm declines n < 2): ggml_vec_dot_f16, 4 accumulators
      of 16 lanes over steps of 64, reduced (0+2) + (1+3), then the lanes.
    K is padded with zeros to a multiple of 64 (llama.cpp pads its keys to 256; +0 changes no sum)."""
    a = a.half().float()
    b = b.half().float()
    k = a.shape[-1]
    if k % 64:
        a = torch.nn.functional.pad(a, (0, -k % 64))
        b = torch.nn.functional.pad(b, (0, -k % 64))
    lanes = 16 if a.shape[-2] > 1 else 64
    acc = None
    for s in range(0, a.shape[-1], lanes):  # (..., M, N, lanes): this step's products
        p = a[..., :, None, s : s + lanes] * b[..., None, :, s : s + lanes]
        acc = p if acc is None else acc + p
    if lanes == 64:
        acc = (acc[..., 0:16] + acc[..., 32:48]) + (acc[..., 16:32] + acc[..., 48:64])
    return _reduce16(acc)


def ggml_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                   softcap: float | None = None) -> torch.Tensor:
    """Grouped-query attention as llama.cpp computes it with flash attention off.

    q: (n_heads, n_q, head_dim) float32; k: (n_kv_heads, n_keys, head_dim), v: (n_kv_heads,
    n_keys, v_head_dim), values of the f16 cache (any float dtype); mask (n_q, n_keys) bool or
    None. Returns (n_q, n_heads * v_head_dim) float32.
    """
    n_heads, n_q, _ = q.shape
    group = n_heads // k.shape[0]
    kh = k.half().float().repeat_interleave(group, dim=0)
    vh = v.half().float().repeat_interleave(group, dim=0)
    scores = ggml_dot_f16(q, kh)  # (n_heads, n_q, n_keys): the F16 K's vec_dot_type rounds Q
    if softcap is not None:  # build_attn_mha: scale by 1/cap, tanh, scale by cap, then soft_max's scale
        scores = softcap * torch.tanh(scores * (1.0 / softcap))
    scores = scores * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = ggml_softmax(scores)
    out = ggml_dot_f16(probs, vh.transpose(1, 2))  # (n_heads, n_q, v_head_dim); V^T's rows are the keys
    return out.transpose(0, 1).reshape(n_q, -1)
