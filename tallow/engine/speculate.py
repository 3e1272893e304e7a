"""Prompt-lookup speculative decoding: guess the next tokens from the context, check them in one pass.

Drafting. Agents and editors copy: names and ids from a system prompt, the lines of a snippet
they rewrite. So the last n tokens of the context (n = 3, then 2, then 1) are looked up among
earlier positions of the same context (prompt + generated), and the tokens that followed one of
their occurrences are the draft: of the latest CANDIDATES occurrences, the one whose match with
the context's end reaches furthest back (up to MATCH_MAX tokens; ties: the latest). A name that
occurs in a table and in a sentence continues like the place whose preceding words match too.
No second model, and drafting costs a few dict operations and comparisons per token.

Under a grammar (tool_choice "required", json_schema) the tokens it forces next come first in
the draft: llguidance's fast-forward tokens (key names, separators: 59% of qwen2.5's and 66% of
smollm2's tokens on the bench's agent loop) are the only ones the mask allows, so the sampler
cannot but draw them and they are certain to be accepted; lookup drafts follow them, k chosen
with the forced ones counted as certain and left out of the acceptance rates.

Verification. The last committed token and k drafts run through the model as one (k+1)-token
forward pass; row j of its logits is what a decode step would give after draft j. The engine
then samples from the rows in order, exactly as it samples in plain decoding — one sampler call
per committed token, with the history holding the tokens committed so far — and a draft is
accepted while the sampled token equals it. At the first mismatch the sampled token is kept
(it is the correction), the remaining rows are dropped and the KV pool is truncated back, so
the rejected drafts' positions are overwritten by later steps.

Why that is the standard rejection rule. For a deterministic draft d (q = one-hot at d) the
rule accepts d with probability min(1, p(d)/q(d)) = p(d) and on rejection draws from p with d
removed, renormalised. Drawing x ~ p and accepting iff x == d has exactly those probabilities:
P(accept) = p(d), and given x != d, x is distributed as p without d. Realised this way the
random generator advances once per committed token, as in plain decoding, so with the same
seed the text is not only equally distributed but identical — and a grammar constraint inside
the sampler sees each committed token exactly once, in order. A draft the constraint forbids
can never be sampled, so it is simply rejected.

Exactness on the CPU. The multi-token forward (the prefill path) computes attention for all
queries in one masked SDPA call, which rounds differently from the one-query call decode makes
(measured: logits differ by up to 0.56, enough to flip near-ties). The linear layers are
row-independent below the dequantized-prefill threshold (64 rows): bit-identical for 1 or k+1
rows. So verification runs the model as a VERIFY step (models/step.py: EagerRowsAttention), attention
done query by query as the one-token step does it (the key window converted to float32 once per
layer and pass, each query's keys a slice of it), and its logits are bit-identical to k+1 decode
steps (tests check it):
greedy text with speculation is the text without it.

Exactness on the GPU. Decode replays a CUDA graph of one token; verification replays a graph
per pass size m = k+1 (engine.decode_rows, graphs.RowGraphs) of a VERIFY step: the Triton
GEMV dequantizes each weight tile once for all m rows but keeps an accumulator per row, updated
by the same code whatever m is, and the fused Q/K norm + RoPE + K/V write and the decode
attention take a row axis (row i at position + i, computed as a one-token launch computes it).
So row i is bit for bit what the decode graph gives after i accepted drafts (tests check it in
Triton's interpreter; scripts/gpu_speculate.py on the GPU), and a pass of 4 costs 1.6-1.8 steps.

Where that exactness does not hold, speculation is off by default: models with dense float
matrices (F.linear and cuBLAS round one row and many rows differently). TALLOW_SPECULATE=1 turns
it on anyway (the same text up to near-ties); TALLOW_SPECULATE=0 turns it off everywhere.

Choosing k. Whether drafting pays depends on two measured things: how often drafts are right
and what a pass of m tokens costs. Acceptance is kept per match class c (the match's length:
1, 2, 3, 4-7, 8-15, 16+ tokens; a long match in a copied passage is right far more often than a
unigram in prose), as two rates: a_c of a round's first draft and b_c of each further draft
given that the one before it was accepted (once a copy is on track it tends to stay on it:
learned on qwen2.5's agent-loop bench, 8-15-token matches, a = 0.43 and b = 0.73). The engine
keeps the measured seconds t(m) of a forward pass of m = 1..K_MAX+1 tokens (on this CPU the
int4/int8 kernels work in blocks of 4 rows, so t(m) is far from flat). A draft of k tokens is
expected to commit 1 + a_c (1 + b_c + ... + b_c^(k-1)) tokens in t(k+1), plain decoding 1 in
t(1); the k with the most tokens per second wins, and k = 0 is plain decoding: drafting
switches itself off where it does not pay (prose), and a rare 1-token probe keeps measuring a_c
there. Sizes not yet measured are priced optimistically from t(1) so that they get tried once, but
never below the cost per row that the largest smaller pass measured (where each row costs nearly a
step, as with AVX2's products, a first 2-row pass keeps the larger ones from being tried for nothing).
Both are kept per engine across requests, so a short answer starts from what earlier ones
measured. (Longest-match drafting and the two rates per match class replaced latest-occurrence
drafting with one rate per n-gram size: live on qwen2.5, the agent-loop bench 20.2 -> 21.1 tok/s
and free-text tool calls 24.0 -> 25.9; docs/performance.md.)
"""

from __future__ import annotations

import time
import weakref
from collections import deque

import torch

from .. import switches
from ..numerics_mode import GGML
from .prefill_plan import model_linears

K_MAX = 7  # drafts per verification pass (8 rows: two of the CPU kernels' 4-row blocks)
NGRAM_MAX, NGRAM_MIN = 3, 1
CANDIDATES = 8  # latest occurrences of an n-gram compared by how far back their match reaches
MATCH_MAX = 16  # a match is followed back at most this far
MATCH_CLASSES = (1, 2, 3, 4, 8, 16)  # acceptance is kept per class of match length: 4 = 4..7, ...
ACCEPT_PRIOR = 0.5  # acceptance rate of a match class before any of its drafts were verified
ACCEPT_WEIGHT = 0.1  # weight of the newest draft token in the acceptance rate
TIME_WEIGHT = 0.25  # weight of the newest timing
# unmeasured pass sizes are priced at t(1) + (m - 1) times a row's cost: ROW_PRIOR * t(1), or more where a measured
# smaller pass showed more (where the CPU kernels are compute-bound, AVX2: t(2) = 1.63 t(1), t(8) = 6.2 t(1))
ROW_PRIOR = 0.1
PROBE_EVERY = 16  # where drafting does not pay, every 16th match is verified anyway (k = 1)
GUARD = True  # False: always draft K_MAX when there is a match (tests that need drafts)


# CPU kernels whose rows are computed independently: 1 row or k+1 rows give the same bits
# (below dequant_matmul.MIN_ROWS = 64 rows, where prefill switches to dequantized tiles; checked
# in tests/test_speculate.py). Dense float weights go through F.linear, whose one-row (GEMV)
# and many-row (GEMM) kernels round differently.
ROW_EXACT_KINDS = frozenset({"int4", "int4x2", "int8", "int8g", "ggml_dot"})


def rows_are_exact(model) -> bool:
    """Whether every matrix of `model` runs in a row-exact kernel: on the CPU see
    ROW_EXACT_KINDS; on the GPU the Triton GEMVs, fp32 and integer-dot (an accumulator per row, the
    same code for any number of rows, explicit fmas; `dense` layers go through cuBLAS, whose GEMV and
    GEMM round apart)."""
    linears = model_linears(model)
    if model.device.type == "cuda":
        parts = [p for t in linears for p in getattr(t, "parts", [t])]
        return all(str(p.kind).startswith(("triton_", "mmvq_")) and p.use_gemv for p in parts)
    if model.device.type != "cpu" or model.numerics == GGML:  # ggml's products change order from 8 rows on
        return False
    return all(set(str(t.kind).split("+")) <= ROW_EXACT_KINDS for t in linears)


def speculation_enabled(model, kv=None) -> bool:
    """TALLOW_SPECULATE=0 off, =1 on; by default on where verification is bit-exact: row-exact
    kernels, on the CPU or the GPU (see the module doc); under TALLOW_NUMERICS=ggml where every
    verification pass over kv runs in the one-call C step (kernels/cpu/decode_layer.py)."""
    forced = switches.value("TALLOW_SPECULATE")  # None: auto
    if forced is not None:
        return forced
    if model.numerics == GGML and model.device.type == "cpu":
        c_step = getattr(model, "c_decode", None)  # (the families with a C step)
        return kv is not None and c_step is not None and c_step.verifies_in_ggml(K_MAX + 1, kv)
    return rows_are_exact(model)  # a walk over ~200 layer objects: microseconds per request


def match_class(length: int) -> int:
    """The MATCH_CLASSES entry a match of `length` tokens (1..MATCH_MAX) falls in."""
    return max(c for c in MATCH_CLASSES if c <= length)


class PromptLookup:
    """Drafts from the context: for the largest n (NGRAM_MAX..NGRAM_MIN) whose last n tokens
    occurred before, the tokens that followed the occurrence (of its latest CANDIDATES) whose
    match with the context's end reaches furthest back; ties go to the latest.

    The n-grams are indexed incrementally (each context position once), so a draft costs a
    few dict operations and at most CANDIDATES * MATCH_MAX comparisons however long the prompt.
    `context` must only grow between calls."""

    def __init__(self) -> None:
        # n-gram -> positions just after its latest CANDIDATES occurrences, oldest first
        self.index: dict[tuple[int, ...], list[int]] = {}
        self.indexed = 0  # n-grams ending before this position are in the index

    def draft(self, context: list[int], k: int) -> tuple[int, list[int]]:
        """(match length, up to k tokens): the length is how many tokens before the drafted ones
        match the context's end (n..MATCH_MAX); (0, []) when nothing matches."""
        if k <= 0:
            return 0, []
        end = len(context)
        # Index every n-gram followed by at least one token (context[e - n:e] -> e): all but the
        # suffix, which must match an earlier occurrence, not itself.
        for e in range(max(self.indexed, 1), end):
            for n in range(NGRAM_MIN, NGRAM_MAX + 1):
                if e - n >= 0:
                    seen = self.index.setdefault(tuple(context[e - n : e]), [])
                    seen.append(e)
                    if len(seen) > CANDIDATES:
                        del seen[0]
        self.indexed = max(self.indexed, end)
        for n in range(min(NGRAM_MAX, end - 1), NGRAM_MIN - 1, -1):
            seen = self.index.get(tuple(context[end - n :]))
            if seen:
                best_length, best_at = 0, 0
                for at in reversed(seen):  # latest first: a tie keeps the latest
                    length = n
                    while length < MATCH_MAX and at > length and context[at - length - 1] == context[end - length - 1]:
                        length += 1
                    if length > best_length:
                        best_length, best_at = length, at
                return best_length, context[best_at : best_at + k]
        return 0, []


class Speculation:
    """One request's drafting, verification rounds and choice of k. The engine asks
    `next_logits(token, history, room)` where plain decoding would call `decode_step(token)`."""

    def __init__(self, engine, stats, constraint=None) -> None:
        self.engine = engine
        self.stats = stats
        self.lookup = PromptLookup()
        # The sampler's grammar, if any (an llguidance matcher, advanced past each committed
        # token): the tokens it forces are drafted first.
        self.matcher = getattr(constraint, "matcher", None)
        self.pending: deque[tuple[int, torch.Tensor]] = deque()  # (draft token, logits after it)
        self.round_class = 0  # match class of the draft being verified
        self.round_index = 0  # which of its drafts comes next (0: the first)
        self.round_forced = 0  # how many of them the grammar forced (not counted in the rates)
        self.skipped = dict.fromkeys(MATCH_CLASSES, 0)
        # Kept per engine across requests (a short answer has no time to learn them): the seconds
        # of a forward pass by its number of tokens, and per match class the acceptance rates
        # [of a round's first draft, of a draft after an accepted one].
        learned = _LEARNED.setdefault(engine, ({}, {c: [ACCEPT_PRIOR, ACCEPT_PRIOR] for c in MATCH_CLASSES}))
        self.cost, self.accept = learned

    def next_logits(self, token: int, history: list[int], room: int) -> torch.Tensor:
        """Logits after `token`, the last of `history`, just committed. `room` bounds the drafts
        (context left, tokens still wanted)."""
        if self.pending:
            draft, logits = self.pending.popleft()
            if draft == token:
                self.stats.accepted_tokens += 1
                self._learn(True)
                return logits
            self._learn(False)
            self.pending.clear()
            self.engine.kv.truncate(len(history) - 1)  # drop the rejected drafts' positions
            if len(self.engine.kv.tokens) != len(history) - 1:  # a ring lost keys: cannot happen, see below
                raise RuntimeError("speculative decoding rolled the KV pool back past what its rings hold")
        # A sliding-window layer is a ring with prefill_chunk - 1 slots beyond its window: a pass
        # of at most prefill_chunk tokens (the token and its drafts) never overwrites a key that
        # one of its own rows or a later token attends to, and rolling it back evicts nothing
        # needed (kv_pool.reusable), so drafts are capped at prefill_chunk - 1.
        cap = min(K_MAX, room, self.engine.prefill_chunk - 1)
        forced = self._forced(cap)
        # The forced tokens will be committed, so the lookup may index them as context.
        length, draft = (self.lookup.draft(history + forced if forced else history, cap - len(forced))
                         if len(forced) < cap else (0, []))
        draft = forced + draft[: self._choose_k(length, len(draft), len(forced))]
        t0 = time.perf_counter()
        if not draft:
            logits = self.engine.decode_step(token)
        else:
            rows = self.engine.decode_rows([token, *draft])  # kv holds history[:-1]: token goes next
            # (length 0: forced drafts only, no rate to learn; any class will do)
            self.round_class, self.round_index, self.round_forced = match_class(max(length, 1)), 0, len(forced)
            self.stats.draft_tokens += len(draft)
            self.pending.extend(zip(draft, rows[1:]))
            logits = rows[0]
        if logits.is_cuda:  # time the work, not its launch (the sampler waits for it anyway)
            torch.cuda.synchronize(logits.device)
        m = len(draft) + 1
        warmed = _WARMED.setdefault(self.engine, set())
        if m in warmed:
            self.cost[m] = _ema(self.cost.get(m), time.perf_counter() - t0, TIME_WEIGHT)
        else:  # a size's first pass captures its CUDA graph (~0.1 s): priced at that, it would never run again
            warmed.add(m)
        return logits

    def _forced(self, cap: int) -> list[int]:
        """Up to `cap` tokens the grammar forces next (the only ones its mask allows, one after
        another): drafts that are certain to be sampled, whatever the logits."""
        if self.matcher is None or cap <= 0:
            return []
        return list(self.matcher.compute_ff_tokens())[:cap]

    def _learn(self, accepted: bool) -> None:
        lookup_index = self.round_index - self.round_forced
        self.round_index += 1
        if lookup_index < 0:
            return  # a forced draft says nothing about the lookup's rates
        rates = self.accept[self.round_class]
        which = min(lookup_index, 1)  # the lookup's first draft, or one after an accepted draft
        rates[which] = _ema(rates[which], 1.0 if accepted else 0.0, ACCEPT_WEIGHT)

    def _choose_k(self, length: int, available: int, forced: int = 0) -> int:
        """The number of lookup drafts (0..available) of a match of `length` tokens, after
        `forced` certain ones, with the most expected tokens per second."""
        if available == 0 or 1 not in self.cost:
            return 0  # no match, or plain decoding not measured yet
        if not GUARD:
            return available
        c = match_class(length)
        (first, further), t1 = self.accept[c], self.cost[1]

        below = [n for n in self.cost if 1 < n]
        def seconds(m: int) -> float:  # a pass of m tokens: measured, or priced from t(1) and the row cost seen
            if m in self.cost:
                return self.cost[m]
            seen = max((n for n in below if n < m), default=0)  # the largest measured pass below m
            row = t1 * ROW_PRIOR if not seen else max(t1 * ROW_PRIOR, (self.cost[seen] - t1) / (seen - 1))
            return t1 + row * (m - 1)

        expected, reach = 1.0 + forced, first
        best_k, best_rate = 0, expected / seconds(forced + 1)
        for k in range(1, available + 1):
            expected += reach  # P(drafts 1..k all accepted)
            reach *= further
            rate = expected / seconds(forced + k + 1)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0 and not forced:  # not worth it: verify one draft now and then to keep measuring a_c
            self.skipped[c] += 1
            if self.skipped[c] % PROBE_EVERY == 0:
                return 1
        return best_k

    def close(self, n_fed: int) -> None:
        """Leave the pool as plain decoding would: holding the `n_fed` tokens the loop committed
        and fed, without drafts that were never accepted."""
        self.pending.clear()
        self.engine.kv.truncate(n_fed)


_LEARNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> ({m: seconds}, {class: [first, further]})
_WARMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine -> pass sizes run once (not timed)


def _ema(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new
