"""The one forward pass's description (`Step`) and the attention backends that run it.

`DecoderModel.run(step, kv)` is the only forward pass: eager prefill and decode, ring-sized
chunks, the hidden states of embeddings, the CUDA-graph decode step, the graph-captured prefill
chunk and speculative verification all build a Step and call it. A Step says which tokens run
where: their ids and positions (tensors on the model's device); `start`, the first position, as
a host int (eager: RoPE tables and the pool are sliced there) or a device tensor (a captured
graph replays at any position); `seq_lens` (positions + 1, int32 on the device) for graph
decode and verification; the phase; and which rows' logits come back.

A family's block reaches attention through three hooks, all answered by `step.backend`:
`model.attention_inputs(w, qkv, kv, step)` (Q/K norm, RoPE and the K/V write: the family's
`attention_heads`, which calls `step.rotate` and `step.store`, or one fused launch) and
`model.attend(index, q, kv, step)`. The backend is chosen once per regime — (phase, whether
start is on the host) — from objects built with the model (`backends_for`):

- EagerAttention (prefill and decode, host start): RoPE and the pool sliced at start; the CPU
  torch paths (TALLOW_NUMERICS=ggml, the one-query fast path, rings and quantized pools, the
  block-aligned prefill), or the pool-reading flash kernel (ops.pool_attention) on the GPU.
- EagerRowsAttention (verify, host start: the CPU): the same, attention query by query as a
  decode step computes it, so each row is bit for bit a decode step.
- GraphChunkAttention (prefill, device start): RoPE gathered at the positions, K/V written
  with index_copy_, the flash kernel reading start on the device.
- GraphDecodeAttention (decode, device): the same RoPE and K/V writes, or Q/K norm + RoPE + the
  K/V write in one Triton launch (ops.fused_step); attention is the Triton split-K decode
  kernel reading seq_len on the device, its scratch shared by the layers of one shape.
- RowsAttention (verify, device): GraphDecodeAttention's kernels launched once for all rows
  (row i at position + i), or row by row through it where they do not apply, so the m rows
  are bit for bit what m decode steps compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..layers import (KEY_BLOCK, QUERY_BLOCK, RotaryTables, attend_keys, attention, attention_mask, ggml_c_ops,
                      block_aligned_keys_enabled, c_attention_enabled, decode_attention, fast_paths_enabled)
from ..memory.budget import attention_query_rows
from ..memory.kv_pool import KVPool
from ..numerics import ggml_attention
from ..numerics_mode import GGML

PREFILL, DECODE, VERIFY = "prefill", "decode", "verify"
ALL, LAST = "all", "last"  # Step.logits: every row's, the last row's (a tensor: those rows; None: hidden states)
_FLOAT_KV = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(eq=False)
class Step:
    """One forward pass: `ids` (n,) at `positions` (n,) = start.., on the model's device.

    start: the first position, a host int (eager) or a (1,) device tensor (graph-safe).
    seq_lens: (n,) int32 = positions + 1 on the device (decode and verify with device start).
    logits: ALL, LAST, a device tensor of row indices, or None for the final-norm hidden states.
    on_host: whether start is a host int. backend: filled in by DecoderModel.run from
    (phase, on_host); scratch: per-run values (a ring's slots, a verify pass's row steps)."""

    phase: str
    ids: torch.Tensor
    positions: torch.Tensor
    start: int | torch.Tensor
    seq_lens: torch.Tensor | None = None
    logits: str | torch.Tensor | None = LAST
    backend: "Backend | None" = field(default=None, repr=False)
    scratch: dict = field(default_factory=dict, repr=False)

    @classmethod
    def host(cls, tokens: list[int], start: int, device, phase: str | None = None, logits=LAST) -> "Step":
        """An eager step of `tokens` at positions start.. (phase: DECODE for one token, else PREFILL)."""
        n = len(tokens)
        return cls(phase or (DECODE if n == 1 else PREFILL), torch.tensor(tokens, dtype=torch.long, device=device),
                   torch.arange(start, start + n, device=device), start, logits=logits)

    def __post_init__(self):
        self.on_host = isinstance(self.start, int)

    def rotate(self, table: RotaryTables, x: torch.Tensor) -> torch.Tensor:
        """x (n, heads, head_dim) rotated at this step's positions: the tables sliced at a host
        start, else gathered on the device by the backend."""
        if self.on_host:
            return table.apply_at(x, self.start)
        return self.backend.rotate(table, x, self)

    def store(self, kv: KVPool, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v (n, n_kv_heads, dim) at this step's positions of `layer`: sliced at a host
        start, else written by the backend at the device positions."""
        if self.on_host:
            kv.store(layer, self.start, k, v)
        else:
            self.backend.store(kv, layer, k, v, self)


class Backend:
    """Attention for one regime (and, with device positions, RoPE and the K/V write)."""

    def __init__(self, model):
        self.model = model

    def inputs(self, w, qkv: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        return self.model.attention_heads(w, qkv, kv, step)

    def attend(self, index: int, q: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        raise NotImplementedError


class EagerAttention(Backend):
    def __init__(self, model):
        super().__init__(model)
        self.ggml = model.numerics == GGML and not model.place.on_gpu  # llama.cpp's numerics (numerics_choice.py)

    def attend(self, index: int, q: torch.Tensor, kv: KVPool, step: Step | None, start: int | None = None) -> torch.Tensor:
        """Attention of q (n, n_heads, head_dim) at positions start.. (default: step.start) over
        layer `index`'s cached keys 0..start+n-1 (this step's K/V already stored). Returns
        (n, n_heads * v_head_dim)."""
        if start is None:
            start = step.start
        model = self.model
        spec, layer = model.spec, model.spec.layers[index]
        n = q.shape[0]
        end = start + n
        if self.ggml:  # llama.cpp's f16 attention
            return self.ggml_attend(index, q, kv, start)
        if n == 1 and fast_paths_enabled():
            return one_query_attention(q, kv, index, end, spec)
        lo = kv.window_start(index, start)  # 0, or a ring's window edge for the first query
        fused = model.ops.pool_attention(q, kv, index, start, lo, layer.sliding_window, spec.attn_scale,
                                         spec.attn_logit_softcap)
        if fused is not None:  # one kernel reading the pool (GPU)
            return fused
        positions = torch.arange(start, end, device=q.device)
        keys, values = kv.view(index, lo, end)
        if n > 1 and spec.attn_logit_softcap is None and block_aligned_keys_enabled():
            # Row-invariant prefill attention (engine/prefill_plan.py): SDPA's CPU kernel walks
            # keys in blocks of KEY_BLOCK and queries in blocks of 32 or 64, and a block cut short
            # rounds differently, so a row's output would depend on where its chunk starts and
            # ends. Keys are padded with zeros to whole blocks at absolute positions, queries to
            # a multiple of QUERY_BLOCK rows (copies of the last one, dropped after); the padded keys are masked.
            a, b = lo - lo % KEY_BLOCK, -(-end // KEY_BLOCK) * KEY_BLOCK
            keys = torch.nn.functional.pad(keys, (0, 0, lo - a, b - end))
            values = torch.nn.functional.pad(values, (0, 0, lo - a, b - end))
            extra = -n % QUERY_BLOCK
            qp = torch.cat([q, q[-1:].expand(extra, -1, -1)]) if extra else q
            rows = torch.cat([positions, positions[-1:].expand(extra)]) if extra else positions
            # Rows are invariant to the query blocks around them, so a long context's queries go
            # in tiles whose mask stays small (budget.attention_query_rows), with the same bits.
            tile = attention_query_rows(b - a)
            outs = [attention(qp[i : i + tile].transpose(0, 1), keys, values,
                              attention_mask(rows[i : i + tile], b - a, layer.sliding_window, a), spec.attn_scale)
                    for i in range(0, qp.shape[0], tile)]
            return (outs[0] if len(outs) == 1 else torch.cat(outs))[:n]
        mask = attention_mask(positions, end - lo, layer.sliding_window, lo) if n > 1 or layer.sliding_window else None
        return attention(q.transpose(0, 1), keys, values, mask, spec.attn_scale, spec.attn_logit_softcap)

    def ggml_attend(self, index: int, q: torch.Tensor, kv: KVPool, start: int) -> torch.Tensor:
        """`attend` with llama.cpp's arithmetic with flash attention off (numerics.ggml_attention)."""
        model = self.model
        spec, layer = model.spec, model.spec.layers[index]
        n = q.shape[0]
        end = start + n
        lo = kv.window_start(index, start)
        scale = spec.attn_scale
        if model.ggml_prescaled_q:
            q, scale = q * scale, 1.0
        if spec.attn_logit_softcap is None and kv.dtype == torch.float16 and not kv.scaled:
            c = ggml_c_ops(q)
            if c is not None:  # one C call over the pool's f16 rows (kernels/cpu/ggml_ops.c), the same bits
                return c.attend(q, kv.k[index], kv.v[index], lo, start, layer.sliding_window, scale)
        keys, values = kv.view(index, lo, end)  # (n_kv_heads, n_keys, dim), position order
        mask = attention_mask(torch.arange(start, end), end - lo, layer.sliding_window, lo)
        return ggml_attention(q.transpose(0, 1), keys, values, mask, scale, spec.attn_logit_softcap)


def one_query_attention(q: torch.Tensor, kv: KVPool, index: int, end: int, spec) -> torch.Tensor:
    """The decode step's attention: one query at position end-1 over layer `index`'s window — in C
    where `_c_decode` says so (a ring too), else the window's keys as float32 (layers.attend_keys)."""
    layer = spec.layers[index]
    ring = kv.is_ring(index)
    if _c_decode(kv, index) or (kv.dtype in _FLOAT_KV and not ring):
        return decode_attention(q, kv.k[index], kv.v[index], end, spec.attn_scale, layer.sliding_window,
                                spec.attn_logit_softcap, ring=ring)
    begin = max(0, end - layer.sliding_window) if layer.sliding_window else 0
    keys, values = kv.view(index, begin, end)  # position order, dequantized for int8/fp8
    return attend_keys(q, keys, values, spec.attn_scale, spec.attn_logit_softcap)


def _c_decode(kv: KVPool, index: int) -> bool:
    """Whether a one-query step of layer `index` runs in the C attention (layers.decode_attention; a
    ring too): verification then asks it query by query, so a verified row is that step."""
    k = kv.k[index]
    return k.dtype == torch.float16 and k.device.type == "cpu" and c_attention_enabled()


class EagerRowsAttention(EagerAttention):
    """Verification on the CPU: each query attends as the one-token `EagerAttention.attend` computes
    it, so row i is bit for bit the decode step after rows 0..i-1 (engine/speculate.py)."""

    def attend(self, index: int, q: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        start, n = step.start, q.shape[0]
        if n == 1:
            return super().attend(index, q, kv, step)
        spec = self.model.spec
        # The K/V of all the rows are stored already; query i at start+i sees keys 0..start+i.
        window = spec.layers[index].sliding_window
        begins = [max(0, start + i + 1 - window) if window else 0 for i in range(n)]
        lo, end = begins[0], start + n
        if not (q.device.type == "cpu" and fast_paths_enabled() and end - lo <= kv.caps[index]) or _c_decode(kv, index):
            return torch.cat([super(EagerRowsAttention, self).attend(index, q[i : i + 1], kv, None, start + i) for i in range(n)])
        # The one-query fast path reads keys begin..end-1 of the pool as float32 (decode_attention
        # or kv.view: a float copy, dequantized for int8/fp8) and calls attend_keys. Converting
        # once for all n queries and slicing gives the same elements, and SDPA over a slice gives
        # the same bits as over a contiguous copy (tests check it): this saves n - 1 copies of the
        # window per layer.
        keys, values = kv.view(index, lo, end)  # (n_kv_heads, end - lo, head_dim) float32
        return torch.cat([attend_keys(q[i : i + 1], keys[:, b - lo : start + i + 1 - lo], values[:, b - lo : start + i + 1 - lo],
                                      spec.attn_scale, spec.attn_logit_softcap) for i, b in enumerate(begins)])


class DeviceBackend(Backend):
    """Positions on the device: RoPE gathers its table rows there, K/V are written with index_copy_."""

    def rotate(self, table: RotaryTables, x: torch.Tensor, step: Step) -> torch.Tensor:
        cos = table.cos_full.index_select(0, step.positions)  # (n, 1, rope_dim)
        sin = table.sin_signed.index_select(0, step.positions)
        return table.rotate(x, cos, sin)

    def store(self, kv: KVPool, layer: int, k: torch.Tensor, v: torch.Tensor, step: Step) -> None:
        kv.store_at(layer, step.positions, k, v)


class GraphChunkAttention(DeviceBackend):
    """A prefill chunk whose start (1,) is on the device: the Triton flash kernel reads it there;
    the torch path (CPU tests) reads it back and attends eagerly."""

    def __init__(self, model, eager: EagerAttention):
        super().__init__(model)
        self.eager = eager

    def attend(self, index: int, q: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        spec, layer = self.model.spec, self.model.spec.layers[index]
        out = self.model.ops.pool_attention(q, kv, index, step.start, 0, layer.sliding_window, spec.attn_scale,
                                            spec.attn_logit_softcap)
        if out is not None:
            return out
        return self.eager.attend(index, q, kv, None, int(step.start.item()))


def _kernel_attention(q: torch.Tensor) -> bool:
    """Whether decode attention runs the Triton split-K kernel: on the GPU. (A seam for tests,
    which run it on the CPU under Triton's interpreter.)"""
    return q.is_cuda


def _cache_rows(kv: KVPool, layer: int, step: Step):
    """(k_cache, v_cache, slot) for a kernel that writes this step's K/V itself, or None when
    the layer stores codes with scales (int8/fp8: `store` quantizes). A ring's slot is
    position % ring, computed on the device once per step for each ring size."""
    k, v = kv.k[layer], kv.v[layer]
    if k.dtype not in _FLOAT_KV or k.stride(-1) != 1 or v.stride(-1) != 1:
        return None
    cap = k.shape[1]
    if cap >= kv.n_ctx:
        return k, v, step.positions
    slot = step.scratch.get(cap)
    if slot is None:
        slot = step.scratch[cap] = torch.remainder(step.positions, cap)
    return k, v, slot


def _fused_inputs(model, w, qkv: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor | None:
    """`attention_inputs` for decode tokens (one, or the consecutive rows of a verification pass)
    in one Triton launch per layer: per-head Q/K RMSNorm, RoPE at the device positions, K and V
    written into the cache rows (kernels/triton/rope.py); None where the launch does not apply."""
    spec, layer = model.spec, model.spec.layers[w.index]
    heads = model.fused_heads(w, qkv)
    if heads is None or layer.v_head_dim != layer.head_dim or qkv.stride(-1) != 1:
        return None
    from ..kernels.triton.rope import rope

    table = model.rope[layer.rope_key]
    if heads.k is None:  # Q only: the layer reads an earlier layer's cache
        q_out, _ = rope(heads.q, None, table.cos, table.sin, step.positions, table.style, rot_dim=table.rope_dim,
                        eps=spec.norm_eps, q_norm=heads.q_norm)
        return q_out
    rows = _cache_rows(kv, w.index, step)
    if rows is None:
        return None
    k_cache, v_cache, slot = rows
    q_out, _ = rope(heads.q, heads.k, table.cos, table.sin, step.positions, table.style, rot_dim=table.rope_dim,
                    k_cache=k_cache, v=heads.v, v_cache=v_cache, eps=spec.norm_eps, slot=slot,
                    q_norm=heads.q_norm, k_norm=heads.k_norm, v_norm=heads.v_norm)
    return q_out  # (n, nh, hd)


class FusedHeads(NamedTuple):
    """A block's Q/K/V heads as views of its projection, for the fused launch: k None for a layer
    that only queries; q_norm / k_norm one weight row for all heads (None: no norm); v_norm a
    weightless RMSNorm of V."""

    q: torch.Tensor
    k: torch.Tensor | None
    v: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    v_norm: bool = False


class GraphDecodeAttention(DeviceBackend):
    """One decode token at a device position with seq_len = position + 1 on the device.

    The kernel's scratch (partial outputs, the output) is shared by all layers of one shape: on
    one stream a layer's merge and output projection finish before the next layer's attention
    writes them again. Per layer it would cost layers x row counts x (heads x splits x head_dim)
    floats: 1.3 GB for a qwen3-4b-sized model at a 4096-token context with passes of 1..8 rows."""

    def __init__(self, model):
        super().__init__(model)
        self.scratch: dict[tuple, tuple] = {}

    def inputs(self, w, qkv: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        model = self.model
        if model.fused_attention_inputs and model.ops.fused_step:
            q = _fused_inputs(model, w, qkv, kv, step)
            if q is not None:
                return q
        return model.attention_heads(w, qkv, kv, step)

    def kernel(self, index: int, q: torch.Tensor, kv: KVPool, seq_len: torch.Tensor) -> torch.Tensor | None:
        """The Triton split-K kernel for q's rows (row i over seq_len + i keys), or None where it
        does not apply (the CPU, soft-capped attention)."""
        spec, layer = self.model.spec, self.model.spec.layers[index]
        if not (_kernel_attention(q) and spec.attn_logit_softcap is None):
            return None
        from ..kernels.triton.decode_attention import decode_attention as triton_decode_attention
        from ..kernels.triton.decode_attention import default_splits, make_scratch

        k_cache, v_cache = kv.k[index], kv.v[index]
        n, n_heads = q.shape[0], q.shape[1]
        splits = default_splits(k_cache.shape[0], k_cache.shape[1])
        key = (n, n_heads, splits, layer.head_dim, layer.v_head_dim)  # gemma4: a head size per layer type
        scratch = self.scratch.get(key)
        if scratch is None:
            out = torch.empty((n, n_heads, layer.v_head_dim), dtype=torch.float32, device=q.device)
            scratch = self.scratch[key] = (out, make_scratch(n * n_heads, splits, layer.head_dim, q.device))
        out, buffers = scratch
        # A ring layer is read at slot = position % ring inside the kernel; int8/fp8 codes
        # are read with their per-position scales.
        triton_decode_attention(q.contiguous(), k_cache, v_cache, seq_len, spec.attn_scale,
                                layer.sliding_window or 0, n_splits=splits, out=out, scratch=buffers,
                                k_scale=kv.k_scale[index] if kv.scaled else None,
                                v_scale=kv.v_scale[index] if kv.scaled else None)
        return out.reshape(n, -1)

    def attend(self, index: int, q: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        out = self.kernel(index, q, kv, step.seq_lens)
        if out is not None:
            return out
        # CPU (tests) or soft-capped attention: the eager step's, at a host-known length.
        return one_query_attention(q, kv, index, int(step.seq_lens.item()), self.model.spec)


class RowsAttention(DeviceBackend):
    """m consecutive decode tokens at device positions (verification): everything in a block but
    attention (GEMVs, norms, GLU) computes each row on its own already; the fused inputs and the
    decode kernel take a row axis (row i at position + i, computed as a one-token launch computes
    it); where they do not apply (CPU, torch ops, quantized K/V writes) each row goes through its
    own one-token decode step. So the m rows are bit for bit what m decode steps compute."""

    def __init__(self, model, decode: GraphDecodeAttention):
        super().__init__(model)
        self.decode = decode  # its kernels and their shared scratch

    def rows(self, step: Step) -> list[Step]:
        """The one-token decode steps of step's rows (made once per run)."""
        rows = step.scratch.get("rows")
        if rows is None:
            rows = step.scratch["rows"] = [
                Step(DECODE, step.ids[i : i + 1], step.positions[i : i + 1], step.positions[i : i + 1],
                     step.seq_lens[i : i + 1], backend=self.decode) for i in range(step.positions.shape[0])]
        return rows

    def inputs(self, w, qkv: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        model = self.model
        if model.fused_attention_inputs and model.ops.fused_step:
            q = _fused_inputs(model, w, qkv, kv, step)
            if q is not None:
                return q
        return torch.cat([self.decode.inputs(w, qkv[i : i + 1], kv, row) for i, row in enumerate(self.rows(step))])

    def attend(self, index: int, q: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        out = self.decode.kernel(index, q, kv, step.seq_lens[:1])
        if out is not None:
            return out
        # .clone(): a row's output may live in the layer's static scratch, reused by the next row
        return torch.cat([self.decode.attend(index, q[i : i + 1], kv, row).clone() for i, row in enumerate(self.rows(step))])


def backends_for(model) -> dict[tuple[str, bool], Backend]:
    """The backend of each regime, (phase, start on the host) -> backend, built once per model."""
    eager = EagerAttention(model)
    decode = GraphDecodeAttention(model)
    return {
        (PREFILL, True): eager, (DECODE, True): eager, (VERIFY, True): EagerRowsAttention(model),
        (PREFILL, False): GraphChunkAttention(model, eager), (DECODE, False): decode,
        (VERIFY, False): RowsAttention(model, decode),
    }
