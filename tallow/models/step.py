"""A model's decode step bound to a position held on the device, for CUDA graphs.

Family files write one `block` in terms of hooks — `attention_inputs(w, qkv, kv, start)`
(itself `rope[base].apply_at(x, start)` and `kv.store(layer, start, k, v)`) and
`attend(layer, q, kv, start)` — and eager forward passes give them a Python `start`. A
captured graph cannot depend on a Python int, so here the same hooks are bound to device
tensors (position, seq_len) and `start` is ignored: RoPE gathers its table rows at the
position, K/V are written with index_copy_, and attention is the Triton split-K decode kernel
reading seq_len on the device (torch on the CPU, where the tables and lengths are only
exercised by tests). With the model's Triton ops (`ops.fused_step`), Q/K norm + RoPE + the
K and V writes are one launch per layer instead of about ten (kernels/triton/rope.py).
"""

from __future__ import annotations

import copy

import torch

from ..layers import RotaryTables, attend_keys, decode_attention
from ..memory.kv_pool import KVPool


class _BoundRotary:
    def __init__(self, table: RotaryTables, position: torch.Tensor):
        self.table = table
        self.position = position

    def apply_at(self, x: torch.Tensor, start: int) -> torch.Tensor:
        cos = self.table.cos_full.index_select(0, self.position)  # (n, 1, rope_dim)
        sin = self.table.sin_signed.index_select(0, self.position)
        return self.table.rotate(x, cos, sin)


class _BoundKV:
    """The KV pool with `store` writing at the bound device position."""

    def __init__(self, kv: KVPool, position: torch.Tensor):
        self.kv = kv
        self.position = position
        self.k, self.v = kv.k, kv.v
        self.k_scale, self.v_scale = kv.k_scale, kv.v_scale
        self.caps, self.dtype, self.scaled = kv.caps, kv.dtype, kv.scaled
        self.view = kv.view
        self._slots: dict[int, torch.Tensor] = {}  # ring size -> position % ring, once per step

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv.store_at(layer, self.position, k, v)

    def cache_rows(self, layer: int):
        """(k_cache, v_cache, slot) for a kernel that writes this step's K/V itself, or None when
        the layer stores codes with scales (int8/fp8: `store` quantizes). A ring's slot is
        position % ring, computed on the device once per step for each ring size."""
        k, v = self.kv.k[layer], self.kv.v[layer]
        if k.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.stride(-1) != 1 or v.stride(-1) != 1:
            return None
        cap = k.shape[1]
        if cap >= self.kv.n_ctx:
            return k, v, self.position
        if cap not in self._slots:
            self._slots[cap] = torch.remainder(self.position, cap)
        return k, v, self._slots[cap]


class _FusedAttentionInputs:
    """`attention_inputs` for decode tokens (one, or the consecutive rows of a verification pass)
    in one Triton launch per layer: per-head Q/K RMSNorm, RoPE at the device positions, K and V
    written into the cache rows; `fallback` (the model's own method with bound hooks, torch)
    where the launch does not apply."""

    def __init__(self, model, fallback, position: torch.Tensor):
        self.model = model
        self.position = position
        self.fallback = fallback

    def __call__(self, w, qkv: torch.Tensor, kv: _BoundKV, start: int) -> torch.Tensor:
        spec, layer = self.model.spec, self.model.spec.layers[w.index]
        nh, nkv, hd = layer.n_heads, layer.n_kv_heads, layer.head_dim
        rows = kv.cache_rows(w.index)
        if rows is None or layer.v_head_dim != hd or qkv.stride(-1) != 1:
            return self.fallback(w, qkv, kv, start)
        from ..kernels.triton.rope import rope

        k_cache, v_cache, slot = rows
        table = self.model.rope[layer.rope_key]
        n = qkv.shape[0]
        q = qkv[:, : nh * hd].view(n, nh, hd)
        k = qkv[:, nh * hd : (nh + nkv) * hd].view(n, nkv, hd)
        v = qkv[:, (nh + nkv) * hd :].view(n, nkv, hd)
        norms = w.get("attn_qk_norm")
        q_out, _ = rope(q, k, table.cos, table.sin, self.position, table.style, rot_dim=table.rope_dim,
                        k_cache=k_cache, v=v, v_cache=v_cache, eps=spec.norm_eps, slot=slot,
                        q_norm=None if norms is None else norms[0], k_norm=None if norms is None else norms[nh])
        return q_out  # (n, nh, hd)


def _kernel_attention(q: torch.Tensor) -> bool:
    """Whether decode attention runs the Triton split-K kernel: on the GPU. (A seam for tests,
    which run it on the CPU under Triton's interpreter.)"""
    return q.is_cuda


class _BoundAttention:
    """Attention of the decode queries (one, or the consecutive rows of a verification pass:
    row i over seq_len + i keys) with static scratch; `fallback` runs several rows one by one
    where the Triton kernel does not apply.

    The scratch (partial outputs, the output) is shared by all layers of one shape: on one
    stream a layer's merge and output projection finish before the next layer's attention
    writes them again. Per layer it would cost layers x row counts x (heads x splits x head_dim)
    floats: 1.3 GB for a qwen3-4b-sized model at a 4096-token context with passes of 1..8 rows."""

    def __init__(self, model, seq_len: torch.Tensor, fallback=None):
        self.model = model
        self.seq_len = seq_len
        self.fallback = fallback
        if not hasattr(model, "_step_scratch"):
            model._step_scratch = {}

    def __call__(self, index: int, q: torch.Tensor, kv, start: int) -> torch.Tensor:
        spec, layer = self.model.spec, self.model.spec.layers[index]
        k_cache, v_cache = kv.k[index], kv.v[index]
        n = q.shape[0]
        if _kernel_attention(q) and spec.attn_logit_softcap is None:
            from ..kernels.triton.decode_attention import decode_attention as triton_decode_attention
            from ..kernels.triton.decode_attention import default_splits, make_scratch

            n_heads = q.shape[1]
            splits = default_splits(k_cache.shape[0], k_cache.shape[1])
            key = (n, n_heads, splits, layer.head_dim, layer.v_head_dim)  # gemma4: a head size per layer type
            scratch = self.model._step_scratch.get(key)
            if scratch is None:
                out = torch.empty((n, n_heads, layer.v_head_dim), dtype=torch.float32, device=q.device)
                scratch = self.model._step_scratch[key] = (out, make_scratch(n * n_heads, splits, layer.head_dim, q.device))
            out, buffers = scratch
            # A ring layer is read at slot = position % ring inside the kernel; int8/fp8 codes
            # are read with their per-position scales.
            triton_decode_attention(q.contiguous(), k_cache, v_cache, self.seq_len, spec.attn_scale,
                                    layer.sliding_window or 0, n_splits=splits, out=out, scratch=buffers,
                                    k_scale=kv.k_scale[index] if kv.scaled else None,
                                    v_scale=kv.v_scale[index] if kv.scaled else None)
            return out.reshape(n, -1)
        if n > 1:
            return self.fallback(index, q, kv, start)
        # CPU (tests) or soft-capped attention: the torch kernel, at a host-known length.
        end = int(self.seq_len.item())
        if kv.dtype in (torch.float16, torch.bfloat16, torch.float32) and kv.caps[index] == kv.kv.n_ctx:
            return decode_attention(q, k_cache, v_cache, end, spec.attn_scale, layer.sliding_window, spec.attn_logit_softcap)
        begin = max(0, end - layer.sliding_window) if layer.sliding_window else 0
        keys, values = kv.view(index, begin, end)
        return attend_keys(q, keys, values, spec.attn_scale, spec.attn_logit_softcap)


class _BoundChunkAttention:
    """Attention of a prefill chunk whose first position `start` (1,) is on the device: the
    Triton flash kernel reads it there; the torch path (CPU tests) reads it back."""

    def __init__(self, model, start: torch.Tensor):
        self.model = model
        self.start = start

    def __call__(self, index: int, q: torch.Tensor, kv, start: int) -> torch.Tensor:
        spec, layer = self.model.spec, self.model.spec.layers[index]
        out = self.model.ops.pool_attention(q, kv.kv, index, self.start, 0, layer.sliding_window, spec.attn_scale,
                                            spec.attn_logit_softcap)
        if out is not None:
            return out
        return type(self.model).attend(self.model, index, q, kv.kv, int(self.start.item()))


def bind_chunk(model, positions: torch.Tensor, start: torch.Tensor, kv: KVPool):
    """`bind_step` for a prefill chunk of len(positions) tokens at positions start.. (device
    tensors): RoPE gathers its rows at `positions`, K/V are written there, and attention is the
    flash kernel with `start` read on the device."""
    step = copy.copy(model)
    step.rope = {base: _BoundRotary(table, positions) for base, table in model.rope.items()}
    step.attend = _BoundChunkAttention(model, start)
    return step, _BoundKV(kv, positions)


def bind_step(model, position: torch.Tensor, seq_len: torch.Tensor, kv: KVPool):
    """A shallow copy of `model` (weights shared) whose hooks use the device position."""
    step = copy.copy(model)
    step.rope = {base: _BoundRotary(table, position) for base, table in model.rope.items()}
    step.attend = _BoundAttention(model, seq_len)
    if model.ops.fused_step and model.fused_attention_inputs:
        step.attention_inputs = _FusedAttentionInputs(model, type(model).attention_inputs.__get__(step), position)
    return step, _BoundKV(kv, position)


class _RowByRow:
    """`attention_inputs` and `attend` of m consecutive tokens, each row through the hooks of its
    own one-token step (bind_step at position + i): the exact fallback of a verification pass
    where the multi-row kernels do not apply (CPU, torch ops, quantized KV writes)."""

    def __init__(self, model, positions: torch.Tensor, seq_lens: torch.Tensor, kv: KVPool):
        self.rows = [bind_step(model, positions[i : i + 1], seq_lens[i : i + 1], kv) for i in range(positions.shape[0])]

    def attention_inputs(self, w, qkv: torch.Tensor, kv, start: int) -> torch.Tensor:
        return torch.cat([step.attention_inputs(w, qkv[i : i + 1], row_kv, 0)
                          for i, (step, row_kv) in enumerate(self.rows)])

    def attend(self, index: int, q: torch.Tensor, kv, start: int) -> torch.Tensor:
        # .clone(): a row's output may live in the layer's static scratch, reused by the next row
        return torch.cat([step.attend(index, q[i : i + 1], row_kv, 0).clone() for i, (step, row_kv) in enumerate(self.rows)])


def bind_rows(model, positions: torch.Tensor, seq_lens: torch.Tensor, kv: KVPool):
    """`bind_step` for m consecutive decode tokens at `positions` (m,) with `seq_lens` (m,) =
    positions + 1, on the device. Everything in a block but attention (GEMVs, norms, GLU)
    computes each row on its own already; attention runs through the same kernels as the
    one-token step, launched once for all rows (row i at position + i), or row by row where
    they do not apply. So the m rows are bit for bit what m decode steps compute."""
    rows = _RowByRow(model, positions, seq_lens, kv)
    step = copy.copy(model)
    step.attend = _BoundAttention(model, seq_lens[:1], fallback=rows.attend)
    step.attention_inputs = rows.attention_inputs
    if model.ops.fused_step and model.fused_attention_inputs:
        step.attention_inputs = _FusedAttentionInputs(model, rows.attention_inputs, positions)
    return step, _BoundKV(kv, positions)
