"""Recurrent memory: the fixed-size state of a model's Mamba layers, beside the KV of its
attention layers (none for mamba/mamba2), composed the way llama.cpp's llama-memory-hybrid
composes its KV cache and its recurrent memory.

Per recurrent layer (ssm_spec.SSMSpec): a conv state, the last d_conv - 1 inputs of its conv1d,
and an SSM state (n_head, head_dim, d_state), both float32. Their size does not grow with the
context: a 32k-token conversation holds the same bytes as a 1-token one.

What that changes for the features built on truncatable positional K/V — each asks the memory:
- Prefix reuse. A recurrent state cannot be truncated: it is the whole sequence folded into
  one value. The memory keeps checkpoints, copies of the state at positions it was at: the end
  of every prefill chunk (engine.prefill calls `checkpoint`), the latest TALLOW_STATE_CHECKPOINTS
  of them, plus the live state at the end of the resident tokens; with a row-invariant plan
  the last chunk is cut min_rows before the end (`prefill_chunks`), where the same prompt again
  would resume. `reusable(n)` answers the
  longest checkpointed prefix <= n, and `truncate` restores that checkpoint (or empties the
  memory). The engine's prefill plan still decides which positions are canonical.
- Speculation rollback (`can_rollback`): exact. A verification pass (the engine wraps it in
  `rows_kept()`) runs each row's recurrent part as a one-token decode step would; the memory
  keeps the state at the pass's start and each layer's way to fold each row again (the row's
  mixer input, a few KB). Truncating to a row's position restores the start and re-folds the
  accepted rows, the same ops on the same inputs, so the same state: one copy of the state
  held, not one per row (for Falcon-H1-1.5B 73 MiB, not 584). Verification is then bit-exact
  wherever the projections are row-exact (engine/speculate.rows_are_exact), which is when
  speculation is on by default.
- Persistence: a conversation's file (memory/kv_store.py) holds, beside the
  tokens (and any attention K/V), the live state and the checkpoints: a restored conversation
  reuses what a resident one would.
- CUDA graphs and padded rows: the mixer's ops take `n_valid` (a device tensor in a padded
  prefill graph), so padding never advances a state. The states are device tensors updated in
  place, so a replayed graph reads and writes the live state; a replay's caller brackets it
  with `folding` (the host position), and capturing saves and restores the state around the
  warm-up runs, which execute (engine/graphs.py).
- Speculation on the GPU: not yet (`can_rollback` is False there): a verification graph would
  have to keep each row's state on the device.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from contextlib import contextmanager

import torch

from .. import switches
from ..spec import ModelSpec
from .kv_pool import KVPool


# Where the last prefill chunk is cut, in min_rows before the prompt's end (prefill_chunks).
TAIL_CUTS = (2, 1)


def max_checkpoints() -> int:
    """TALLOW_STATE_CHECKPOINTS: how many prefill-chunk-boundary state copies are kept (0: none)."""
    return int(switches.value("TALLOW_STATE_CHECKPOINTS"))


class RecurrentState:
    """The conv and SSM state of every recurrent layer, and the position they have reached."""

    def __init__(self, spec: ModelSpec, device: torch.device | str = "cpu"):
        ssm = spec.ssm
        self.ssm = ssm
        self.conv = {i: torch.zeros(ssm.d_conv - 1, ssm.conv_channels, device=device) for i in ssm.layers}
        self.scan = {i: torch.zeros(ssm.n_head, ssm.head_dim, ssm.d_state, device=device) for i in ssm.layers}
        self.position = 0  # tokens folded into the states

    def tensors(self) -> list[torch.Tensor]:
        return [t for i in self.ssm.layers for t in (self.conv[i], self.scan[i])]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def reset(self) -> None:
        for t in self.tensors():
            t.zero_()
        self.position = 0

    def snapshot(self) -> list[torch.Tensor]:
        return [t.clone() for t in self.tensors()]

    def restore(self, saved: list[torch.Tensor], position: int) -> None:
        for t, s in zip(self.tensors(), saved):
            t.copy_(s)
        self.position = position


class RecurrentMemory(KVPool):
    """A KVPool over the model's attention layers plus the recurrent state of its Mamba layers.
    Everything the engine asks of a pool (tokens, canonical, reusable, truncate) answers for both."""

    can_rollback = True  # speculation's rollback (engine/speculate.py): to any row of a verification pass

    def __init__(self, spec: ModelSpec, n_ctx: int, dtype="f16", device="cpu", ring=None, max_chunk: int = 512):
        super().__init__(spec, n_ctx, dtype, device, ring, max_chunk)
        self.state = RecurrentState(spec, device)
        self.can_rollback = torch.device(device).type == "cpu"  # the GPU's verification graphs keep no row states
        self.checkpoints: OrderedDict[int, list[torch.Tensor]] = OrderedDict()  # position -> state copies
        self.keep = max_checkpoints()
        self.keeping_rows = False  # inside rows_kept(): the mixer records how to fold each row again
        self.pass_start: tuple[int, list[torch.Tensor]] | None = None  # a verification pass's start: position, state
        self.refolds: dict[int, list[Callable[[], object]]] = {}  # layer -> its rows' re-folds, in row order

    @property
    def nbytes(self) -> int:
        """The attention layers' KV plus the live state (checkpoints: `checkpoint_bytes`)."""
        return super().nbytes + self.state.nbytes

    @property
    def checkpoint_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for saved in self.checkpoints.values() for t in saved)

    # -- the mixer's side ------------------------------------------------------------------
    def begin(self, start: int) -> None:
        """A forward pass is about to fold positions start.. into the state: it must continue the
        state exactly where it is (a recurrent state cannot jump), and checkpoints past start
        belong to a continuation that is being replaced."""
        if start != self.state.position:
            raise ValueError(f"the recurrent state holds {self.state.position} tokens; it cannot continue at position {start}")
        for p in [p for p in self.checkpoints if p > start]:
            del self.checkpoints[p]
        self.refolds = {}
        self.pass_start = (start, self.state.snapshot()) if self.keeping_rows else None

    @contextmanager
    def folding(self, start: int, n: int):
        """Within: one forward pass folds positions start..start+n-1 into the state (`begin`
        first; `advance` after). If it fails, some layers' states moved on and others did not:
        none can be trusted, so the memory empties."""
        self.begin(start)
        try:
            yield
        except BaseException:
            self.truncate(0)
            raise
        self.advance(n)

    @contextmanager
    def rows_kept(self):
        """Within: a forward pass of several rows can be rolled back to after any of its rows."""
        self.keeping_rows = True
        try:
            yield
        finally:
            self.keeping_rows = False

    def keep_row(self, layer: int, refold: Callable[[], object]) -> None:
        """The mixer of `layer` has folded this pass's next row into its states; `refold()` folds
        the same row into them again (its output unused)."""
        self.refolds.setdefault(layer, []).append(refold)

    def _rows_refoldable(self) -> int:
        """How many rows of the last verification pass can be folded again in every layer."""
        if self.pass_start is None:
            return 0
        return min((len(self.refolds.get(i, ())) for i in self.state.ssm.layers), default=0)

    def _refold(self, n_tokens: int) -> None:
        """The state after row n_tokens - start - 1 of the last pass: its start, rows re-folded."""
        start, saved = self.pass_start
        self.state.restore(saved, start)
        for i in self.state.ssm.layers:
            for refold in self.refolds[i][: n_tokens - start]:
                refold()
        self.state.position = n_tokens

    def advance(self, n: int) -> None:
        self.state.position += n

    # -- persistence (memory/kv_store.py) ----------------------------------------------------
    def saved_positions(self) -> list[int]:
        """The positions whose states a save writes: the checkpoints, then the live state."""
        return list(self.checkpoints) + ([self.state.position] if self.state.position not in self.checkpoints else [])

    def saved_states(self) -> list[list[torch.Tensor]]:
        live = [] if self.state.position in self.checkpoints else [self.state.tensors()]
        return list(self.checkpoints.values()) + live

    def load_states(self, positions: list[int], raws: list[bytearray]) -> None:
        """Hydrate from a file's states (KVStore._load, after the tokens and K/V): each raw block
        is one state's tensors in `state.tensors()` order; the one at the end of the tokens is live."""
        n = len(self.tokens)
        shapes = [t.shape for t in self.state.tensors()]
        self.checkpoints.clear()
        for position, raw in zip(positions, raws):
            flat = torch.frombuffer(raw, dtype=torch.float32)
            saved, done = [], 0
            for shape in shapes:
                size = shape.numel()
                saved.append(flat[done : done + size].view(shape).to(self.state.conv[self.state.ssm.layers[0]].device))
                done += size
            if position == n:
                self.state.restore(saved, n)
            self.checkpoints[position] = saved
        if self.state.position != n:  # no live state saved: the tokens past the last checkpoint are not held
            self.truncate(max((p for p in self.checkpoints if p <= n), default=0))
        while len(self.checkpoints) > max(self.keep, 0) + (1 if n in self.checkpoints else 0):
            self.checkpoints.popitem(last=False)

    # -- the engine's side -----------------------------------------------------------------
    def checkpoint(self, position: int) -> None:
        """Keep a copy of the state if it is at `position` (the end of a prefill chunk)."""
        if self.keep <= 0 or position != self.state.position or position <= 0:
            return
        self.checkpoints[position] = self.state.snapshot()
        self.checkpoints.move_to_end(position)
        while len(self.checkpoints) > self.keep:
            self.checkpoints.popitem(last=False)

    def prefill_chunks(self, plan, start: int, n: int) -> list[tuple[int, int]]:
        """The plan's chunks, the last one cut 2·min_rows and min_rows before the end where the
        plan is row-invariant, so checkpoints land there: the same prompt again (a retry, a
        regenerated answer) reuses all but its last min_rows tokens (the plan always recomputes
        those), and a prompt that shares all but the last question of up to 2·min_rows tokens
        (a long system prompt or document, another question) reuses all but 2·min_rows — not
        the whole last chunk (docs/performance.md, "Shared-prefix TTFT on a recurrent model").
        Every part keeps >= min_rows rows, so the numbers are the uncut chunk's and stay canonical.
        A cut goes into whichever chunk holds it (the last chunk may be only min_rows long). With
        the default 4 checkpoints these two and the end evict all chunk ends but the last."""
        chunks = plan.chunks(start, n)
        if self.keep > 0 and plan.stable and plan.row_invariant:
            m = plan.min_rows
            for cut in sorted({n - k * m for k in TAIL_CUTS}):  # into whichever chunk holds it
                for i, (a, b) in enumerate(chunks):
                    if a + m <= cut <= b - m:
                        chunks[i : i + 1] = [(a, cut), (cut, b)]
                        break
        return chunks

    def reusable(self, n: int) -> int:
        """The longest prefix <= n a state exists for: the live state's (when n reaches the end
        of the resident tokens) or a checkpoint's; 0 when none does. (A pool answers n or 0;
        this memory may answer a shorter prefix, which the engine then truncates to.)"""
        n = min(n, len(self.tokens))
        if n <= 0:
            return 0
        if n == self.state.position:  # the live state (inside truncate: just restored there)
            p = n
        else:
            p = max((c for c in self.checkpoints if c <= n), default=0)
        return p if p and super().reusable(p) == p else 0

    def truncate(self, n_tokens: int) -> None:
        n_tokens = max(0, min(n_tokens, len(self.tokens)))
        if n_tokens != self.state.position:
            start = self.pass_start[0] if self.pass_start is not None else -1
            if n_tokens in self.checkpoints and super().reusable(n_tokens) == n_tokens:
                self.state.restore(self.checkpoints[n_tokens], n_tokens)
            elif start <= n_tokens <= start + self._rows_refoldable():  # a row of the last verification pass
                self._refold(n_tokens)
            else:
                n_tokens = 0
        if n_tokens == 0:
            self.state.reset()
            self.checkpoints.clear()
        if self.pass_start is not None and n_tokens < self.pass_start[0]:
            self.pass_start, self.refolds = None, {}
        for p in [p for p in self.checkpoints if p > n_tokens]:
            del self.checkpoints[p]
        super().truncate(n_tokens)


def make_memory(spec: ModelSpec, n_ctx: int, dtype="f16", device="cpu", max_chunk: int = 512) -> KVPool:
    """The memory a model needs: a KVPool, or for a model with recurrent layers a RecurrentMemory."""
    if spec.ssm is not None:
        return RecurrentMemory(spec, n_ctx, dtype, device=device, max_chunk=max_chunk)
    return KVPool(spec, n_ctx, dtype, device=device, max_chunk=max_chunk)
