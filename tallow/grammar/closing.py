"""Budget-aware closing: finish a constrained answer inside max_tokens instead of being cut.

A small model inside a structure its grammar leaves unbounded (an array of enum tags without
maxItems) can repeat itself until max_tokens cuts the JSON mid-way. Near the end of the budget
the constraint asks how many tokens a *closing policy* needs to reach a state where the grammar
may end, by playing that policy on a copy of the matcher, without the model:

1. tokens the grammar forces;
1b. else an allowed special-token marker (how Gemma 4 closes a string, `<|"|>`, or a thought,
   `<channel|>`: free text inside them never ends on its own);
2. else the longest allowed token made only of `"`, `]`, `}` (brackets before quotes) that
   completes something, byte by byte: after none of its bytes may a `"` or a letter follow,
   which in JSON means a string is open (`]]` inside a string is text, and `"]]` at the
   start of a value opens one);
3. else a one-byte punctuation token after which the grammar may end (a raw grammar's `.`);
4. else such a closer with `,` (a value done, on to the next key);
5. else `0`, `1` or `a` (a number, or a character a string still needs), else the shortest
   allowed token.

Once the room left is within MARGIN tokens of that count, the model's likeliest tokens are kept
only if the policy can still close after them; if none can, the policy's own token is taken.
Following the policy never raises its own count, so the answer ends valid, with its
end-of-generation token, inside the budget — unless one token raised the count by more than
MARGIN before steering began, or the policy needs more than the whole budget (then it is cut
as before). TALLOW_GRAMMAR_CLOSE=0 switches this off.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import llguidance
import numpy as np

from .vocab import special_ids
from .. import switches

MARGIN = 24  # steer within this many tokens of the count: more than one token can add to it
# (`, {"` opening an object with required keys adds ~10-20)
REFRESH = 16  # count every token within MARGIN + REFRESH of the end, else every REFRESH tokens
CANDIDATES = 4  # the model's likeliest allowed tokens checked per steered step
LIMIT = 256  # the longest closing simulated; past it the count is taken as unknown
PREFERRED = (b"0", b"1", b"a")
CLOSING = b'"]},'  # what closers are made of


def closing_enabled() -> bool:
    return switches.enabled("TALLOW_GRAMMAR_CLOSE")


@dataclass
class ClosingVocab:
    """What the closing policy needs to know of a vocabulary."""

    closers: np.ndarray  # ids of tokens made only of `"`, `]`, `}`, in the order of step 2
    comma_closers: np.ndarray  # ... and of those with `,` (step 4)
    punctuation: np.ndarray  # ids of the one-byte tokens that are neither letters nor digits
    spelled: dict[int, list[int]]  # each closer as single-byte tokens
    preferred: np.ndarray  # ids of PREFERRED's tokens that exist
    single: np.ndarray  # ids of the one-byte tokens: the shortest, checked before the whole mask
    in_string: list[int]  # ids of `"` and `a`: may one follow? then a string is open
    lengths: np.ndarray  # (grammar vocabulary,) bytes per token
    markers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # special tokens that are not EOG (step 1b)


_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def closing_vocab(tok, n_grammar: int) -> ClosingVocab:
    """The ClosingVocab of a tallow Tokenizer, cached for its lifetime (~0.1 s for 262k tokens)."""
    cv = _cache.get(tok)
    if cv is None:
        pieces = [tok.token_to_bytes(i, special=True) for i in range(min(tok.vocab_size, n_grammar))]
        single = {p: i for i, p in enumerate(pieces) if len(p) == 1}
        closers = [i for i, p in enumerate(pieces) if p and not p.strip(CLOSING) and all(bytes([b]) in single for b in p)]
        closers.sort(key=lambda i: (-len(pieces[i]), pieces[i].count(b'"')))
        lengths = np.full(n_grammar, np.iinfo(np.int32).max, dtype=np.int32)
        lengths[: len(pieces)] = [len(p) or np.iinfo(np.int32).max for p in pieces]
        cv = _cache[tok] = ClosingVocab(
            closers=np.array([i for i in closers if b"," not in pieces[i]], dtype=np.int64),
            comma_closers=np.array([i for i in closers if b"," in pieces[i]], dtype=np.int64),
            punctuation=np.array(sorted(i for p, i in single.items() if not p.isalnum()), dtype=np.int64),
            spelled={i: [single[bytes([b])] for b in pieces[i]] for i in closers},
            preferred=np.array([single[p] for p in PREFERRED if p in single], dtype=np.int64),
            single=np.array(sorted(single.values()), dtype=np.int64),
            in_string=[single[p] for p in (b'"', b"a") if p in single],
            lengths=lengths,
            markers=np.array([i for i in special_ids(tok) if i not in tok.eog_ids and i < n_grammar], dtype=np.int64),
        )
    return cv


def closing_path(matcher: llguidance.LLMatcher, vocab: ClosingVocab, limit: int) -> list[int] | None:
    """The tokens the closing policy takes from `matcher`'s state until the grammar may end
    ([] if it may end now), or None if that takes more than `limit` tokens. `matcher` is unchanged."""
    m = matcher.deep_copy()
    bits = np.zeros((len(vocab.lengths) + 31) // 32, dtype=np.int32)
    path: list[int] = []
    while not m.is_accepting():
        if len(path) >= limit or m.is_error():
            return None
        step = m.compute_ff_tokens() or [_policy_token(m, vocab, bits)]
        if step[0] < 0 or not m.consume_tokens(step):
            return None
        path += step
    return path if len(path) <= limit else None


def _policy_token(m: llguidance.LLMatcher, vocab: ClosingVocab, bits: np.ndarray) -> int:
    """The policy's choice where nothing is forced (steps 2-5 of the module doc); -1 if none."""
    m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    markers = vocab.markers[_allowed(bits, vocab.markers)]
    if len(markers):
        return int(markers[0])
    for t in vocab.closers[_allowed(bits, vocab.closers)]:
        if _completes(m, vocab.spelled[int(t)], vocab.in_string):
            return int(t)
    for t in vocab.punctuation[_allowed(bits, vocab.punctuation)]:
        m.consume_token(int(t))
        ends = m.is_accepting()
        m.rollback(1)
        if ends:
            return int(t)
    for t in vocab.comma_closers[_allowed(bits, vocab.comma_closers)]:
        if _completes(m, vocab.spelled[int(t)], vocab.in_string):
            return int(t)
    for ids in (vocab.preferred, vocab.single):
        hits = ids[_allowed(bits, ids)]
        if len(hits):
            return int(hits[0])
    allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[: len(vocab.lengths)].view(np.bool_)
    if not allowed.any():
        return -1
    return int(np.where(allowed, vocab.lengths, np.iinfo(np.int32).max).argmin())


def _allowed(bits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Bool (len(ids),): the mask's bits of just these tokens (token i is bit i%32 of word i//32)."""
    return ((bits[ids >> 5] >> (ids & 31)) & 1).astype(bool)


def _completes(m: llguidance.LLMatcher, spelled: list[int], in_string: list[int]) -> bool:
    """Whether each byte of a closer ends something rather than being text in a string."""
    taken = 0
    ok = True
    for t in spelled:
        if not m.consume_token(t):
            ok = False
            break
        taken += 1  # only tokens the matcher took are rolled back
        if any(m.validate_tokens([s]) for s in in_string):
            ok = False
            break
    m.rollback(taken)
    return ok
