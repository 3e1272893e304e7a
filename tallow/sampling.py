"""Token sampling, following llama.cpp's default sampler chain.

llama.cpp (common/sampling.cpp) applies, in order: penalties -> top_k -> top_p -> min_p ->
temperature -> draw (the DRY/typical/XTC/top-n-sigma stages are off by default and not
implemented here).  Each stage below is a small function over a candidate set that mirrors
the corresponding `llama_sampler_*_apply` in llama.cpp's src/llama-sampling.cpp, including its
edge cases, so that greedy decoding is token-identical and filtered sampling keeps exactly
the same candidates.  The final random draw cannot be bit-identical (llama.cpp uses
std::mt19937); we use a seeded `torch.Generator` so a given seed is reproducible here.

Candidates are kept as two parallel 1-D tensors (token ids, logits).  Until the first stage
that needs an order, they are in vocabulary order; `top_k`/`top_p` sort them by descending
logit with ties broken by lower token id, which is the order llama.cpp's greedy/temp-0 path
effectively uses ("first max wins").
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .errors import UsageError
from . import switches

__all__ = ["Constraint", "Sampler", "SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """User-facing sampling settings; defaults are llama.cpp's (`common_params_sampling`).

    temperature: 0 (or less is rejected) means greedy: argmax after penalties.
    top_k: keep the k most likely tokens; 0 disables.
    top_p: nucleus sampling; 1.0 disables.
    min_p: drop tokens whose probability is below min_p * p(max); 0 disables.
    repeat_penalty: divide positive / multiply non-positive logits of recent tokens; 1 disables.
    repeat_last_n: how many of the most recent history tokens the penalties look at;
        0 disables penalties, -1 means the whole history.
    presence_penalty / frequency_penalty: subtract once / per occurrence (OpenAI style).
    seed: None for a fresh random seed each Sampler.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_float("temperature", self.temperature, lo=0.0)
        _check_int("top_k", self.top_k, lo=0)
        _check_float("top_p", self.top_p, lo=0.0, hi=1.0)
        _check_float("min_p", self.min_p, lo=0.0, hi=1.0)
        _check_float("repeat_penalty", self.repeat_penalty, lo=0.0, lo_open=True)
        _check_int("repeat_last_n", self.repeat_last_n, lo=-1)
        _check_float("presence_penalty", self.presence_penalty)
        _check_float("frequency_penalty", self.frequency_penalty)
        if self.seed is not None:
            _check_int("seed", self.seed, lo=0, hi=2**64 - 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalties_active(self) -> bool:
        """Same early-out as llama.cpp's penalties sampler."""
        return self.repeat_last_n != 0 and not (
            self.repeat_penalty == 1.0
            and self.presence_penalty == 0.0
            and self.frequency_penalty == 0.0
        )


def _check_float(
    name: str,
    value: object,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
    ):
        raise UsageError(f"{name} must be a finite number, got {value!r}.")
    if lo is not None and (value <= lo if lo_open else value < lo):
        bound = f"greater than {lo:g}" if lo_open else f"at least {lo:g}"
        raise UsageError(f"{name} must be {bound}, got {value!r}.")
    if hi is not None and value > hi:
        raise UsageError(f"{name} must be at most {hi:g}, got {value!r}.")


def _check_int(
    name: str, value: object, lo: int | None = None, hi: int | None = None
) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an integer, got {value!r}.")
    if lo is not None and value < lo:
        raise UsageError(f"{name} must be at least {lo}, got {value!r}.")
    if hi is not None and value > hi:
        raise UsageError(f"{name} must be at most {hi}, got {value!r}.")


# ----------------------------------------------------------------------------- stages
# Each stage takes and returns (ids, logits); `ids` is int64, `logits` float32, same length.

Candidates = tuple[torch.Tensor, torch.Tensor]


def apply_penalties(
    logits: torch.Tensor, history: list[int], params: SamplingParams
) -> torch.Tensor:
    """llama_sampler_penalties_apply, on the full vocabulary (returns a new tensor).

    For each distinct token among the last `repeat_last_n` of `history` seen `count` times:
    logit <= 0 is multiplied by repeat_penalty, logit > 0 divided by it (dividing a negative
    logit would *raise* its probability), then count * frequency + presence is subtracted.
    """
    if not params.penalties_active or not history:
        return logits
    window = history if params.repeat_last_n < 0 else history[-params.repeat_last_n :]
    counts = Counter(t for t in window if 0 <= t < logits.shape[0])
    if not counts:
        return logits
    out = logits.clone()
    ids = torch.tensor(list(counts.keys()), dtype=torch.long)
    cnt = torch.tensor(list(counts.values()), dtype=torch.float32)
    sel = out[ids]
    sel = torch.where(
        sel <= 0, sel * params.repeat_penalty, sel / params.repeat_penalty
    )
    sel = sel - (cnt * params.frequency_penalty + params.presence_penalty)
    out[ids] = sel
    return out


def sort_candidates(cand: Candidates) -> Candidates:
    """Descending logit, ties by ascending token id (input is assumed id-ascending)."""
    ids, logits = cand
    order = torch.sort(logits, descending=True, stable=True).indices
    return ids[order], logits[order]


def best(cand: Candidates, m: int) -> Candidates:
    """Exactly the m best candidates in (logit desc, id asc) order, without sorting them all.

    A full sort of a 262k vocabulary costs tens of ms per token; `topk` is ~1 ms.  `topk`
    gives no guarantee about which of several equal values it picks at the cut, so when the
    m-th value is tied with candidates left outside we fall back to the exact full sort.
    """
    ids, logits = cand
    n = logits.shape[0]
    if m >= n:
        return sort_candidates(cand)
    vals, pos = torch.topk(logits, m)
    kth = vals[-1]
    if int((logits == kth).sum()) != int((vals == kth).sum()):
        s_ids, s_logits = sort_candidates(cand)
        return s_ids[:m], s_logits[:m]
    pos = torch.sort(
        pos
    ).values  # back to input (id-ascending) order, then stable by value
    return sort_candidates((ids[pos], logits[pos]))


def top_k(cand: Candidates, k: int) -> Candidates:
    """Keep exactly the k best (k <= 0: no-op), sorted.  Ties at the cut keep the lower ids."""
    if k <= 0:
        return cand
    return best(cand, k)


def top_p(cand: Candidates, p: float) -> Candidates:
    """Smallest prefix (by probability) whose cumulative probability reaches p; >=1 token.

    Probabilities are a softmax over all current candidates.  They are accumulated in
    float64: llama.cpp sums float32 sequentially, whose rounding we cannot reproduce
    anyway, and over a flat 100k-token tail float32 drifts by ~1e-4.  We look at growing
    top-m prefixes so a peaked distribution over a 262k vocabulary is never fully sorted.
    """
    if p >= 1.0:
        return cand
    _ids, logits = cand
    n = logits.shape[0]
    log_z = torch.logsumexp(logits.double(), dim=0)
    m = min(n, 256)
    while True:
        if m * 8 > n:
            m = n  # a big top-k costs as much as a sort
        b_ids, b_logits = best(cand, m)
        cum = torch.cumsum(torch.exp(b_logits.double() - log_z), dim=0)
        reached = torch.nonzero(cum >= p).flatten()
        if reached.numel() or m == n:
            last = int(reached[0]) + 1 if reached.numel() else m
            return b_ids[:last], b_logits[:last]
        m = min(n, m * 8)


def min_p(cand: Candidates, p: float) -> Candidates:
    """Keep tokens with logit >= max_logit + ln(p), i.e. prob >= p * max_prob (as llama.cpp,
    compared in logit space)."""
    if p <= 0.0:
        return cand
    ids, logits = cand
    threshold = logits.max() + math.log(p)
    keep = logits >= threshold
    return ids[keep], logits[keep]


def temperature(cand: Candidates, t: float) -> Candidates:
    ids, logits = cand
    return ids, logits / t


def draw(cand: Candidates, generator: torch.Generator) -> int:
    ids, logits = cand
    probs = torch.softmax(logits.double(), dim=0)
    return int(ids[torch.multinomial(probs, 1, generator=generator)])


def greedy(logits: torch.Tensor) -> int:
    """Argmax; on ties the lowest token id wins, as llama.cpp's greedy and temp<=0 paths. On the
    GPU by kernels/triton/argmax.py's two launches (TALLOW_GPU_ARGMAX): torch's one-block
    reduction takes 9-14 µs over a 33k-152k vocabulary, a real share of a decode step."""
    if logits.is_cuda and logits.dim() == 1 and switches.enabled("TALLOW_GPU_ARGMAX"):
        from .kernels.triton.argmax import argmax, make_argmax_scratch

        if logits.device not in _ARGMAX:  # reused: the id is read back (a sync) before the next call
            _ARGMAX[logits.device] = (torch.empty(1, dtype=torch.int64, device=logits.device),
                                      make_argmax_scratch(1, 256, logits.device))
        out, scratch = _ARGMAX[logits.device]
        return int(argmax(logits, out=out, scratch=scratch))
    return int(torch.argmax(logits))  # torch documents first occurrence of the maximum


_ARGMAX: dict[torch.device, tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]] = {}  # per device: nothing in it depends on the vocabulary


def masked_greedy_enabled() -> bool:
    return switches.enabled("TALLOW_GPU_MASK")


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def masked_greedy(logits: torch.Tensor, words: np.ndarray, n_tokens: int | None = None) -> int:
    """Argmax over the tokens allowed by a bitmask (token i is bit i % 32 of int32 word i // 32;
    tokens from `n_tokens` on, or past the mask, are not allowed), computed where the logits are: on the GPU a few KB
    go up instead of the vocabulary's logits coming down (0.6-1 MB). The same token as masking a
    host copy with -inf and taking its argmax (lowest id on ties). TALLOW_GPU_MASK=0 turns it off."""
    shifts = _SHIFTS.get(logits.device)
    if shifts is None:
        shifts = _SHIFTS[logits.device] = torch.arange(32, dtype=torch.int32, device=logits.device)
    w = torch.from_numpy(words).to(logits.device)
    allowed = ((w[:, None] >> shifts) & 1).view(-1).bool()  # (32 * n_words,)
    n = min(allowed.shape[0], logits.shape[0], allowed.shape[0] if n_tokens is None else n_tokens)
    # Tokens from n on are never allowed: the argmax runs over the first n only (all masked: 0,
    # as over a host copy that is -inf everywhere).
    return int(torch.argmax(logits[:n].float().masked_fill(~allowed[:n], float("-inf"))))


class Constraint(Protocol):
    """What may come next (a grammar): the Sampler masks before its chain, then reports its choice.

    `mask(logits)` sets the logit of every token the constraint forbids to -inf, in place on
    the Sampler's own float32 copy, before penalties, top-k/top-p/min-p and greedy, so every
    stage (and any distribution the Sampler hands out) sees only allowed tokens.
    `advance(token)` moves the constraint past a committed token. `Sampler.sample` calls it
    once for the token it returns; a caller that commits tokens another way (rejection
    sampling over `Sampler`'s distribution) calls `Sampler.advance` itself, once per token.
    """

    def mask(self, logits: torch.Tensor) -> None: ...

    def advance(self, token: int) -> None: ...


class Sampler:
    """Stateful only in its random generator (and the constraint's state, if any): same params
    + seed + inputs -> same tokens."""

    def __init__(self, params: SamplingParams, vocab_size: int, constraint: Constraint | None = None) -> None:
        if (
            isinstance(vocab_size, bool)
            or not isinstance(vocab_size, int)
            or vocab_size <= 0
        ):
            raise ValueError(
                f"vocab_size must be a positive integer, got {vocab_size!r}"
            )
        self.params = params
        self.vocab_size = vocab_size
        self.seed = (
            params.seed
            if params.seed is not None
            else random.SystemRandom().getrandbits(63)
        )
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(self.seed)
        self._all_ids = torch.arange(vocab_size, dtype=torch.long)
        self.constraint = constraint

    def _constrain(self, x: torch.Tensor) -> torch.Tensor:
        """The logits with the constraint's forbidden tokens at -inf (a copy: the caller's
        logits stay raw, e.g. for logprobs)."""
        if self.constraint is None:
            return x
        # A numpy copy: torch's clone of a large vector runs on the intra-op pool, whose
        # barrier cost tens of ms per token on a busy 2-core machine (measured).
        x = torch.from_numpy(x.numpy().copy())
        self.constraint.mask(x)
        return x

    def advance(self, token: int) -> None:
        """Tell the constraint (if any) that `token` was committed."""
        if self.constraint is not None:
            self.constraint.advance(token)

    def sample(self, logits: torch.Tensor, history: list[int]) -> int:
        """Pick the next token.  `history` is the token sequence the penalties look at
        (the caller decides whether it includes the prompt)."""
        if logits.dim() != 1 or logits.shape[0] != self.vocab_size:
            raise ValueError(
                f"expected logits of shape ({self.vocab_size},), got {tuple(logits.shape)}"
            )
        p = self.params
        if p.greedy and not p.penalties_active and self.constraint is None:
            # Plain greedy needs only the argmax: take it where the logits are (on the GPU, one
            # small kernel and 8 bytes back instead of the whole vocabulary copied to the host).
            return greedy(logits)
        if self.constraint is not None and hasattr(self.constraint, "prepare"):
            self.constraint.prepare()  # on the CPU while the GPU finishes the logits (the copy below waits)
            if p.greedy and not p.penalties_active and logits.is_cuda and not self.constraint.steering() \
                    and masked_greedy_enabled():
                token = masked_greedy(logits, self.constraint.allowed_words(), self.constraint.n_grammar)
                self.advance(token)
                return token
        x = self._constrain(logits.detach().to(device="cpu", dtype=torch.float32))
        x = apply_penalties(x, history, p)
        if p.greedy:
            # top_k/top_p/min_p never remove the argmax, and temp<=0 keeps only it.
            token = greedy(x)
        else:
            cand: Candidates = (self._all_ids, x)
            cand = top_k(cand, p.top_k)
            cand = top_p(cand, p.top_p)
            cand = min_p(cand, p.min_p)
            cand = temperature(cand, p.temperature)
            token = draw(cand, self.generator)
        self.advance(token)
        return token

    def distribution(self, logits: torch.Tensor, history: list[int]) -> torch.Tensor:
        """The probabilities `sample` draws from, after its whole chain (constraint mask,
        penalties, top-k, top-p, min-p, temperature): float64 (vocab,), zero outside the kept
        candidates, one-hot when greedy. Draws nothing and does not advance the constraint.
        Speculative decoding's acceptance rule is stated over it (engine/speculate.py)."""
        p = self.params
        x = self._constrain(logits.detach().to(device="cpu", dtype=torch.float32))
        x = apply_penalties(x, history, p)
        probs = torch.zeros(self.vocab_size, dtype=torch.float64)
        if p.greedy:
            probs[greedy(x)] = 1.0
            return probs
        cand = min_p(top_p(top_k((self._all_ids, x), p.top_k), p.top_p), p.min_p)
        ids, scaled = temperature(cand, p.temperature)
        probs[ids] = torch.softmax(scaled.double(), dim=0)  # as `draw` computes them
        return probs
