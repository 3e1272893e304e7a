"""The generation loop: prefill with prefix reuse, then one token at a time until a stop rule.

One request at a time owns the KV pool. The pool remembers which tokens its positions
hold, so a request that shares a prefix with the previous one (a system prompt, the
earlier turns of a chat) only prefills what is new — correct by construction, since the
reused positions hold exactly the K/V those same tokens at those same positions produce.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ..memory.kv_pool import KVPool
from ..models.base import DecoderModel
from ..sampling import Sampler


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose K/V came from the cache
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    ttft_s: float = 0.0
    finish_reason: str = ""

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class TokenEvent:
    token: int
    logits: torch.Tensor | None = field(default=None, repr=False)


def prefix_reuse_enabled() -> bool:
    return os.environ.get("TALLOW_PREFIX_CACHE", "1") != "0"


class Engine:
    """Owns the model's KV pool and runs prefill and decode for one request at a time."""

    def __init__(self, model: DecoderModel, n_ctx: int, prefill_chunk: int = 512):
        self.model = model
        self.n_ctx = n_ctx
        self.prefill_chunk = prefill_chunk
        self.kv = KVPool(model.spec, n_ctx)

    def reset(self) -> None:
        self.kv.truncate(0)

    def _common_prefix(self, tokens: list[int]) -> int:
        if not prefix_reuse_enabled():
            return 0
        n = 0
        for a, b in zip(self.kv.tokens, tokens):
            if a != b:
                break
            n += 1
        # The last prompt token is always evaluated: its logits choose the first new token.
        return min(n, len(tokens) - 1)

    def prefill(self, tokens: list[int], stats: GenerationStats) -> torch.Tensor:
        """Make the KV pool hold `tokens`, reusing the common prefix; return the last logits (vocab,)."""
        if not tokens:
            raise ValueError("the prompt has no tokens")
        if len(tokens) > self.n_ctx:
            raise ValueError(f"the prompt has {len(tokens)} tokens, more than the context of {self.n_ctx}")
        t0 = time.perf_counter()
        reuse = self._common_prefix(tokens)
        self.kv.truncate(reuse)
        logits = None
        for start in range(reuse, len(tokens), self.prefill_chunk):
            chunk = tokens[start : start + self.prefill_chunk]
            logits = self.model.forward(chunk, start, self.kv)
        stats.prompt_tokens = len(tokens)
        stats.reused_tokens = reuse
        stats.prefill_tokens = len(tokens) - reuse
        stats.prefill_s = time.perf_counter() - t0
        return logits[-1]

    def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        sampler: Sampler,
        stop_tokens: set[int],
        stats: GenerationStats,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Iterator[int]:
        """Yield generated token ids. Stops on an end-of-generation token (not yielded),
        max_tokens, a full context, or when should_stop() turns true between tokens."""
        t_start = time.perf_counter()
        logits = self.prefill(prompt, stats)
        history = list(prompt)
        stats.finish_reason = "length"
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
                yield token
                history.append(token)
                if should_stop():
                    stats.finish_reason = "stop"
                    break
                if i + 1 == max_tokens:
                    break
                if len(self.kv.tokens) >= self.n_ctx:
                    stats.finish_reason = "length"
                    break
                logits = self.model.forward([token], len(self.kv.tokens), self.kv)[-1]
                stats.decode_tokens += 1
        finally:
            # Also runs when the consumer stops early (a stop string): the counters stay true.
            stats.decode_s = time.perf_counter() - t_decode
