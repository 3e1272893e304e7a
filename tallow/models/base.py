"""The decoder skeleton every family shares: embed, run the blocks, norm, project to logits.

A family file subclasses `DecoderModel` and says what one block computes (`block`) and
which tensors it needs (`load_layer`); how a matrix product runs is the kernels' business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ModelFileError
from ..families import family
from ..families.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD
from ..gguf_file import GGUFFile
from ..kernels.dispatch import Placement
from ..layers import (KEY_BLOCK, QUERY_BLOCK, RotaryTables, attend_keys, attention, attention_mask,
                      block_aligned_keys_enabled, decode_attention, fast_paths_enabled, rms_norm, softcap_logits)
from ..memory.kv_pool import KVPool
from ..numerics import ggml_attention, ggml_enabled
from ..quant.reference import dequantize
from ..spec import ModelSpec


@dataclass
class LayerWeights:
    """Tensors of one block, by the names the family's `block` reads them by (attn_qkv, ffn_norm, …)."""

    index: int
    tensors: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["tensors"][name]
        except KeyError:
            raise AttributeError(name) from None

    def get(self, name: str) -> Any:
        return self.tensors.get(name)


class DecoderModel:
    """Weights and forward pass of one decoder-only model."""

    # Whether the CUDA-graph step may replace `attention_inputs` with the one-launch Triton
    # Q/K norm + RoPE + K/V store (models/step.py); a family whose inputs differ says False.
    fused_attention_inputs = True

    def __init__(self, gf: GGUFFile, spec: ModelSpec, linear_mode: str | None = None, device: str | torch.device = "cpu",
                 weight_cache=None):
        self.gf = gf
        self.spec = spec
        self.linear_mode = linear_mode
        self.place = Placement(device, linear_mode, weight_cache)
        self.device = self.place.device
        self.ops = self.place.ops  # norms and GLU: torch, or one Triton launch each on the GPU
        self.tensor_names = family(spec.architecture).tensors  # role -> GGUF name (families/tensors.py)
        embd = self._tensor(self.tensor_names.name(TOKEN_EMBD))
        self.embedding = self.place.embedding(embd)
        self.output_norm = self.norm_weight(self.tensor_names.name(OUTPUT_NORM))
        output = gf.tensors.get(self.tensor_names.name(OUTPUT)) or embd  # tied: the embedding table
        self.output = self.place.cached([output.name], lambda: self.place.linear(output, role=OUTPUT))
        self.rope = {}
        for layer in spec.layers:  # one table per distinct (base, rotated width, factors)
            if layer.rope_key not in self.rope:
                self.rope[layer.rope_key] = RotaryTables(layer.rope_dim, layer.rope_base, spec.rope_style, spec.rope_scale,
                                                         layer.rope_factors)
        if self.place.on_gpu:
            # Tables for the whole trained context, built once and kept on the device.
            for table in self.rope.values():
                table.ensure(spec.context_length)
                table.to(self.device)
        self.layers = [self.load_layer(i) for i in range(spec.n_layers)]

    # -- loading helpers -------------------------------------------------------------------
    def _tensor(self, name: str):
        try:
            return self.gf.tensors[name]
        except KeyError:
            raise ModelFileError(f"{self.gf.path}: the tensor {name} is missing.") from None

    def norm_weight(self, name: str) -> torch.Tensor:
        t = self._tensor(name)
        return dequantize(t.data, t.qtype, t.n_cols).reshape(-1).clone().to(self.device)

    def linear(self, name: str, bias: str | None = None):
        return self.place.cached([name], lambda: self._build_linear(name, bias))

    def _build_linear(self, name: str, bias: str | None = None):
        bias_array: np.ndarray | None = None
        if bias is not None and bias in self.gf.tensors:
            b = self.gf.tensors[bias]
            bias_array = dequantize(b.data, b.qtype, b.n_cols).reshape(-1).numpy()
        return self.place.linear(self._tensor(name), bias_array)

    def linear_group(self, names: list[str], biases: list[str | None] | None = None):
        """The linears `names` (same input) as one layer: their outputs side by side."""
        biases = biases or [None] * len(names)
        return self.place.cached(names, lambda: self.place.linear_group([self._build_linear(n, b) for n, b in zip(names, biases)]))

    def load_layer(self, i: int) -> LayerWeights:
        raise NotImplementedError

    def attention_inputs(self, w: LayerWeights, qkv: torch.Tensor, kv: KVPool, start: int) -> torch.Tensor:
        """Q for this block's attention, from the fused Q/K/V projection's output
        (n, (nh + nkv) * hd + nkv * v_head_dim): the Q and K heads per-head RMS-normed (where the
        layer has `attn_qk_norm`), rotated at positions start.., K and V written to the pool.
        Returns q (n, nh, hd). The CUDA-graph step does all of it in one launch (step.py)."""
        spec, layer = self.spec, self.spec.layers[w.index]
        n = qkv.shape[0]
        nh, nkv, hd = layer.n_heads, layer.n_kv_heads, layer.head_dim
        qk = qkv[:, : (nh + nkv) * hd].view(n, nh + nkv, hd)  # Q heads then K heads
        v = qkv[:, (nh + nkv) * hd :].view(n, nkv, layer.v_head_dim)
        qk_norm = w.get("attn_qk_norm")
        if qk_norm is not None:
            qk = rms_norm(qk, qk_norm, spec.norm_eps)
        qk = self.rope[layer.rope_key].apply_at(qk, start)
        kv.store(w.index, start, qk[:, nh:], v)
        return qk[:, :nh]

    def attend(self, index: int, q: torch.Tensor, kv: KVPool, start: int) -> torch.Tensor:
        """Attention of q (n, n_heads, head_dim) at positions start.. over layer `index`'s cached
        keys 0..start+n-1 (this step's K/V already stored). Returns (n, n_heads * v_head_dim)."""
        spec, layer = self.spec, self.spec.layers[index]
        n = q.shape[0]
        end = start + n
        if ggml_enabled() and not self.place.on_gpu:  # TALLOW_NUMERICS=ggml: llama.cpp's f16 attention
            return self.ggml_attend(index, q, kv, start)
        if n == 1 and fast_paths_enabled():
            if kv.dtype in (torch.float16, torch.bfloat16, torch.float32) and not kv.is_ring(index):
                return decode_attention(q, kv.k[index], kv.v[index], end, spec.attn_scale,
                                        layer.sliding_window, spec.attn_logit_softcap)
            # A ring or a quantized pool: the window's keys, in position order, as float32.
            begin = max(0, end - layer.sliding_window) if layer.sliding_window else 0
            keys, values = kv.view(index, begin, end)
            return attend_keys(q, keys, values, spec.attn_scale, spec.attn_logit_softcap)
        lo = kv.window_start(index, start)  # 0, or a ring's window edge for the first query
        fused = self.ops.pool_attention(q, kv, index, start, lo, layer.sliding_window, spec.attn_scale,
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
            mask = attention_mask(rows, b - a, layer.sliding_window, a)
            return attention(qp.transpose(0, 1), keys, values, mask, spec.attn_scale)[:n]
        mask = attention_mask(positions, end - lo, layer.sliding_window, lo) if n > 1 or layer.sliding_window else None
        return attention(q.transpose(0, 1), keys, values, mask, spec.attn_scale, spec.attn_logit_softcap)

    # llama.cpp scales Q in float32 before attention for gemma (gemma3.cpp), so the f16 rounding
    # of Q sees the scaled values; the other families scale the scores inside soft_max.
    ggml_prescaled_q = False

    def ggml_attend(self, index: int, q: torch.Tensor, kv: KVPool, start: int) -> torch.Tensor:
        """`attend` with llama.cpp's arithmetic with flash attention off (numerics.ggml_attention)."""
        spec, layer = self.spec, self.spec.layers[index]
        n = q.shape[0]
        end = start + n
        lo = kv.window_start(index, start)
        keys, values = kv.view(index, lo, end)  # (n_kv_heads, n_keys, dim), position order
        mask = attention_mask(torch.arange(start, end), end - lo, layer.sliding_window, lo)
        scale = spec.attn_scale
        if self.ggml_prescaled_q:
            q, scale = q * scale, 1.0
        return ggml_attention(q.transpose(0, 1), keys, values, mask, scale, spec.attn_logit_softcap)

    def block(self, layer: LayerWeights, x: torch.Tensor, delta: torch.Tensor | None, positions: torch.Tensor,
              kv: KVPool, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One block over the residual stream x + delta (delta None: nothing pending). Returns
        the stream and the block's last residual delta, left unadded so the next block's first
        norm (or the output norm) adds it in the same kernel (`ops.add_norm`)."""
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Resident bytes of the weights this model holds (quantized or repacked)."""
        total = self.output.nbytes + self.output_norm.numel() * 4
        for layer in self.layers:
            for value in layer.tensors.values():
                total += value.numel() * value.element_size() if isinstance(value, torch.Tensor) else value.nbytes
        return total

    # -- forward ---------------------------------------------------------------------------
    def _blocks(self, step, ids: torch.Tensor, positions: torch.Tensor, kv, start: int):
        """Embed `ids` and run every block with `step`'s hooks (the model itself, or a copy bound
        to device positions); returns the residual stream and the last block's pending delta."""
        x = self.embedding(ids)  # (n, dim)
        if self.spec.embed_scale != 1.0:
            x = x * self.spec.embed_scale
        delta = None
        for layer in self.layers:
            x, delta = step.block(layer, x, delta, positions, kv, start)
        return x, delta

    @torch.inference_mode()
    def forward(self, tokens: list[int], start: int, kv: KVPool, all_logits: bool = False) -> torch.Tensor:
        """Run tokens at positions start.. through the model, writing their K/V into kv.

        Returns logits (n_tokens, vocab) if all_logits else (1, vocab) for the last token.
        """
        n = len(tokens)
        if start + n > kv.n_ctx:
            raise ValueError(f"{start + n} tokens exceed the context of {kv.n_ctx}")
        if n > kv.max_chunk and kv.has_rings:
            # A ring holds the keys of at most max_chunk new tokens beyond its window: run in chunks.
            parts = [self.forward(tokens[s : s + kv.max_chunk], start + s, kv, all_logits)
                     for s in range(0, n, kv.max_chunk)]
            return torch.cat(parts) if all_logits else parts[-1]
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + n, device=self.device)
        for table in self.rope.values():
            table.ensure(start + n)
        x, delta = self._blocks(self, ids, positions, kv, start)
        if not all_logits:
            x, delta = x[-1:], delta[-1:]
        _, h = self.ops.add_norm(x, delta, self.output_norm, self.spec.norm_eps)
        logits = self.output(h)  # (n or 1, vocab)
        del kv.tokens[start:]
        kv.tokens.extend(tokens)
        return softcap_logits(logits, self.spec.final_logit_softcap)

    @torch.inference_mode()
    def hidden_states(self, tokens: list[int], kv: KVPool) -> torch.Tensor:
        """The final-norm hidden state of every token (n, dim) fp32, tokens at positions 0..
        (for embeddings). Overwrites the pool's K/V from position 0 and leaves it empty: what
        it held can no longer be reused."""
        kv.truncate(0)
        step = kv.max_chunk if kv.has_rings else len(tokens)  # a ring holds at most max_chunk new keys
        out = []
        for start in range(0, len(tokens), step):
            chunk = tokens[start : start + step]
            ids = torch.tensor(chunk, dtype=torch.long, device=self.device)
            positions = torch.arange(start, start + len(chunk), device=self.device)
            for table in self.rope.values():
                table.ensure(start + len(chunk))
            x, delta = self._blocks(self, ids, positions, kv, start)
            _, h = self.ops.add_norm(x, delta, self.output_norm, self.spec.norm_eps)
            out.append(h.float())  # (chunk, dim)
        kv.truncate(0)
        return torch.cat(out)

    # -- a prefill chunk with its positions on the device (for CUDA graphs) -------------------
    @torch.inference_mode()
    def forward_chunk(self, tokens: torch.Tensor, positions: torch.Tensor, start: torch.Tensor, last: torch.Tensor,
                      kv: KVPool) -> torch.Tensor:
        """`forward` of tokens (n,) at `positions` (n,) = start.. with everything on the device;
        returns the logits (1, vocab) of row `last` (1,). Graph-safe: a captured chunk replays at
        any start, and rows after `last` may be padding (their K/V land in positions that are
        rewritten before anything reads them). The caller keeps `kv.tokens`."""
        from .step import bind_chunk

        step, bound_kv = bind_chunk(self, positions, start, kv)
        x, delta = self._blocks(step, tokens, positions, bound_kv, 0)
        x, delta = x.index_select(0, last), delta.index_select(0, last)
        _, h = self.ops.add_norm(x, delta, self.output_norm, self.spec.norm_eps)
        return softcap_logits(self.output(h), self.spec.final_logit_softcap)

    # -- one decode step with its position on the device (for CUDA graphs) -------------------
    @torch.inference_mode()
    def forward_step(self, token: torch.Tensor, position: torch.Tensor, seq_len: torch.Tensor, kv: KVPool) -> torch.Tensor:
        """One token (1,) at `position` (1,) with `seq_len` (1,) int32 = position + 1, all on the
        device; returns logits (1, vocab). Runs the family's own `block` with RoPE, the K/V
        store and attention bound to those device tensors, so nothing depends on a Python int
        and a captured graph replays at any position. The caller keeps `kv.tokens`."""
        from .step import bind_step

        step, bound_kv = bind_step(self, position, seq_len, kv)
        x, delta = self._blocks(step, token, position, bound_kv, 0)
        _, h = self.ops.add_norm(x, delta, self.output_norm, self.spec.norm_eps)
        return softcap_logits(self.output(h), self.spec.final_logit_softcap)

    # -- m consecutive decode steps in one pass (verifying speculative drafts) ---------------
    @torch.inference_mode()
    def forward_rows(self, tokens: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor, kv: KVPool) -> torch.Tensor:
        """Tokens (m,) at `positions` (m,) = p..p+m-1 with `seq_lens` (m,) int32 = positions + 1,
        all on the device; returns logits (m, vocab), row i bit-identical to what forward_step
        gives for token i after tokens 0..i-1: the weights are read once for all rows, while
        attention runs row by row through the one-token step's own hooks (step.bind_rows).
        Graph-safe like forward_step. The caller keeps `kv.tokens`."""
        from .step import bind_rows

        step, bound_kv = bind_rows(self, positions, seq_lens, kv)
        x, delta = self._blocks(step, tokens, positions, bound_kv, 0)
        _, h = self.ops.add_norm(x, delta, self.output_norm, self.spec.norm_eps)
        return softcap_logits(self.output(h), self.spec.final_logit_softcap)
