"""A model's decode step bound to a position held on the device, for CUDA graphs.

Family files write one `block` in terms of three hooks — `rope[base].apply_at(x, start)`,
`kv.store(layer, start, k, v)` and `attend(layer, q, kv, start)` — and eager forward passes
give them a Python `start`. A captured graph cannot depend on a Python int, so here the
same hooks are bound to device tensors (position, seq_len) and `start` is ignored: RoPE
gathers its table rows at the position, K/V are written with index_copy_, and attention is
the Triton split-K decode kernel reading seq_len on the device (torch on the CPU, where the
tables and lengths are only exercised by tests).
"""

from __future__ import annotations

import copy

import torch

from ..layers import RotaryTables, decode_attention
from ..memory.kv_pool import KVPool


class _BoundRotary:
    def __init__(self, table: RotaryTables, position: torch.Tensor):
        self.table = table
        self.position = position

    def apply_at(self, x: torch.Tensor, start: int) -> torch.Tensor:
        cos = self.table.cos_full.index_select(0, self.position)  # (1, 1, rope_dim)
        sin = self.table.sin_signed.index_select(0, self.position)
        return self.table.rotate(x, cos, sin)


class _BoundKV:
    """The KV pool with `store` writing at the bound device position."""

    def __init__(self, kv: KVPool, position: torch.Tensor):
        self.kv = kv
        self.position = position
        self.k, self.v = kv.k, kv.v

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv.store_at(layer, self.position, k, v)


class _BoundAttention:
    """Attention of the one query over seq_len cached keys, with static scratch per layer."""

    def __init__(self, model, seq_len: torch.Tensor):
        self.model = model
        self.seq_len = seq_len
        if not hasattr(model, "_step_scratch"):
            model._step_scratch = {}

    def __call__(self, index: int, q: torch.Tensor, kv, start: int) -> torch.Tensor:
        spec, layer = self.model.spec, self.model.spec.layers[index]
        k_cache, v_cache = kv.k[index], kv.v[index]
        if q.is_cuda and spec.attn_logit_softcap is None:
            from ..kernels.triton.decode_attention import decode_attention as triton_decode_attention
            from ..kernels.triton.decode_attention import default_splits, make_scratch

            n_heads = q.shape[1]
            scratch = self.model._step_scratch.get(index)
            if scratch is None:
                splits = default_splits(k_cache.shape[0], k_cache.shape[1])
                out = torch.empty((n_heads, spec.v_head_dim), dtype=torch.float32, device=q.device)
                scratch = (splits, out, make_scratch(n_heads, splits, spec.head_dim, q.device))
                self.model._step_scratch[index] = scratch
            splits, out, buffers = scratch
            triton_decode_attention(q[0].contiguous(), k_cache, v_cache, self.seq_len, spec.attn_scale,
                                    layer.sliding_window or 0, n_splits=splits, out=out, scratch=buffers)
            return out.reshape(1, -1)
        # CPU (tests) or soft-capped attention: the torch kernel, at a host-known length.
        end = int(self.seq_len.item())
        return decode_attention(q, k_cache, v_cache, end, spec.attn_scale, layer.sliding_window, spec.attn_logit_softcap)


def bind_step(model, position: torch.Tensor, seq_len: torch.Tensor, kv: KVPool):
    """A shallow copy of `model` (weights shared) whose hooks use the device position."""
    step = copy.copy(model)
    step.rope = {base: _BoundRotary(table, position) for base, table in model.rope.items()}
    step.attend = _BoundAttention(model, seq_len)
    return step, _BoundKV(kv, position)
