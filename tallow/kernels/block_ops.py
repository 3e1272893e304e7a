"""The ops between a block's matrix products: RMSNorm fused with the residual add before it,
the gated MLP activation, and a prefill chunk's attention over the KV pool.

Model files call them as `model.ops.add_norm(...)` / `model.ops.glu(...)` and never see which
kernels run. On the CPU (and on the GPU with TALLOW_TRITON_OPS=0) they are the torch forms of
layers.py, op for op what the block wrote before they existed. On the GPU each is one Triton
launch: decode there is latency-bound at ~2 µs per kernel, and the torch forms cost 2-3 kernels
each (add, norm; silu, mul), so over 30 layers they are a fifth of a small model's step.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..layers import c_norm, geglu, rms_norm, swiglu
from .. import switches


def triton_ops_enabled() -> bool:
    return switches.enabled("TALLOW_TRITON_OPS")


class TorchOps:
    """The reference forms, in torch."""

    fused_step = False  # True: the decode step also fuses Q/K norm + RoPE + the K/V write (step.py)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float):
        """The residual stream after adding `delta` (None: nothing to add) and its RMSNorm."""
        if delta is not None:
            c = c_norm(x, weight) if weight.dim() == 1 and delta.shape == x.shape else None
            if c is not None:  # the add and the norm in one C call, the same bits as below
                return c.rms_norm(x, weight, eps, delta)
            x = x + delta
        return x, rms_norm(x, weight, eps)

    def glu(self, gate_up: torch.Tensor, kind: str) -> torch.Tensor:
        """act(gate) * up for gate and up side by side in one (n, 2 * ffn) tensor."""
        f = gate_up.shape[-1] // 2
        return (swiglu if kind == "swiglu" else geglu)(gate_up[..., :f], gate_up[..., f:])

    def gated(self, gate: torch.Tensor, up: torch.Tensor, kind: str) -> torch.Tensor:
        """act(gate) * up for gate and up as two tensors of one shape."""
        return (swiglu if kind == "swiglu" else geglu)(gate, up)

    def norm_add(self, x: torch.Tensor, branch: torch.Tensor, weight: torch.Tensor, eps: float,
                 scale: torch.Tensor | None = None) -> torch.Tensor:
        """(x + rmsnorm(branch) * weight) * scale: a normed branch joining the stream."""
        y = x + rms_norm(branch, weight, eps)
        return y if scale is None else y * scale

    def norm_add_norm(self, x: torch.Tensor, branch: torch.Tensor, weight: torch.Tensor, next_weight: torch.Tensor,
                      eps: float, scale: torch.Tensor | None = None):
        """`norm_add`'s stream and that stream's RMSNorm times next_weight (gemma's post-attention
        norm, then its pre-MLP norm)."""
        x = self.norm_add(x, branch, weight, eps, scale)
        return x, rms_norm(x, next_weight, eps)

    def pool_attention(self, q, kv, layer: int, start: int, lo: int, window, scale: float, softcap):
        """Attention of a chunk q (n, n_heads, head_dim) at positions start.. over the pool's keys
        lo..start+n-1 in one kernel, or None: the caller's torch path (mask + SDPA) runs."""
        return None


def gemv_prologue_enabled() -> bool:
    return switches.enabled("TALLOW_GEMV_PROLOGUE")


class LazyInput:
    """A norm or GLU not yet run: the GEMV that consumes it applies it as it loads x
    (quant_gemv.Prologue), saving the op's own launch. Anything else calls `materialize()`,
    which runs the op's kernel once. A norm over x + residual also owes the new residual stream
    `sum_out`: exactly one consumer (the first GEMV, or `materialize`) writes it."""

    def __init__(self, x: torch.Tensor, prologue, run):
        self.x = x
        self.prologue = prologue
        self._run = run  # () -> the op's output, computed by its own kernel
        self._value = None
        self.q8 = None  # the GPU's integer-dot GEMVs: the op's output as Q8_1 blocks (gpu/linear.py q8_of)
        self.shape = (x.shape[0], x.shape[1] // 2 if prologue.kind != "norm" else x.shape[1])
        self.device = x.device

    def take(self):
        """The prologue for one GEMV: the first taker also writes the residual sum."""
        pro = self.prologue
        self.prologue = replace(pro, sum_out=None)
        return pro

    def materialize(self) -> torch.Tensor:
        if self._value is None:
            self._value = self._run(self.take().sum_out is not None)
        return self._value


class TritonOps(TorchOps):
    """One Triton launch per op (kernels/triton/rmsnorm.py, glu.py); shapes the kernels do not
    take (a per-head norm weight, a non-contiguous row) fall back to torch. With `lazy`, decode
    rows of a small model (K <= LAZY_MAX_K) come back as `LazyInput`s for the GEMV to fold in:
    there every program re-reads x, cheap for K = 576 but not for K = 2560 (measured). With the
    integer-dot GEMVs on, rows of any K do: their Q8_1 quantization applies the op in a few
    programs (gpu/linear.py q8_of)."""

    fused_step = True
    LAZY_MAX_ROWS = 8
    LAZY_MAX_K = 2048

    def __init__(self, lazy: bool = False):
        self.lazy = lazy and gemv_prologue_enabled()

    def _lazy_ok(self, x: torch.Tensor, k: int) -> bool:
        # Past LAZY_MAX_K only for the integer-dot GEMVs, whose Q8_1 quantization applies the op
        # in a few programs (gpu/linear.py q8_of); an fp32 GEMV then runs it as its own kernel.
        wide_ok = k <= self.LAZY_MAX_K or (switches.enabled("TALLOW_Q8_PROLOGUE") and switches.enabled("TALLOW_GEMV_MMVQ"))
        return self.lazy and x.shape[0] <= self.LAZY_MAX_ROWS and wide_ok

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
        if self._lazy_ok(x, x.shape[1]):
            from .triton.quant_gemv import Prologue

            def run(write_sum: bool) -> torch.Tensor:
                return rmsnorm(delta, weight, eps, residual=x, sum_out=total if write_sum else None)

            return total, LazyInput(delta, Prologue("norm", weight, eps, x, total), run)
        return total, rmsnorm(delta, weight, eps, residual=x, sum_out=total)

    def glu(self, gate_up, kind):
        if gate_up.dim() != 2 or gate_up.stride(-1) != 1 or gate_up.dtype != torch.float32:
            return super().glu(gate_up, kind)
        from .triton.glu import glu

        f = gate_up.shape[-1] // 2
        if self._lazy_ok(gate_up, f):
            from .triton.quant_gemv import Prologue

            return LazyInput(gate_up, Prologue(kind), lambda _: glu(gate_up[:, :f], gate_up[:, f:], kind))
        return glu(gate_up[:, :f], gate_up[:, f:], kind)

    def gated(self, gate, up, kind):
        if not (self._rows(gate) and self._rows(up)) or gate.shape != up.shape:
            return super().gated(gate, up, kind)
        from .triton.glu import glu

        return glu(gate, up, kind)

    def norm_add(self, x, branch, weight, eps, scale=None):
        if weight.dim() != 1 or not (self._rows(x) and self._rows(branch)):
            return super().norm_add(x, branch, weight, eps, scale)
        from .triton.rmsnorm import rmsnorm_add

        return rmsnorm_add(branch, weight, eps, x, scale)

    def norm_add_norm(self, x, branch, weight, next_weight, eps, scale=None):
        if weight.dim() != 1 or next_weight.dim() != 1 or not (self._rows(x) and self._rows(branch)):
            return super().norm_add_norm(x, branch, weight, next_weight, eps, scale)
        from .triton.rmsnorm import rmsnorm_add

        return rmsnorm_add(branch, weight, eps, x, scale, next_weight=next_weight)

    def pool_attention(self, q, kv, layer, start, lo, window, scale, softcap):
        from .triton.prefill_attention import prefill_attention, prefill_attention_enabled

        k, v = kv.k[layer], kv.v[layer]
        if not prefill_attention_enabled() or k.shape[-1] != v.shape[-1] or q.stride(-1) != 1:
            return None
        scales = (kv.k_scale[layer], kv.v_scale[layer]) if kv.scaled else (None, None)
        return prefill_attention(q, k, v, start, lo, scale, window, softcap, *scales)


def block_ops(on_gpu: bool) -> TorchOps:
    return TritonOps(lazy=True) if on_gpu and triton_ops_enabled() else TorchOps()
