"""A compiled grammar as a Sampler constraint: a token mask per step, advanced per committed token."""

from __future__ import annotations

import llguidance
import numpy as np
import torch

from .closing import CANDIDATES, LIMIT, MARGIN, REFRESH, WATCH, ClosingVocab, closing_path
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
    """

    def __init__(self, ll_tokenizer: llguidance.LLTokenizer, grammar: str, vocab_size: int, param: str | None = None,
                 budget: int | None = None, closing: ClosingVocab | None = None) -> None:
        self.matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"The grammar cannot be used: {engine_message(self.matcher.get_error())}.", param)
        self.vocab_size = vocab_size
        self.n_grammar = ll_tokenizer.vocab_size
        self._bits = np.zeros((self.n_grammar + 31) // 32, dtype=np.int32)
        self.tokens = 0  # committed tokens, for tests and stats
        self.budget = budget if closing is not None else None
        self.closing = closing
        self.eos = ll_tokenizer.eos_token
        self.estimate = 0  # the closing policy's latest count of tokens to the end
        self.steered = 0

    def _allowed_bits(self) -> np.ndarray:
        """Bool array (grammar vocabulary,): which tokens the grammar accepts next."""
        if self.matcher.is_error():
            raise RuntimeError(f"grammar state is broken: {self.matcher.get_error()}")
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")  # token i is bit i%32 of word i//32
        return bits[: self.n_grammar].view(np.bool_)

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

    def _close_within_budget(self, x: np.ndarray) -> None:
        """Near the end of the budget, keep only the likeliest tokens after which the closing
        policy still ends the answer in time (or else the policy's own token)."""
        room = self.budget - self.tokens - 1  # tokens that fit before the end-of-generation token
        if room > self.estimate + WATCH and self.tokens % REFRESH:
            return  # far from the end: no simulation, no cost
        path = closing_path(self.matcher, self.closing, min(room, LIMIT) + WATCH)
        self.estimate = len(path) if path is not None else min(room, LIMIT) + WATCH
        if path is None or room > len(path) + MARGIN:
            return
        top = np.argpartition(x, -CANDIDATES)[-CANDIDATES:]  # O(vocab), not a full sort
        likeliest = top[np.argsort(-x[top], kind="stable")]
        keep = [int(t) for t in likeliest if np.isfinite(x[t]) and self._fits(int(t), room)]
        if not keep:
            keep = [path[0] if path else self.eos]
        self.steered += int(np.argmax(x)) not in keep
        kept = x[keep].copy()
        x[:] = -np.inf
        x[keep] = kept

    def _fits(self, token: int, room: int) -> bool:
        """Whether the closing policy still ends the answer within `room` tokens after `token`."""
        m = self.matcher.deep_copy()
        if not m.consume_token(token):
            return False
        return m.is_stopped() or closing_path(m, self.closing, room - 1) is not None

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token} after {self.tokens} tokens: {self.matcher.get_error()}")
        self.tokens += 1
