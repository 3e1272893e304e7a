"""Device-free building blocks of a transformer forward pass: norms, RoPE, attention, MLPs.

These are plain torch functions over float32 activations; the matrix products with
quantized weights live in `kernels/` and are passed in as callables, so nothing here knows
how a weight is stored or which device runs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: x / sqrt(mean(x²) + eps) * weight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class RotaryTables:
    """Precomputed cos/sin for one RoPE base, grown on demand up to the context length."""

    def __init__(self, rope_dim: int, base: float, style: str, position_scale: float = 1.0):
        if style not in ("norm", "neox"):
            raise ValueError(f"unknown RoPE style {style!r}")
        self.rope_dim = rope_dim
        self.base = base
        self.style = style
        self.position_scale = position_scale
        self.cos = torch.empty(0, rope_dim // 2)
        self.sin = torch.empty(0, rope_dim // 2)

    def ensure(self, n_positions: int) -> None:
        if n_positions <= self.cos.shape[0]:
            return
        n = max(n_positions, 2 * self.cos.shape[0], 256)
        # float64 for the angle so large positions keep their precision, then float32 tables.
        inv_freq = self.base ** (-torch.arange(0, self.rope_dim, 2, dtype=torch.float64) / self.rope_dim)
        pos = torch.arange(n, dtype=torch.float64) / self.position_scale
        angles = torch.outer(pos, inv_freq)  # (n, rope_dim/2)
        self.cos = angles.cos().float()
        self.sin = angles.sin().float()

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x (n_tokens, n_heads, head_dim) at the given absolute positions (n_tokens,)."""
        cos = self.cos[positions].unsqueeze(1)  # (n_tokens, 1, rope_dim/2)
        sin = self.sin[positions].unsqueeze(1)
        rot, rest = x[..., : self.rope_dim], x[..., self.rope_dim :]
        if self.style == "neox":
            x1, x2 = rot.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        if rest.shape[-1]:
            out = torch.cat((out, rest), dim=-1)
        return out


def attention_mask(q_positions: torch.Tensor, n_keys: int, window: int | None) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask, True where a query may see a key.

    Keys sit at absolute positions 0..n_keys-1. Causal, and with a sliding window a query
    at p sees keys k with p - k < window (llama.cpp's standard SWA rule).
    """
    k_pos = torch.arange(n_keys)
    diff = q_positions.unsqueeze(1) - k_pos.unsqueeze(0)  # (n_queries, n_keys)
    visible = diff >= 0
    if window is not None:
        visible &= diff < window
    return visible


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """Grouped-query attention.

    q: (n_heads, n_queries, head_dim); k: (n_kv_heads, n_keys, head_dim);
    v: (n_kv_heads, n_keys, v_head_dim); mask: (n_queries, n_keys) bool or None (all visible).
    Returns (n_queries, n_heads * v_head_dim).
    """
    n_heads, n_q, _ = q.shape
    if softcap is None:
        out = F.scaled_dot_product_attention(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=scale, enable_gqa=True
        )[0]  # (n_heads, n_queries, v_head_dim)
    else:
        group = n_heads // k.shape[0]
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        scores = torch.matmul(q, k.transpose(1, 2)) * scale  # (n_heads, n_q, n_keys)
        scores = softcap * torch.tanh(scores / softcap)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
    return out.transpose(0, 1).reshape(n_q, -1)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GELU(gate) * up with ggml's CPU GELU: the tanh approximation read from an fp16 table.

    ggml rounds the input to fp16 and returns the fp16 value of gelu_tanh there; doing the
    same keeps gemma's logits within 1e-4 of llama.cpp on F32 weights instead of 3e-3.
    (Beyond |x| >= 10 ggml returns x or 0, which gelu_tanh already equals in fp16.)
    """
    g = F.gelu(gate.half().float(), approximate="tanh").half().float()
    return g * up


def softcap_logits(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    if cap is None:
        return logits
    return cap * torch.tanh(logits / cap)
