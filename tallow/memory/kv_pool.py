"""The KV cache: one pre-allocated pool per layer, sized for the context before inference.

Per-layer plan from the spec. A global-attention layer holds every position of the context.
A sliding-window layer (gemma3: 5 of 6, window 512) never looks further back than its
window, so it holds a ring of `window + max_chunk - 1` slots and position p lives in slot
p % ring: a prefill chunk of up to `max_chunk` tokens starting at s needs the keys
s-window+1 .. s+n-1 at once (each token sees the window before it), and that span fits the
ring after the chunk's own keys are written. `forward` splits longer calls into chunks of
`max_chunk`. TALLOW_KV_RING=0 gives every layer the whole context (the reference layout).

Storage dtypes (`kv_dtype`):
  f16   float16, as llama.cpp stores K/V by default (attention sees the same rounded values);
  bf16  bfloat16;
  int8  int8 codes with one float32 scale per position and head (absmax / 127);
  fp8   float8 e4m3 codes with one float32 scale per position and head (absmax / 448);
  f32   float32 (tests against llama.cpp's F32 KV).
Scales live in `k_scale`/`v_scale` (n_kv_heads, ring) beside the codes. `view` dequantizes
to float32 for the CPU attention; the GPU decode kernel reads codes and scales directly.

`tokens` records which token ids the resident positions hold; the engine reuses the longest
common prefix between requests. A ring forgets: once position p + ring has been written,
position p is gone, so truncating back to a point whose window reaches before the ring's
oldest intact position would leave stale keys. `reusable(n)` says how much of a prefix can
still be kept (n or 0), and `truncate` to a point that is not reusable empties the pool.

Gemma 4's shared-KV layers (`LayerSpec.kv_source` != the layer) own no cache: their entries in
`k`/`v`/`caps` are the source layer's own tensors, so attention reads the source's slots, the
model never stores into them, and `nbytes`, the plan and persistence count each cache once.

`canonical` counts the leading positions whose K/V are bit for bit what a cold prefill of the
same tokens writes (engine/prefill_plan.py): only those are reused, so that the cache never
changes an answer. The engine raises it after each such prefill chunk; truncation lowers it.
"""

from __future__ import annotations

import contextlib

import torch

from ..spec import ModelSpec
from .kv_format import kv_format
from .. import switches

# Names, aliases, storage dtypes, bytes and qmax of each KV dtype: memory/kv_format.py.


def kv_dtype_name(dtype: "str | torch.dtype | None") -> str:
    """The canonical name of a KV dtype given as a name, an alias or a torch float dtype."""
    return kv_format(dtype).name


def ring_enabled() -> bool:
    """TALLOW_KV_RING=0: sliding-window layers hold the whole context like global ones."""
    return switches.enabled("TALLOW_KV_RING")


def layer_capacity(window: int | None, n_ctx: int, max_chunk: int, ring: bool = True) -> int:
    """Slots a layer holds: the context, or for a sliding-window layer window + max_chunk - 1
    (the keys one chunk of max_chunk tokens needs at once), whichever is smaller."""
    if not ring or not window:
        return n_ctx
    return min(n_ctx, window + max_chunk - 1)


class KVPool:
    # Whether speculation may roll rejected drafts back by truncation (a recurrent memory,
    # memory/recurrent.py, answers for itself).
    can_rollback = True

    def __init__(self, spec: ModelSpec, n_ctx: int, dtype: "str | torch.dtype | None" = torch.float16,
                 device: torch.device | str = "cpu", ring: bool | None = None, max_chunk: int = 512):
        self.n_ctx = n_ctx
        self.format = kv_format(dtype)
        self.kv_dtype = self.format.name
        self.dtype = self.format.torch_dtype  # storage dtype of the codes
        self.scaled = self.format.scaled  # codes plus per-(position, head) scales
        self.device = torch.device(device)
        self.max_chunk = max(1, min(max_chunk, n_ctx))
        ring = ring_enabled() if ring is None else ring
        self.windows = [layer.sliding_window for layer in spec.layers]
        self.caps = [layer_capacity(w, n_ctx, self.max_chunk, ring) for w in self.windows]
        self.sources = [layer.kv_source for layer in spec.layers]  # the layer whose cache each layer reads
        self.k, self.v = [], []
        self.k_scale = [] if self.scaled else None
        self.v_scale = [] if self.scaled else None
        for layer, cap in zip(spec.layers, self.caps):
            if not layer.owns_kv:  # a shared-KV layer: the source's tensors (an earlier layer)
                src = layer.kv_source
                self.k.append(self.k[src])
                self.v.append(self.v[src])
                if self.scaled:
                    self.k_scale.append(self.k_scale[src])
                    self.v_scale.append(self.v_scale[src])
                continue
            self.k.append(torch.zeros(layer.n_kv_heads, cap, layer.head_dim, dtype=self.dtype, device=device))
            self.v.append(torch.zeros(layer.n_kv_heads, cap, layer.v_head_dim, dtype=self.dtype, device=device))
            if self.scaled:
                self.k_scale.append(torch.zeros(layer.n_kv_heads, cap, dtype=torch.float32, device=device))
                self.v_scale.append(torch.zeros(layer.n_kv_heads, cap, dtype=torch.float32, device=device))
        self.tokens: list[int] = []  # ids whose K/V occupy positions 0..len(tokens)-1
        self._high = -1  # highest position written since the pool was last emptied
        self._intact_from = [0] * len(self.caps)  # a hydrated ring holds nothing before this position
        self.canonical = 0  # positions 0..canonical-1 hold exactly a cold prefill's K/V (see the module doc)

    # -- layout ------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes allocated: each cache once (shared-KV layers add nothing)."""
        return sum(t.numel() * t.element_size() for i in self.owners for t in self.layer_tensors(i))

    @property
    def owners(self) -> list[int]:
        """The layers that own a cache (all of them but gemma4's shared-KV layers)."""
        return [i for i, src in enumerate(self.sources) if src == i]

    def owns(self, layer: int) -> bool:
        return self.sources[layer] == layer

    def is_ring(self, layer: int) -> bool:
        return self.caps[layer] < self.n_ctx

    @property
    def has_rings(self) -> bool:
        return any(cap < self.n_ctx for cap in self.caps)

    def layer_tensors(self, layer: int) -> list[torch.Tensor]:
        """The tensors of one layer, each (n_kv_heads, capacity, ...): K, V (and their scales)."""
        if self.scaled:
            return [self.k[layer], self.v[layer], self.k_scale[layer], self.v_scale[layer]]
        return [self.k[layer], self.v[layer]]

    def _spans(self, layer: int, lo: int, end: int) -> list[tuple[int, int]]:
        """Slot ranges [a, b) holding positions lo..end-1 in order (two when the ring wraps)."""
        cap = self.caps[layer]
        if end - lo > cap:
            raise ValueError(f"positions {lo}..{end - 1} do not fit layer {layer}'s {cap} slots")
        a = lo % cap
        if a + (end - lo) <= cap:
            return [(a, a + end - lo)]
        return [(a, cap), (0, end - lo - (cap - a))]

    # -- writing -----------------------------------------------------------------------------
    def _encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (n_kv_heads, n, dim) -> codes in the storage dtype, and scales (n_kv_heads, n) if scaled."""
        if not self.scaled:
            return x.to(self.dtype), None
        x = x.float()
        scale = x.abs().amax(-1) / self.format.qmax  # (heads, n)
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        y = x * inv.unsqueeze(-1)
        if self.kv_dtype == "int8":
            y = y.round().clamp_(-127, 127)
        return y.to(self.dtype), scale

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k (n_tokens, n_kv_heads, head_dim) and v at positions start.. of one layer."""
        n = k.shape[0]
        if start + n > self.n_ctx:
            raise ValueError(f"{start + n} positions exceed the context of {self.n_ctx}")
        kc, ks = self._encode(k.transpose(0, 1))
        vc, vs = self._encode(v.transpose(0, 1))
        done = 0
        for a, b in self._spans(layer, start, start + n):
            m = b - a
            self.k[layer][:, a:b] = kc[:, done : done + m]
            self.v[layer][:, a:b] = vc[:, done : done + m]
            if self.scaled:
                self.k_scale[layer][:, a:b] = ks[:, done : done + m]
                self.v_scale[layer][:, a:b] = vs[:, done : done + m]
            done += m
        self._high = max(self._high, start + n - 1)

    def store_at(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Like `store`, at positions given as a device tensor (n_tokens,): nothing is read back
        to the host, so a CUDA graph can capture it and replay it at any position. On a ring the
        slot is position % ring, computed on the device. (The caller notes the position with
        `mark_written`, or by appending to `tokens`.)"""
        cap = self.caps[layer]
        slots = positions if cap == self.n_ctx else torch.remainder(positions, cap)
        kc, ks = self._encode(k.transpose(0, 1))
        vc, vs = self._encode(v.transpose(0, 1))
        if self.kv_dtype == "fp8":  # index_copy_ has no float8 kernels everywhere: copy the bytes
            self.k[layer].view(torch.uint8).index_copy_(1, slots, kc.view(torch.uint8))
            self.v[layer].view(torch.uint8).index_copy_(1, slots, vc.view(torch.uint8))
        else:
            self.k[layer].index_copy_(1, slots, kc)
            self.v[layer].index_copy_(1, slots, vc)
        if self.scaled:
            self.k_scale[layer].index_copy_(1, slots, ks)
            self.v_scale[layer].index_copy_(1, slots, vs)

    def mark_written(self, position: int) -> None:
        self._high = max(self._high, position)

    # -- reading -----------------------------------------------------------------------------
    def view(self, layer: int, lo: int, end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions lo..end-1, in position order, as float32: (n_kv_heads, end-lo, dim).

        `view(layer, end)` (one argument) means positions 0..end-1."""
        if end is None:
            lo, end = 0, lo
        out = []
        for data, scale in ((self.k[layer], self.k_scale[layer] if self.scaled else None),
                            (self.v[layer], self.v_scale[layer] if self.scaled else None)):
            parts = []
            for a, b in self._spans(layer, lo, end):
                part = data[:, a:b].float()
                if scale is not None:
                    part = part * scale[:, a:b].unsqueeze(-1)
                parts.append(part)
            out.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1))
        return out[0], out[1]

    def window_start(self, layer: int, first_query: int) -> int:
        """The first key position the attention of queries first_query.. must read from the pool.
        Global layers and full-context layouts start at 0 (a mask hides what is out of window);
        a ring starts at its window's edge, the oldest position it is sure to hold."""
        w = self.windows[layer]
        if w and self.is_ring(layer):
            return max(0, first_query - w + 1)
        return 0

    # -- prefix reuse ------------------------------------------------------------------------
    def reusable(self, n: int) -> int:
        """The longest prefix (n or 0) of the resident tokens that truncation can keep: the
        keys the next token at position n will attend to must still be in every ring."""
        n = min(n, len(self.tokens))
        if n <= 0:
            return 0
        high = max(self._high, len(self.tokens) - 1)
        for layer, cap in enumerate(self.caps):
            if cap == self.n_ctx or not self.owns(layer):
                continue
            need_from = max(0, n - self.windows[layer] + 1)  # oldest key position n will see
            intact_from = max(self._intact_from[layer], high - cap + 1)  # older slots were overwritten
            if need_from < intact_from:
                return 0
        return n

    def prefill_chunks(self, plan, start: int, n: int) -> list[tuple[int, int]]:
        """How a prefill of positions start..n-1 is cut: the plan's chunks (a recurrent memory
        adds a cut where it wants a state checkpoint, memory/recurrent.py)."""
        return plan.chunks(start, n)

    def rows_kept(self):
        """A context for a speculative verification pass: positional K/V roll back by truncation
        alone; a recurrent memory keeps the state after each row (memory/recurrent.py)."""
        return contextlib.nullcontext()

    def folding(self, start: int, n: int):
        """A context for one forward pass of positions start..start+n-1: nothing to do for
        positional K/V; a recurrent memory moves its state's position (memory/recurrent.py)."""
        return contextlib.nullcontext()

    def checkpoint(self, position: int) -> None:
        """A prefill chunk ended at `position`. Positional K/V need no copy to be truncated back
        there; a recurrent memory keeps its state (memory/recurrent.py)."""

    def truncate(self, n_tokens: int) -> None:
        """Forget positions from n_tokens on (their memory is simply overwritten later). A ring
        that no longer holds what position n_tokens needs is emptied instead (see `reusable`)."""
        if n_tokens > 0 and self.reusable(n_tokens) < min(n_tokens, len(self.tokens)):
            n_tokens = 0
        del self.tokens[n_tokens:]
        self.canonical = min(self.canonical, len(self.tokens))
        if n_tokens == 0:
            self._high = -1
            self._intact_from = [0] * len(self.caps)
