"""ggml's arithmetic for the elementwise parts of a forward pass (TALLOW_NUMERICS=ggml).

llama.cpp's CPU backend rounds in places tallow's default path does not, and where the
fixtures' configuration (llama-cpp-python 0.3.36 defaults: flash attention off, f16 K/V)
puts them, they decide greedy near-ties. This module holds the device-free emulations; the
quantized products live in kernels/cpu/ggml_linear.py. What each function mirrors (ggml
b11434, ggml-cpu/ops.cpp and the non-flash path of llama-graph.cpp's build_attn_mha):

- RMSNorm: the sum of squares in double, mean and 1/sqrt in float, then x * scale * weight.
- RoPE: theta computed by the float32 recurrence theta *= base^(-2/n_dims) starting at the
  position, then cosf/sinf (ggml_rope_cache_init), not from a float64 angle.
- Attention with flash attention off: K and V read from the f16 cache; Q rounded to f16 (the
  F16 weight's vec_dot_type) before Q.K^T, accumulated in float; softmax in float with its
  sum in double; the softmax weights rounded to f16 before the product with V.

The switch is read at call time except where a table is built (RotaryTables, linears).
"""

from __future__ import annotations


import numpy as np
import torch

from . import switches

MODES = ("default", "ggml")


def numerics_mode() -> str:
    """TALLOW_NUMERICS: "ggml" for llama.cpp's CPU arithmetic, anything else the default path."""
    return "ggml" if str(switches.value("TALLOW_NUMERICS") or "").strip().lower() == "ggml" else "default"


def ggml_enabled() -> bool:
    return numerics_mode() == "ggml"


def ggml_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """ggml_compute_forward_rms_norm_f32 followed by the weight's ggml_mul: float32 squares
    summed in double, mean rounded to float, scale = 1/sqrtf(mean + eps) in float."""
    mean = ((x * x).double().sum(-1, keepdim=True) / x.shape[-1]).float()
    scale = 1.0 / torch.sqrt(mean + torch.tensor(eps, dtype=torch.float32))
    y = x * scale
    return y * weight if weight is not None else y


def ggml_rope_angles(n_positions: int, rope_dim: int, base: float, freq_scale: float = 1.0) -> torch.Tensor:
    """Angles (n_positions, rope_dim/2) float32 as ggml_rope_cache_init makes them: theta
    starts at the position and is multiplied by theta_scale = powf(base, -2/n_dims) once per
    pair, in float32, so the error of the recurrence is llama.cpp's too."""
    theta_scale = np.float32(base) ** (np.float32(-2.0) / np.float32(rope_dim))  # powf
    theta = torch.arange(n_positions, dtype=torch.float32)
    step = torch.tensor(float(theta_scale), dtype=torch.float32)
    cols = []
    for _ in range(rope_dim // 2):
        cols.append(theta * freq_scale if freq_scale != 1.0 else theta)
        theta = theta * step
    return torch.stack(cols, dim=1)


def ggml_softmax(scores: torch.Tensor) -> torch.Tensor:
    """ggml_vec_soft_max_f32: exp(x - max) in float, the sum in double, then x * (float)(1/sum).
    Fully masked rows (all -inf) give zeros, as ggml's skipped rows do."""
    top = scores.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    e = torch.exp(scores - top)
    inv = (1.0 / e.double().sum(-1, keepdim=True)).float()
    return e * inv


def ggml_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                   softcap: float | None = None) -> torch.Tensor:
    """Grouped-query attention as llama.cpp computes it with flash attention off.

    q: (n_heads, n_q, head_dim) float32; k: (n_kv_heads, n_keys, head_dim), v: (n_kv_heads,
    n_keys, v_head_dim), values of the f16 cache (any float dtype); mask (n_q, n_keys) bool or
    None. Returns (n_q, n_heads * v_head_dim) float32.
    """
    n_heads, n_q, _ = q.shape
    group = n_heads // k.shape[0]
    qh = q.half().float()  # the F16 K's vec_dot_type rounds Q
    kh = k.half().float().repeat_interleave(group, dim=0)
    vh = v.half().float().repeat_interleave(group, dim=0)
    scores = torch.matmul(qh, kh.transpose(1, 2))  # (n_heads, n_q, n_keys), f16 products exact in f32
    if softcap is not None:  # build_attn_mha: scale by 1/cap, tanh, scale by cap, then soft_max's scale
        scores = softcap * torch.tanh(scores * (1.0 / softcap))
    scores = scores * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = ggml_softmax(scores).half().float()  # the F16 V's vec_dot_type rounds the weights
    out = torch.matmul(probs, vh)  # (n_heads, n_q, v_head_dim)
    return out.transpose(0, 1).reshape(n_q, -1)
