"""The ops between a block's matrix products: RMSNorm fused with the residual add before it,
the gated MLP activation, and a prefill chunk's attention over the KV pool.

Model files call them as `model.ops.add_norm(...)` / `model.ops.glu(...)` and never see which
kernels run. On the CPU (and on the GPU with TALLOW_TRITON_OPS=0) they are the torch forms of
layers.py, op for op what the block wrote before they existed. On the GPU each is one Triton
launch: decode there is latency-bound at ~2 µs per kernel, and the torch forms cost 2-3 kernels
each (add, norm; silu, mul), so over 30 layers they are a fifth of a small model's step.
"""

from __future__ import annotations

import os

import torch

from ..layers import geglu, rms_norm, swiglu


def triton_ops_enabled() -> bool:
    return os.environ.get("TALLOW_TRITON_OPS", "1") != "0"


class TorchOps:
    """The reference forms, in torch."""

    fused_step = False  # True: the decode step also fuses Q/K norm + RoPE + the K/V write (step.py)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float):
        """The residual stream after adding `delta` (None: nothing to add) and its RMSNorm."""
        if delta is not None:
            x = x + delta
        return x, rms_norm(x, weight, eps)

    def glu(self, gate_up: torch.Tensor, kind: str) -> torch.Tensor:
        """act(gate) * up for gate and up side by side in one (n, 2 * ffn) tensor."""
        f = gate_up.shape[-1] // 2
        return (swiglu if kind == "swiglu" else geglu)(gate_up[..., :f], gate_up[..., f:])

    def pool_attention(self, q, kv, layer: int, start: int, lo: int, window, scale: float, softcap):
        """Attention of a chunk q (n, n_heads, head_dim) at positions start.. over the pool's keys
        lo..start+n-1 in one kernel, or None: the caller's torch path (mask + SDPA) runs."""
        return None


class TritonOps(TorchOps):
    """One Triton launch per op (kernels/triton/rmsnorm.py, glu.py); shapes the kernels do not
    take (a per-head norm weight, a non-contiguous row) fall back to torch."""

    fused_step = True

    @staticmethod
    def _rows(x: torch.Tensor) -> bool:
        return x.dim() == 2 and x.stride(-1) == 1 and x.dtype == torch.float32

    def norm(self, x, weight, eps):
        if weight.dim() != 1 or not self._rows(x):
            return super().norm(x, weight, eps)
        from .triton.rmsnorm import rmsnorm

        return rmsnorm(x, weight, eps)

    def add_norm(self, x, delta, weight, eps):
        if delta is None:
            return x, self.norm(x, weight, eps)
        if weight.dim() != 1 or not (self._rows(x) and self._rows(delta)):
            return super().add_norm(x, delta, weight, eps)
        from .triton.rmsnorm import rmsnorm

        total = torch.empty_like(x)
        return total, rmsnorm(delta, weight, eps, residual=x, sum_out=total)

    def glu(self, gate_up, kind):
        if gate_up.dim() != 2 or gate_up.stride(-1) != 1 or gate_up.dtype != torch.float32:
            return super().glu(gate_up, kind)
        from .triton.glu import glu

        f = gate_up.shape[-1] // 2
        return glu(gate_up[:, :f], gate_up[:, f:], kind)

    def pool_attention(self, q, kv, layer, start, lo, window, scale, softcap):
        from .triton.prefill_attention import prefill_attention, prefill_attention_enabled

        k, v = kv.k[layer], kv.v[layer]
        if not prefill_attention_enabled() or k.shape[-1] != v.shape[-1] or q.stride(-1) != 1:
            return None
        scales = (kv.k_scale[layer], kv.v_scale[layer]) if getattr(kv, "scaled", False) else (None, None)
        return prefill_attention(q, k, v, start, lo, scale, window, softcap, *scales)


def block_ops(on_gpu: bool) -> TorchOps:
    return TritonOps() if on_gpu and triton_ops_enabled() else TorchOps()
