"""Activation quantization as ggml's x86 CPU backend does it before every quantized product.

ggml pairs each weight type with a "vec_dot_type" (ggml-cpu.c's type_traits_cpu) and rounds
the float32 activations to it: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the
K-quants, F16 for F16 weights, BF16 for BF16. The rounding rules are those of the AVX2 code
this machine runs (arch/x86/quants.c, repack.cpp), which differ from the scalar reference:

- Q8_0 / Q8_1 (32 values): amax = max |x|; d = fp16(amax / 127); codes = round-half-even
  (x * (127 / amax)) -- not roundf(x / d). Q8_1 adds s = fp16(d_f32 * sum(codes)), the block
  sum its Q4_1/Q5_1 dot products multiply by the weight's min.
- Q8_K (256 values): iscale = -127 / m where m is the first value of largest magnitude;
  codes = min(127, round-half-even(x * iscale)); d = 1 / iscale in float32.

Functions return the codes (float32 holding integers), the per-block scale as ggml stores it
and, for Q8_1, the rounded block sum; `round_activations` gives the values the integer dot
product effectively sees (scale * code) for a weight type.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType as QT

Q8_BLOCK = 32
Q8_K_BLOCK = 256

# ggml-cpu.c type_traits_cpu[...].vec_dot_type for the weight types tallow loads
# (scripts/make_ggml_op_fixtures.py reads the same table out of libggml-cpu and checks it).
VEC_DOT_TYPE: dict[QT, QT] = {
    QT.Q4_0: QT.Q8_0, QT.Q5_0: QT.Q8_0, QT.Q8_0: QT.Q8_0,
    QT.Q4_1: QT.Q8_1, QT.Q5_1: QT.Q8_1,
    QT.Q2_K: QT.Q8_K, QT.Q3_K: QT.Q8_K, QT.Q4_K: QT.Q8_K, QT.Q5_K: QT.Q8_K, QT.Q6_K: QT.Q8_K,
    QT.F16: QT.F16, QT.BF16: QT.BF16, QT.F32: QT.F32,
}


def _over(numerator: float, t: torch.Tensor) -> torch.Tensor:
    """numerator / t, correctly rounded: torch computes `scalar / tensor` as scalar * (1 / t),
    which rounds twice and differs from C's division in the last bit (measured on Q8_K's d)."""
    return torch.div(torch.full_like(t, numerator), t)


def _blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    if x.shape[-1] % size:
        raise ValueError(f"a row of {x.shape[-1]} values is not a whole number of {size}-value blocks")
    return x.float().reshape(*x.shape[:-1], x.shape[-1] // size, size)


def quantize_q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) -> codes (..., K/32, 32) float32 integers in [-127, 127], d (..., K/32) float32
    holding the fp16 scale."""
    b = _blocks(x, Q8_BLOCK)
    amax = b.abs().amax(-1, keepdim=True)
    d = torch.div(amax, torch.full_like(amax, 127.0)).half().float()  # tensor / scalar would multiply by 1/127
    mul = torch.where(amax != 0, _over(127.0, amax), torch.zeros_like(amax))
    codes = torch.round(b * mul)  # torch.round is half-to-even, as _mm256_round_ps(_MM_ROUND_NEAREST)
    return codes, d.squeeze(-1)


def quantize_q8_1(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q8_0's codes and fp16 d, plus s = fp16(d_f32 * sum(codes)) (..., K/32) float32."""
    b = _blocks(x, Q8_BLOCK)
    amax = b.abs().amax(-1, keepdim=True)
    d32 = torch.div(amax, torch.full_like(amax, 127.0))
    mul = torch.where(amax != 0, _over(127.0, amax), torch.zeros_like(amax))
    codes = torch.round(b * mul)
    s = (d32.squeeze(-1) * codes.sum(-1)).half().float()  # |sum| <= 4064: exact in float32
    return codes, d32.half().float().squeeze(-1), s


def quantize_q8_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) -> codes (..., K/256, 256) float32 integers in [-127, 127], d (..., K/256)
    float32 (1/iscale; 0 for an all-zero block)."""
    b = _blocks(x, Q8_K_BLOCK)
    first = b.abs().argmax(-1, keepdim=True)  # torch returns the first index of the maximum
    m = b.gather(-1, first)  # the signed value of largest magnitude
    iscale = torch.where(m != 0, _over(-127.0, m), torch.zeros_like(m))
    codes = torch.round(b * iscale).clamp_(max=127)
    d = torch.where(m != 0, _over(1.0, iscale), torch.zeros_like(iscale))
    return codes, d.squeeze(-1)


def round_activations(x: torch.Tensor, weight_type: QT) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The activations x (M, K) float32 as the product with a `weight_type` weight sees them:
    (x_hat (M, K) float32, q8_1_sums). x_hat = d * codes per block (float, F16 or BF16 rounding
    for float weights). For Q8_1, q8_1_sums (M, K/32) is ggml's rounded block sum s minus
    d * sum(codes): the part of `min * s` that x_hat cannot carry, which GgmlLinear adds as a
    product with the weight's per-block mins."""
    kind = VEC_DOT_TYPE[weight_type]
    if kind == QT.F32:
        return x.float(), None
    if kind == QT.F16:
        return x.half().float(), None
    if kind == QT.BF16:
        return x.bfloat16().float(), None
    if kind == QT.Q8_0:
        codes, d = quantize_q8_0(x)
        return (codes * d.unsqueeze(-1)).reshape(x.shape), None
    if kind == QT.Q8_1:
        codes, d, s = quantize_q8_1(x)
        return (codes * d.unsqueeze(-1)).reshape(x.shape), s - d * codes.sum(-1)
    codes, d = quantize_q8_k(x)
    return (codes * d.unsqueeze(-1)).reshape(x.shape), None
