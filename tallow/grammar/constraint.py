"""A compiled grammar as a Sampler constraint: a token mask per step, advanced per committed token."""

from __future__ import annotations

import llguidance
import numpy as np
import torch

from .closing import CANDIDATES, LIMIT, MARGIN, REFRESH, ClosingVocab, closing_path
from .errors import GrammarError, engine_message


class GrammarConstraint:
    """One request's grammar state (an llguidance matcher).

    `mask` asks the matcher for the allowed set as a bitmask (one bit per token, computed in
    Rust, typically tens of microseconds) and sets every other logit to -inf. `advance` is
    called once per committed token; the end-of-generation tokens are allowed exactly when the
    grammar may end, so a finished grammar stops the answer.

    With a `budget` (the samples the answer may take, its end-of-generation token included) and
    the `closing` vocabulary, the mask also steers the answer to end inside the budget
    (closing.py); `steered` counts the tokens where that overruled the model's first choice.
    `greedy`: only the likeliest token that fits needs keeping (sampling keeps every one that
    fits among the CANDIDATES likeliest).
    """

    def __init__(self, ll_tokenizer: llguidance.LLTokenizer, grammar: str, vocab_size: int, param: str | None = None,
                 budget: int | None = None, closing: ClosingVocab | None = None, greedy: bool = False) -> None:
        self.matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"The grammar cannot be used: {engine_message(self.matcher.get_error())}.", param)
        self.param = param
        self.vocab_size = vocab_size
        self.n_grammar = ll_tokenizer.vocab_size
        self._bits = np.zeros((self.n_grammar + 31) // 32, dtype=np.int32)
        self.tokens = 0  # committed tokens, for tests and stats
        self.budget = budget if closing is not None else None
        self.closing = closing
        self.eos = ll_tokenizer.eos_token
        self.greedy = greedy
        self.estimate = 0  # the closing policy's latest count of tokens to the end
        self._path: list[int] | None = None  # the closing policy's path from the state after `_path_at` tokens
        self._path_at = -1
        self._after: dict[int, list[int]] = {}  # paths from after each candidate that fits, this step
        self.steered = 0
        self._words_at = -1  # the committed-token count `_bits` holds the mask for

    def prepare(self) -> None:
        """Compute the next mask now. The sampler calls this before it copies the logits off the
        GPU, so the mask is built on the CPU while the GPU still runs the decode step."""
        self._words()

    def _words(self) -> np.ndarray:
        """The next mask as llguidance's int32 words (token i is bit i % 32 of word i // 32),
        computed once per committed token."""
        if self._words_at != self.tokens:
            self._check_engine()
            self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            self._check_engine()
            self._words_at = self.tokens
        return self._bits

    def _allowed_bits(self) -> np.ndarray:
        """Bool array (grammar vocabulary,): which tokens the grammar accepts next."""
        bits = np.unpackbits(self._words().view(np.uint8), bitorder="little")
        return bits[: self.n_grammar].view(np.bool_)

    def allowed_words(self) -> np.ndarray:
        """The next mask as int32 words: what a sampler applies on the GPU (a few KB go up
        instead of the logits coming down)."""
        return self._words()

    def allowed(self) -> torch.Tensor:
        """Bool tensor (vocab_size,): which tokens the grammar accepts next."""
        out = torch.zeros(self.vocab_size, dtype=torch.bool)
        n = min(self.n_grammar, self.vocab_size)
        out[:n] = torch.from_numpy(self._allowed_bits()[:n].copy())
        return out

    def mask(self, logits: torch.Tensor) -> None:
        # In numpy, single-threaded: a torch elementwise op over the vocabulary runs on the
        # intra-op thread pool, whose barrier costs milliseconds on a busy 2-core machine.
        x = logits.numpy()
        n = min(self.n_grammar, self.vocab_size)
        np.putmask(x[:n], ~self._allowed_bits()[:n], -np.inf)
        x[n:] = -np.inf  # logits rows past the grammar's vocabulary are never allowed
        if self.budget is not None:
            self._close_within_budget(x)

    def steering(self) -> bool:
        """Whether this step is close enough to the end of the budget that `mask` steers the
        choice (and so needs the logits): the closing policy's count, refreshed near the end."""
        if self.budget is None:
            return False
        room = self.budget - self.tokens - 1  # tokens that fit before the end-of-generation token
        if self._path_at != self.tokens:
            if room > self.estimate + MARGIN + REFRESH and self.tokens % REFRESH:
                return False  # far from the end: no simulation, no cost
            self._path, self._path_at = closing_path(self.matcher, self.closing, min(room, LIMIT) + MARGIN), self.tokens
        path = self._path
        # No path: the policy cannot end within its limit from here; look again every REFRESH
        # tokens (an estimate of 0), not at every token (each look is a full simulation).
        self.estimate = len(path) if path is not None else 0
        return path is not None and room <= len(path) + MARGIN

    def _close_within_budget(self, x: np.ndarray) -> None:
        """Near the end of the budget, keep only the likeliest tokens after which the closing
        policy still ends the answer in time (or else the policy's own token)."""
        if not self.steering():
            return
        room, path = self.budget - self.tokens - 1, self._path
        keep: dict[int, float] = {}  # token -> its logit
        first = int(np.argmax(x))
        for _ in range(CANDIDATES):  # argmax after argmax: a partition of 262k logits costs ~8 ms
            t = int(np.argmax(x))
            if not np.isfinite(x[t]) or (keep and self.greedy):
                break  # nothing allowed left, or greedy has its token
            if self._fits(t, room):
                keep[t] = float(x[t])
            x[t] = -np.inf
        if not keep:
            keep = {path[0] if path else self.eos: 0.0}
        self.steered += first not in keep
        x[:] = -np.inf
        x[list(keep)] = list(keep.values())

    def _fits(self, token: int, room: int) -> bool:
        """Whether the closing policy still ends the answer within `room` tokens after `token`
        (its path is kept: if `token` is taken, the next step needs no simulation)."""
        if token in self._after:
            return True
        m = self.matcher.deep_copy()
        if not m.consume_token(token):
            return False
        path = [] if m.is_stopped() else closing_path(m, self.closing, room - 1)
        if path is not None:
            self._after[token] = path
        return path is not None

    def _check_engine(self) -> None:
        """The engine gives up on grammars too complex to run ("Too many items", "too many
        expressions": `"a"{1000000}`, a 1 MB literal) only once decoding starts. That is the
        request's fault: a GrammarError (400) with the engine's first line, not its whole state."""
        if self.matcher.is_error():
            raise GrammarError(f"The grammar is too complex for constrained decoding: {engine_message(self.matcher.get_error())}.", self.param)

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            self._check_engine()
            raise RuntimeError(f"the grammar refused token {token} after {self.tokens} tokens")
        self.tokens += 1
        if token in self._after:
            self._path, self._path_at = self._after[token], self.tokens
        self._after = {}
