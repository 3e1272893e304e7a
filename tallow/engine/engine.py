"""The generation loop: prefill with prefix reuse, then one token at a time until a stop rule.

One request at a time owns the KV pool. The pool remembers which tokens its positions
hold, so a request that shares a prefix with the previous one (a system prompt, the
earlier turns of a chat) only prefills what is new. Only K/V that are bit for bit what a
cold prefill writes are reused, and the rest is cut into chunks that round as the cold
prefill's do (prefill_plan.py): the same request gives the same greedy answer whatever the
cache — in memory or on disk — holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ..memory.heap import return_freed, trim_between_chunks
from ..memory.kv_store import KVStore, model_fingerprint, persist_enabled
from ..memory.recurrent import make_memory
from ..models.base import DecoderModel
from ..models.step import VERIFY
from ..sampling import Sampler
from .prefill_plan import PrefillPlan, numerics_key, plan_for
from .speculate import K_MAX, Speculation, speculation_enabled
from .. import switches


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose K/V came from the cache (memory or disk)
    reused_from_disk: int = 0  # of those, tokens hydrated from the conversation's KV file
    prefill_tokens: int = 0  # prompt tokens run through the model
    prefill_s: float = 0.0
    saved_s: float = 0.0  # estimated prefill time the reuse saved (reused tokens / measured prefill rate)
    decode_tokens: int = 0
    decode_s: float = 0.0
    ttft_s: float = 0.0
    finish_reason: str = ""
    draft_tokens: int = 0  # prompt-lookup drafts verified (speculative decoding)
    accepted_tokens: int = 0  # of those, drafts that became generated tokens
    grammar_steered: int = 0  # tokens a grammar chose over the model's to end inside max_tokens (grammar/closing.py)
    machine: dict = field(default_factory=dict)  # clocks, temperature, power, load read as it ended (kernels/gpu/machine_state.py)

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


def wait_for_device(device: torch.device) -> None:
    """Block until the device has finished the work queued on it, so a host clock read next
    times that work (CUDA kernels run asynchronously; the CPU path is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prefix_reuse_enabled() -> bool:
    return switches.enabled("TALLOW_PREFIX_CACHE")


def _shared(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Engine:
    """Owns the model's KV pool and runs prefill and decode for one request at a time."""

    def __init__(self, model: DecoderModel, n_ctx: int, prefill_chunk: int = 512, kv_store_dir: str | None = None,
                 kv_dtype: str | None = None):
        self.model = model
        self.n_ctx = n_ctx
        self.prefill_chunk = prefill_chunk
        # Sliding-window layers hold rings sized for one prefill chunk beyond their window.
        # (Recurrent layers add their fixed-size state: memory/recurrent.py.)
        self.kv = make_memory(model.spec, n_ctx, kv_dtype or "f16", device=model.device, max_chunk=prefill_chunk)
        self._graph = None  # the CUDA-graph decode step, captured on first use (GPU only)
        self._prefill_graphs = None  # CUDA graphs of prefill chunks by length bucket (GPU only)
        self._row_graphs = None  # CUDA graphs of speculative verification passes by size (GPU only)
        self.prefill_rate = 0.0  # tok/s of the latest prefill of >= 64 tokens, to price reuse
        self.kv_store_dir = kv_store_dir  # None: $TALLOW_HOME/kv
        self._kv_store: KVStore | None = None
        self._numerics = ""  # numerics_key of the plan that wrote the pool's canonical K/V

    @property
    def kv_store(self) -> KVStore:
        """The persistent store, created on first use (hashing the GGUF header costs a few ms)."""
        if self._kv_store is None:
            self._kv_store = KVStore(self.model.spec, model_fingerprint(self.model.gf.header_bytes()), self.kv_store_dir)
        self._kv_store.numerics = self._numerics  # saved with the pool; a file's canonical K/V count only under it
        return self._kv_store

    def prefill_plan(self) -> PrefillPlan:
        """The plan for this prefill (switches are read per request). Canonical K/V written
        under other numerics (a switch flipped since) are canonical no more."""
        plan = plan_for(self.model, self.prefill_chunk)
        key = numerics_key(self.model, plan)
        if key != self._numerics:
            self.kv.canonical = 0
            self._numerics = key
        return plan

    def _reuse_point(self, plan: PrefillPlan, tokens: list[int], pool_tokens: list[int], canonical: int) -> int:
        if not prefix_reuse_enabled():
            return 0
        return plan.start(_shared(pool_tokens, tokens), canonical, len(tokens))

    def hydrate(self, conversation_id: str, tokens: list[int]) -> int:
        """Load a conversation's saved KV when more of `tokens` can be reused from it than from
        the resident pool; returns how many prompt tokens the loaded file covers (0: not loaded)."""
        if not persist_enabled() or not prefix_reuse_enabled():
            return 0
        plan = self.prefill_plan()
        resident = self.kv.reusable(self._reuse_point(plan, tokens, self.kv.tokens, self.kv.canonical))
        saved, canonical = self.kv_store.peek(conversation_id)
        on_disk = self._reuse_point(plan, tokens, saved, canonical)
        if on_disk <= resident or on_disk < 2:
            return 0
        loaded = self.kv_store.load(conversation_id, self.kv)
        return min(_shared(self.kv.tokens, tokens), loaded)

    def persist(self, conversation_id: str) -> None:
        """Save the pool for the conversation; a full disk warns rather than failing the answer."""
        if persist_enabled():
            self.kv_store.try_save(conversation_id, self.kv)

    def reset(self) -> None:
        self.kv.truncate(0)

    def decode_step(self, token: int) -> torch.Tensor:
        """Run one token at the next position; logits (vocab,). On the GPU through a replayed
        CUDA graph, elsewhere the eager forward pass."""
        position = len(self.kv.tokens)
        if self.model.device.type != "cuda":
            return self.model.forward([token], position, self.kv)[-1]
        if self._graph is None:
            from .graphs import GraphDecoder

            self._graph = GraphDecoder(self.model, self.kv, self.model.device)
        logits = self._graph.step(token, position)
        self.kv.mark_written(position)
        self.kv.tokens.append(token)
        return logits

    def decode_rows(self, tokens: list[int]) -> torch.Tensor:
        """Run 2..8 tokens at the next positions in one pass (verifying speculative drafts);
        logits (m, vocab), row i bit-identical to decode_step's for token i where the model's
        matrices are row-exact (speculate.rows_are_exact). On the GPU a replayed CUDA graph per
        pass size (graphs.RowGraphs); elsewhere the eager VERIFY step, attention query by query
        as decode computes it (step.EagerRowsAttention)."""
        start = len(self.kv.tokens)
        if self.model.device.type != "cuda":
            with self.kv.rows_kept():  # a recurrent memory keeps each row's state, to roll back to
                return self.model.forward(tokens, start, self.kv, all_logits=True, phase=VERIFY)  # keeps kv.tokens
        if self._row_graphs is None:
            from .graphs import RowGraphs

            self._row_graphs = RowGraphs(self.model, self.kv, self.model.device, K_MAX + 1)
        logits = self._row_graphs.run(tokens, start)
        self.kv.tokens.extend(tokens)
        return logits

    def prefill_chunk_at(self, chunk: list[int], start: int) -> torch.Tensor:
        """Write the K/V of `chunk` at positions start.. and return the logits of its last token
        ((1, vocab)): on the GPU from a replayed CUDA graph of the chunk's length bucket
        (graphs.PrefillGraphs), elsewhere (or when no bucket fits) the eager forward pass."""
        if self.model.device.type == "cuda":
            from .graphs import PrefillGraphs, prefill_graphs_enabled

            if self._prefill_graphs is None and prefill_graphs_enabled():
                self._prefill_graphs = PrefillGraphs(self.model, self.kv, self.model.device)
            if self._prefill_graphs is not None:
                logits = self._prefill_graphs.run(chunk, start)
                if logits is not None:
                    del self.kv.tokens[start:]
                    self.kv.tokens.extend(chunk)
                    return logits.unsqueeze(0)
        return self.model.forward(chunk, start, self.kv)

    def prefill(self, tokens: list[int], stats: GenerationStats, should_stop: Callable[[], bool] | None = None) -> torch.Tensor | None:
        """Make the KV pool hold `tokens`, reusing the common prefix; return the last logits (vocab,).

        should_stop() is asked between prefill chunks: a client that went away during a long
        prompt frees the engine after at most one chunk. Then None is returned, and the pool
        holds the chunks done so far (a valid prefix the next request may reuse)."""
        if not tokens:
            raise ValueError("the prompt has no tokens")
        if len(tokens) > self.n_ctx:
            raise ValueError(f"the prompt has {len(tokens)} tokens, more than the context of {self.n_ctx}")
        t0 = time.perf_counter()
        plan = self.prefill_plan()
        # A sliding-window ring may have overwritten what that point needs: then reuse nothing.
        reuse = self.kv.reusable(self._reuse_point(plan, tokens, self.kv.tokens, self.kv.canonical))
        self.kv.truncate(reuse)
        logits = None
        for start, end in self.kv.prefill_chunks(plan, reuse, len(tokens)):  # plan.chunks, or cut for a recurrent state
            if should_stop is not None and start > reuse and should_stop():
                logits = None
                break
            logits = self.prefill_chunk_at(tokens[start:end], start)
            if self.model.device.type == "cpu" and trim_between_chunks():
                return_freed()  # this chunk's freed temporaries must not stay resident beside the next one's
            self.kv.checkpoint(end)  # a recurrent state is kept here to be reused (a no-op for K/V)
            if plan.extends_canonical(start, end, self.kv.canonical):
                self.kv.canonical = end
        stats.prompt_tokens = len(tokens)
        stats.reused_tokens = reuse
        stats.prefill_tokens = len(tokens) - reuse
        wait_for_device(self.model.device)  # a GPU prefill is queued, not done, when the loop returns
        stats.prefill_s = time.perf_counter() - t0
        # Price the reuse at the rate of the last real prefill; a short one is dominated by
        # per-call overhead, so only prefills of >= 64 tokens set the rate.
        rate = self.prefill_rate or (stats.prefill_tokens / stats.prefill_s if stats.prefill_tokens >= 16 else 0.0)
        stats.saved_s = reuse / rate if rate > 0 else 0.0
        if stats.prefill_tokens >= 64:
            self.prefill_rate = stats.prefill_tokens / stats.prefill_s
        return None if logits is None else logits[-1]

    def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        sampler: Sampler,
        stop_tokens: set[int],
        stats: GenerationStats,
        should_stop: Callable[[], bool] = lambda: False,
        conversation_id: str | None = None,
        observe: Callable[[int, torch.Tensor], None] | None = None,
    ) -> Iterator[int]:
        """Yield generated token ids. Stops on an end-of-generation token (not yielded),
        max_tokens, a full context, or when should_stop() turns true between tokens.

        observe(token, logits), if given, sees each yielded token with the logits it came from.
        With a conversation id the pool is hydrated from the conversation's saved KV first
        (when that covers more of the prompt than what is resident) and saved at the end.
        """
        t_start = time.perf_counter()
        from_disk = self.hydrate(conversation_id, prompt) if conversation_id else 0
        logits = self.prefill(prompt, stats, should_stop)
        if logits is None:  # cancelled during the prompt
            stats.finish_reason = "stop"
            return
        stats.reused_from_disk = min(from_disk, stats.reused_tokens)
        history = list(prompt)
        stats.finish_reason = "length"
        # Whether the memory can roll back a rejected draft (a recurrent one: memory/recurrent.py).
        speculative = speculation_enabled(self.model, self.kv) and self.kv.can_rollback
        speculation = Speculation(self, stats, getattr(sampler, "constraint", None)) if speculative else None
        t_decode = time.perf_counter()
        try:
            for i in range(max_tokens):
                token = sampler.sample(logits, history)
                if i == 0:
                    stats.ttft_s = time.perf_counter() - t_start
                    t_decode = time.perf_counter()
                if token in stop_tokens:
                    stats.finish_reason = "stop"
                    break
                if observe is not None:
                    observe(token, logits)  # e.g. logprobs, from the logits the token was drawn from
                yield token
                history.append(token)
                if should_stop():
                    stats.finish_reason = "stop"
                    break
                if i + 1 == max_tokens:
                    break
                if len(history) - 1 >= self.n_ctx:  # the pool is full (drafts not yet accepted aside)
                    stats.finish_reason = "length"
                    break
                if speculation is None:
                    logits = self.decode_step(token)
                else:  # drafts only as far as the context and max_tokens can use them
                    logits = speculation.next_logits(token, history, min(max_tokens - i - 2, self.n_ctx - len(history)))
                stats.decode_tokens += 1
        finally:
            # Also runs when the consumer stops early (a stop string): the counters stay true.
            wait_for_device(self.model.device)
            stats.decode_s = time.perf_counter() - t_decode
            if speculation is not None:
                speculation.close(len(prompt) + stats.decode_tokens)
            if conversation_id:
                self.persist(conversation_id)
