"""A compiled grammar as a Sampler constraint: a token mask per step, advanced per committed token."""

from __future__ import annotations

import llguidance
import numpy as np
import torch

from .errors import GrammarError, engine_message


class GrammarConstraint:
    """One request's grammar state (an llguidance matcher).

    `mask` asks the matcher for the allowed set as a bitmask (one bit per token, computed in
    Rust, typically tens of microseconds) and sets every other logit to -inf. `advance` is
    called once per committed token; the end-of-generation tokens are allowed exactly when the
    grammar may end, so a finished grammar stops the answer.
    """

    def __init__(self, ll_tokenizer: llguidance.LLTokenizer, grammar: str, vocab_size: int, param: str | None = None) -> None:
        self.matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"The grammar cannot be used: {engine_message(self.matcher.get_error())}.", param)
        self.vocab_size = vocab_size
        self.n_grammar = ll_tokenizer.vocab_size
        self._bits = np.zeros((self.n_grammar + 31) // 32, dtype=np.int32)
        self.tokens = 0  # committed tokens, for tests and stats

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

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token} after {self.tokens} tokens: {self.matcher.get_error()}")
        self.tokens += 1
