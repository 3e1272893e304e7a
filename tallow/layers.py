"""Device-free building blocks of a transformer forward pass: norms, RoPE, attention, MLPs.

These are plain torch functions over float32 activations; the matrix products with
quantized weights live in `kernels/` and are passed in as callables, so nothing here knows
how a weight is stored or which device runs it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import switches
from .numerics_mode import ggml_enabled
from .numerics import ggml_rms_norm, ggml_rope_angles, ggml_rope_cos_sin, ggml_geglu, ggml_rope_rotate, ggml_swiglu


def fast_paths_enabled() -> bool:
    """TALLOW_FAST_LAYERS=0 turns off the fused elementwise paths below (one-call RMSNorm, the
    table-driven RoPE, the single-query attention), falling back to the step-by-step forms.
    Consulted at call time (a dict lookup: tallow/switches.py parses the environment once)."""
    return switches.enabled("TALLOW_FAST_LAYERS")


# SDPA's CPU flash kernel walks the keys in blocks of 512 (its kvSplitSize) and the queries in
# blocks of 32 (under 192 queries) or 64 (under 768), and a block cut short rounds differently
# (measured: a last block of 2 queries): prefill attention pads its keys to whole blocks at
# absolute positions and its queries to a multiple of 64 (models/step.EagerAttention).
KEY_BLOCK = 512
QUERY_BLOCK = 64


def block_aligned_keys_enabled() -> bool:
    """TALLOW_ALIGNED_REUSE=0 also turns off the key padding that makes prefill attention
    row-invariant (engine/prefill_plan.py). Consulted at call time."""
    return switches.enabled("TALLOW_ALIGNED_REUSE")


def _ops():
    """kernels/cpu/ggml_ops, imported at the first call (it loads the C library)."""
    global _ggml_ops
    if _ggml_ops is None:
        from .kernels.cpu import ggml_ops as _ggml_ops
    return _ggml_ops


_ggml_ops = None


def ggml_c_ops(x: torch.Tensor):
    """kernels/cpu/ggml_ops (TALLOW_NUMERICS=ggml's elementwise ops in C, the emulations' bits) when
    TALLOW_GGML_C_OPS is on, the library is built and x is on the CPU; else None (the emulations run)."""
    return _ops() if x.device.type == "cpu" and _ops().usable() else None


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: x / sqrt(mean(x²) + eps) * weight, op by op."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def c_norm(x: torch.Tensor, weight: torch.Tensor | None):
    """kernels/cpu/ggml_ops when its RMSNorm (ggml's arithmetic, one C call) takes these rows:
    TALLOW_CPU_C_NORM (default on), the library built, CPU fp32; not under TALLOW_FAST_LAYERS=0
    (the op-by-op reference). Else None."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or not switches.enabled("TALLOW_CPU_C_NORM"):
        return None
    if not fast_paths_enabled():
        return None
    ops = _ops()
    return ops if ops.built() and ops.norm_fits(x, weight) else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: x / sqrt(mean(x²) + eps) * weight.

    On the CPU one C call in ggml's arithmetic where the library is built (`c_norm`); else under
    TALLOW_NUMERICS=ggml its emulation, else one aten call instead of five, bit-identical to
    `rms_norm_reference` on float32 (tests/test_cpu_fastpaths.py).
    """
    c = c_norm(x, weight)
    if c is not None:  # ggml's arithmetic in one C call (kernels/cpu/ggml_ops.c), in both modes
        return c.rms_norm(x, weight, eps)
    if ggml_enabled():  # TALLOW_NUMERICS=ggml: ggml's double sum and float scale (numerics.py)
        return ggml_rms_norm(x, weight, eps)
    if fast_paths_enabled() and x.dtype == torch.float32:
        if weight.dim() == 1:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        # A per-head weight (heads, head_dim) broadcast over tokens: normalize, then scale.
        return F.rms_norm(x, (x.shape[-1],), None, eps) * weight
    return rms_norm_reference(x, weight, eps)


class RotaryTables:
    """Precomputed cos/sin for one RoPE base, grown on demand up to the context length."""

    def __init__(self, rope_dim: int, base: float, style: str, position_scale: float = 1.0,
                 freq_factors: "tuple[float, ...] | None" = None):
        if style not in ("norm", "neox"):
            raise ValueError(f"unknown RoPE style {style!r}")
        self.rope_dim = rope_dim
        self.base = base
        # ggml's rope freq_factors: pair i turns at frequency inv_freq[i] / freq_factors[i].
        self.freq_factors = None if freq_factors is None else torch.tensor(freq_factors[: rope_dim // 2], dtype=torch.float64)
        self.style = style
        self.position_scale = position_scale
        self.ggml = ggml_enabled()  # TALLOW_NUMERICS=ggml: angles by ggml's float32 recurrence
        self.cos = torch.empty(0, rope_dim // 2)
        self.sin = torch.empty(0, rope_dim // 2)

    def to(self, device: torch.device) -> None:
        """Keep the tables on `device` (grow them first: `ensure` rebuilds on the CPU)."""
        for name in ("cos", "sin", "cos_full", "sin_signed"):
            setattr(self, name, getattr(self, name).to(device))

    def ensure(self, n_positions: int) -> None:
        if n_positions <= self.cos.shape[0]:
            return
        n = max(n_positions, 2 * self.cos.shape[0], 256)
        if self.ggml:
            angles = ggml_rope_angles(n, self.rope_dim, self.base)  # float32
            if self.freq_factors is not None:  # ggml divides each pair's float32 angle by its factor
                angles = angles / self.freq_factors.float()
            if self.position_scale != 1.0:  # then rope_yarn's freq_scale * theta
                angles = angles * (1.0 / self.position_scale)
            self.cos, self.sin = ggml_rope_cos_sin(angles)  # libm's cosf/sinf, as ggml calls them
        else:
            # float64 for the angle so large positions keep their precision, then float32 tables.
            inv_freq = self.base ** (-torch.arange(0, self.rope_dim, 2, dtype=torch.float64) / self.rope_dim)
            if self.freq_factors is not None:
                inv_freq = inv_freq / self.freq_factors
            pos = torch.arange(n, dtype=torch.float64) / self.position_scale
            angles = torch.outer(pos, inv_freq)  # (n, rope_dim/2)
            self.cos = angles.cos().float()
            self.sin = angles.sin().float()
        # Full-width tables for `apply_at`: out = x * cos_full + swap(x) * sin_signed, where swap
        # exchanges the two members of each rotated pair. (n, 1, rope_dim), broadcast over heads.
        if self.style == "neox":
            cos_full = torch.cat((self.cos, self.cos), dim=-1)
            sin_signed = torch.cat((-self.sin, self.sin), dim=-1)
        else:
            cos_full = torch.stack((self.cos, self.cos), dim=-1).flatten(-2)
            sin_signed = torch.stack((-self.sin, self.sin), dim=-1).flatten(-2)
        self.cos_full = cos_full.unsqueeze(1).contiguous()
        self.sin_signed = sin_signed.unsqueeze(1).contiguous()

    def apply_at(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Rotate x (n_tokens, n_heads, head_dim) at the consecutive positions start..start+n-1.

        Same rotation as `apply`, bit for bit, in four kernels (a swap, two multiplies, an add)
        instead of a dozen; the tables are sliced, not gathered. x may be a strided view (e.g. Q and K heads
        side by side in a fused projection's output). Returns a new contiguous tensor.
        """
        if not fast_paths_enabled() and not self.ggml:
            return self.apply(x, torch.arange(start, start + x.shape[0]))
        n = x.shape[0]
        return self.rotate(x, self.cos_full[start : start + n], self.sin_signed[start : start + n])

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The rotation of `apply_at` with the tables' rows already taken: cos, sin (n, 1, rope_dim).
        A CUDA-graph step gathers them at a position held on the device."""
        n, heads, head_dim = x.shape
        rd = self.rope_dim
        if self.ggml:
            c = ggml_c_ops(x)
            if c is not None:  # TALLOW_NUMERICS=ggml in one C call (the rest of each head copied)
                return c.rope(x, cos, sin, rd, self.style == "neox")
        rot = x if rd == head_dim else x[..., :rd]
        if self.style == "neox":
            swapped = rot.unflatten(-1, (2, rd // 2)).flip(-2).reshape(n, heads, rd)
        else:
            swapped = rot.unflatten(-1, (rd // 2, 2)).flip(-1).reshape(n, heads, rd)
        if self.ggml:  # TALLOW_NUMERICS=ggml: ggml's rotate_pairs with its fused multiply-adds
            second = torch.arange(rd, device=x.device)
            second = second >= rd // 2 if self.style == "neox" else second % 2 == 1
            out = ggml_rope_rotate(rot, swapped, cos, sin, second)
        else:
            # Not addcmul: its fused multiply-add rounds differently from `apply`; mul + mul + add is
            # bit-identical to it (a - b*s == a + b*(-s) exactly), for one extra kernel.
            out = rot * cos + swapped * sin
        if rd != head_dim:
            out = torch.cat((out, x[..., rd:]), dim=-1)
        return out

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


def attention_mask(q_positions: torch.Tensor, n_keys: int, window: int | None, key_start: int = 0) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask, True where a query may see a key.

    Keys sit at absolute positions key_start..key_start+n_keys-1 (a ring buffer's view starts
    at its window's edge). Causal, and with a sliding window a query at p sees keys k with
    p - k < window (llama.cpp's standard SWA rule).
    """
    k_pos = torch.arange(key_start, key_start + n_keys, device=q_positions.device).unsqueeze(0)
    q_pos = q_positions.unsqueeze(1)
    visible = k_pos <= q_pos  # compared straight into bools: no (n_queries, n_keys) int64 distances
    if window is not None:
        visible &= k_pos > q_pos - window
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


def c_attention_enabled() -> bool:
    """TALLOW_CPU_C_ATTENTION (default on) and the C library built: CPU decode attention over an
    f16 cache in C (kernels/cpu/c_attention.py)."""
    if not switches.enabled("TALLOW_CPU_C_ATTENTION"):
        return False
    from .kernels.cpu import c_attention

    return c_attention.usable()


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    end: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    ring: bool = False,
) -> torch.Tensor:
    """Attention of one query token over cached keys 0..end-1 (the decode step).

    q: (1, n_heads, head_dim) float32 (any strides); k_cache/v_cache: a layer of the KV pool,
    (n_kv_heads, n_ctx, head_dim) in its storage dtype. With a sliding window only the last
    `window` keys are read, so no mask is built: the one query sits at position end-1 and sees
    every key it is given. Without a softcap this is `attention`'s SDPA call on the sliced keys;
    with one, grouped heads are batched per KV head (query head h uses KV head h // group, as
    repeat_interleave in `attention`), so K/V are never repeated.
    An f16 cache on the CPU goes to the C kernel where it is built (c_attention_enabled); only the C
    kernel reads a sliding-window layer's ring (`ring`: position p in row p % its length).
    Returns (1, n_heads * v_head_dim) float32.
    """
    begin = max(0, end - window) if window is not None else 0
    if k_cache.dtype == v_cache.dtype == torch.float16 and k_cache.device.type == "cpu" and c_attention_enabled():
        from .kernels.cpu import c_attention  # each K/V row read once in f16

        return c_attention.attend_f16(q, k_cache, v_cache, begin, end, scale, softcap, ring=ring)
    if ring:
        raise ValueError("decode_attention reads a ring only in the C kernel (an f16 cache on the CPU).")
    k = k_cache[:, begin:end].float()  # (n_kv_heads, n_keys, head_dim); a copy from fp16
    v = v_cache[:, begin:end].float()
    return attend_keys(q, k, v, scale, softcap)


def attend_keys(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float | None = None) -> torch.Tensor:
    """`decode_attention` over keys already taken from the pool: the one query sees every key
    given. k, v: (n_kv_heads, n_keys, dim) float32 (a KVPool.view of the window)."""
    if softcap is None:
        # The same SDPA call `attention` makes for one query (no mask: every given key is
        # visible), so decode stays bit-identical to the step-by-step path.
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), scale=scale, enable_gqa=True
        )[0]  # (n_heads, 1, v_head_dim)
        return out.transpose(0, 1).reshape(1, -1)
    n_kv = k.shape[0]
    n_heads, head_dim = q.shape[1], q.shape[2]
    qg = q.reshape(n_kv, n_heads // n_kv, head_dim)  # (n_kv_heads, group, head_dim)
    scores = torch.matmul(qg, k.transpose(1, 2))  # (n_kv_heads, group, n_keys)
    probs = torch.softmax(softcap * torch.tanh(scores * scale / softcap), dim=-1)
    return torch.matmul(probs, v).reshape(1, -1)  # (1, n_heads * v_head_dim)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if ggml_enabled():  # TALLOW_NUMERICS=ggml: ggml's own SIMD exponential (numerics.ggml_v_expf)
        c = ggml_c_ops(gate)
        return c.swiglu(gate, up) if c is not None else ggml_swiglu(gate, up)
    return F.silu(gate) * up


def ggml_table_geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """ggml's CPU GeGLU (numerics.ggml_geglu: GELU read from its fp16 table, built as ggml builds it) in
    one C call where kernels/cpu/ggml_ops is usable, else the torch emulation: the same bits."""
    c = ggml_c_ops(gate)
    return c.geglu(gate, up) if c is not None else ggml_geglu(gate, up)


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """GELU(gate) * up with ggml's CPU GELU: the tanh approximation read from an fp16 table.

    ggml rounds the input to fp16 and returns the fp16 value of gelu_tanh there; doing the
    same keeps gemma's logits within 1e-4 of llama.cpp on F32 weights instead of 3e-3.
    (Beyond |x| >= 10 ggml returns x or 0, which gelu_tanh already equals in fp16.)
    """
    if ggml_enabled():  # TALLOW_NUMERICS=ggml: ggml's own table, built with libm's tanhf
        return ggml_table_geglu(gate, up)
    if fast_paths_enabled():
        # torch's fp16 GELU computes in fp32 and rounds once: bit-identical to the line below
        # for every finite fp16 input (tests/test_cpu_fastpaths.py), in 3 kernels instead of 6.
        return F.gelu(gate.half(), approximate="tanh") * up  # half * float32 -> float32
    g = F.gelu(gate.half().float(), approximate="tanh").half().float()
    return g * up


def softcap_logits(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    if cap is None:
        return logits
    return cap * torch.tanh(logits / cap)
