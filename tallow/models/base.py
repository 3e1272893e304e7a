"""The decoder skeleton every family shares: embed, run the blocks, norm, project to logits.

A family file subclasses `DecoderModel` and says what one block computes (`block`) and
which tensors it needs (`load_layer`); how a matrix product runs is the kernels' business.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ModelFileError
from ..families import family
from ..families.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD
from ..gguf_file import GGUFFile
from ..numerics_choice import choose as choose_numerics
from ..numerics_mode import GGML, scope as numerics_scope
from ..kernels.cpu.decode_layer import DecodeLayers
from ..kernels.dispatch import Placement
from ..layers import RotaryTables, rms_norm, softcap_logits
from ..memory.kv_pool import KVPool
from ..quant.reference import dequantize
from ..spec import ModelSpec
from .step import ALL, LAST, PREFILL, FusedHeads, Step, backends_for


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

    # Whether the CUDA-graph decode and verify steps may run `attention_heads` as the one-launch
    # Triton Q/K norm + RoPE + K/V store (models/step.py); a family whose inputs differ says False.
    fused_attention_inputs = True

    def __init__(self, gf: GGUFFile, spec: ModelSpec, linear_mode: str | None = None, device: str | torch.device = "cpu",
                 weight_cache=None, numerics: str | None = None):
        """numerics: "ggml" or "default" (numerics_choice.py; None: chosen here for this file and device)."""
        self.numerics = numerics or choose_numerics(gf, str(device), linear_mode)
        with numerics_scope(self.numerics):  # the layers, tables and kernels built below read it
            self._load(gf, spec, linear_mode, device, weight_cache)

    def _load(self, gf: GGUFFile, spec: ModelSpec, linear_mode: str | None, device: str | torch.device, weight_cache) -> None:
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
        gf.release_pages()  # (a cold load reads every weight through the map: drop each block's pages once packed)
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
        self.layers = []
        for i in range(spec.n_layers):
            self.layers.append(self.load_layer(i))
            gf.release_pages()
        self.backends = backends_for(self)  # RoPE, K/V writes and attention per regime (models/step.py)

    @functools.cached_property
    def c_decode(self) -> DecodeLayers | None:
        """The whole decode step in one C call where the family's blocks are the ones it computes
        (kernels/cpu/decode_layer.py); None elsewhere. Asked at the first step, once every family's
        constructor has set what it looks at (Gemma 4's V norm row, Falcon-H1's C mixers)."""
        return None if self.place.on_gpu else DecodeLayers.for_model(self)

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

    def attention_inputs(self, w: LayerWeights, qkv: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        """Q (n, nh, hd) for this block's attention from the fused Q/K/V projection's output, K and
        V written to the pool: the step's backend runs `attention_heads`, or one fused Triton
        launch in a graph decode step (models/step.py)."""
        if step.on_host:  # eager: the torch heads, without a hop through the backend
            return self.attention_heads(w, qkv, kv, step)
        return step.backend.inputs(w, qkv, kv, step)

    def attention_heads(self, w: LayerWeights, qkv: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        """`attention_inputs` in torch, from qkv (n, (nh + nkv) * hd + nkv * v_head_dim): the Q and
        K heads per-head RMS-normed (where the layer has `attn_qk_norm`), rotated at the step's
        positions, K and V written to the pool. Returns q (n, nh, hd)."""
        spec, layer = self.spec, self.spec.layers[w.index]
        n = qkv.shape[0]
        nh, nkv, hd = layer.n_heads, layer.n_kv_heads, layer.head_dim
        qk = qkv[:, : (nh + nkv) * hd].view(n, nh + nkv, hd)  # Q heads then K heads
        v = qkv[:, (nh + nkv) * hd :].view(n, nkv, layer.v_head_dim)
        qk_norm = w.get("attn_qk_norm")
        if qk_norm is not None:
            qk = rms_norm(qk, qk_norm, spec.norm_eps)
        qk = step.rotate(self.rope[layer.rope_key], qk)
        step.store(kv, w.index, qk[:, nh:], v)
        return qk[:, :nh]

    def fused_heads(self, w: LayerWeights, qkv: torch.Tensor):
        """This block's heads for the fused decode launch (models/step.py FusedHeads), or None
        where that launch cannot compute them."""
        layer = self.spec.layers[w.index]
        nh, nkv, hd = layer.n_heads, layer.n_kv_heads, layer.head_dim
        n = qkv.shape[0]
        norms = w.get("attn_qk_norm")
        return FusedHeads(qkv[:, : nh * hd].view(n, nh, hd), qkv[:, nh * hd : (nh + nkv) * hd].view(n, nkv, hd),
                          qkv[:, (nh + nkv) * hd :].view(n, nkv, hd), None if norms is None else norms[0],
                          None if norms is None else norms[nh])

    def attend(self, index: int, q: torch.Tensor, kv: KVPool, step: Step) -> torch.Tensor:
        """Attention of q (n, n_heads, head_dim) at the step's positions over layer `index`'s
        cached keys (this step's K/V already stored), by the step's backend (models/step.py).
        Returns (n, n_heads * v_head_dim)."""
        return step.backend.attend(index, q, kv, step)

    # llama.cpp scales Q in float32 before attention for gemma (gemma3.cpp), so the f16 rounding
    # of Q sees the scaled values; the other families scale the scores inside soft_max
    # (step.EagerAttention.ggml_attend).
    ggml_prescaled_q = False

    def output_rows(self, w: LayerWeights, x: torch.Tensor, attn_out: torch.Tensor,
                    step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream and the attention output after the last block's output projection,
        cut to the row whose logits the step returns (LAST) under TALLOW_NUMERICS=ggml: llama.cpp's
        graphs take only the output rows there (ggml_get_rows(inp_out_ids)), so the last feed-forward
        part runs on one row, and a product of one row sums in vec_dot's order, not the tiled order of
        8+ prompt rows (the first token after a prompt would differ in the last bits otherwise)."""
        if step.logits != LAST or x.shape[0] == 1 or w.index != len(self.layers) - 1 or self.device.type != "cpu" \
                or self.numerics != GGML:
            return x, attn_out
        return x[-1:], attn_out[-1:]

    def block(self, w: LayerWeights, x: torch.Tensor, delta: torch.Tensor | None, step: Step,
              kv: KVPool) -> tuple[torch.Tensor, torch.Tensor]:
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
    def _blocks(self, step: Step, kv: KVPool):
        """Embed the step's ids and run every block; returns the residual stream and the last
        block's pending delta."""
        x = self.embedding(step.ids)  # (n, dim)
        if self.spec.embed_scale != 1.0:
            x = x * self.spec.embed_scale
        if self.c_decode is not None and self.c_decode.applies(step, kv):
            return self.c_decode.run(x, step, kv)
        delta = None
        for layer in self.layers:
            x, delta = self.block(layer, x, delta, step, kv)
        return x, delta

    @torch.inference_mode()
    def run(self, step: Step, kv: KVPool) -> torch.Tensor:
        """The forward pass: the step's tokens through every block, their K/V written into kv.
        Returns the logits of the rows `step.logits` names ((1, vocab) for LAST, (n, vocab) for
        ALL, one row per index of a tensor), or the final-norm hidden states (n, dim) for None.
        Graph-safe when the step's start is a device tensor. Leaves `kv.tokens` to the caller."""
        with numerics_scope(self.numerics):
            return self._run(step, kv)

    def _run(self, step: Step, kv: KVPool) -> torch.Tensor:
        step.backend = self.backends[step.phase, step.on_host]
        step.scratch.clear()
        if step.on_host:
            for table in self.rope.values():
                table.ensure(step.start + step.ids.shape[0])
        x, delta = self._blocks(step, kv)
        rows = step.logits
        if isinstance(rows, torch.Tensor):
            x, delta = x.index_select(0, rows), None if delta is None else delta.index_select(0, rows)
        elif rows == LAST:
            x, delta = x[-1:], None if delta is None else delta[-1:]
        _, h = self.ops.add_norm(x, delta, self.output_norm, self.spec.norm_eps)
        if rows is None:
            return h
        return softcap_logits(self.output(h), self.spec.final_logit_softcap)

    def forward(self, tokens: list[int], start: int, kv: KVPool, all_logits: bool = False,
                phase: str | None = None) -> torch.Tensor:
        """`run` of tokens at positions start.. (an eager step), recorded in `kv.tokens`; in
        chunks of kv.max_chunk where the pool has rings (a ring holds the keys of at most that
        many new tokens beyond its window). phase VERIFY: attention query by query, each row as
        a decode step computes it (speculative verification on the CPU).

        Returns logits (n_tokens, vocab) if all_logits else (1, vocab) for the last token.
        """
        n = len(tokens)
        if start + n > kv.n_ctx:
            raise ValueError(f"{start + n} tokens exceed the context of {kv.n_ctx}")
        if n > kv.max_chunk and kv.has_rings:
            parts = [self.forward(tokens[s : s + kv.max_chunk], start + s, kv, all_logits, phase)
                     for s in range(0, n, kv.max_chunk)]
            return torch.cat(parts) if all_logits else parts[-1]
        logits = self.run(Step.host(tokens, start, self.device, phase, ALL if all_logits else LAST), kv)
        del kv.tokens[start:]
        kv.tokens.extend(tokens)
        return logits

    def hidden_states(self, tokens: list[int], kv: KVPool) -> torch.Tensor:
        """The final-norm hidden state of every token (n, dim) fp32, tokens at positions 0..
        (for embeddings). Overwrites the pool's K/V from position 0 and leaves it empty: what
        it held can no longer be reused."""
        kv.truncate(0)
        size = kv.max_chunk if kv.has_rings else len(tokens)  # a ring holds at most max_chunk new keys
        out = [self.run(Step.host(tokens[s : s + size], s, self.device, PREFILL, logits=None), kv).float()
               for s in range(0, len(tokens), size)]
        kv.truncate(0)
        return torch.cat(out)
