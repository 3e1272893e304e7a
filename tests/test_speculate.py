"""Prompt-lookup speculative decoding (tallow/engine/speculate.py): the same tokens as plain decoding.

Greedy and sampled text must be identical with and without speculation (the verification pass
gives bit-identical logits, and the sampler is called once per committed token, as in plain
decoding), the KV pool after rejections must hold what plain decoding leaves, and stop rules
must cut inside a draft exactly where they cut without one.
"""

from __future__ import annotations

import math

import pytest
import torch
from model_paths import require_model
from tiny_models import ARCHITECTURES, write_tiny_model

from gguf import GGMLQuantizationType as QT

from tallow.engine import speculate
from tallow.kernels.cpu import decode_layer, ggml_dot
from tallow.engine.engine import Engine, GenerationStats
from tallow.engine.speculate import PromptLookup, Speculation
from tallow.models.step import VERIFY
from tallow.gguf_file import GGUFFile
from tallow.models import build_model
from tallow.sampling import Sampler, SamplingParams
from tallow.spec import spec_from_gguf

CODE = '''def moving_average(values, window):
    result = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            result.append(total / window)
    return result
'''
EDIT = [{"role": "user", "content": "Rewrite this function, renaming `total` to `running_sum`:\n\n" + CODE}]


@pytest.fixture(scope="module")
def smollm2():
    """One smollm2 for the tests below (each resets its pool first)."""
    import tallow

    return tallow.LLM(require_model("smollm2-135m"), ctx=512)


@pytest.fixture
def always_draft(monkeypatch):
    """Speculation on, and never switched off for being slow: these tests need drafts."""
    monkeypatch.setenv("TALLOW_SPECULATE", "1")
    monkeypatch.setattr(speculate, "GUARD", False)


def test_prompt_lookup_takes_the_longest_latest_match():
    lookup = PromptLookup()
    ctx = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 1, 2, 3]
    assert lookup.draft(ctx, 3) == (3, [4, 9, 2])  # trigram 1 2 3 at 0; the bigram 2 3 at 5 is shorter
    ctx += [8, 0, 2, 3]
    assert lookup.draft(ctx, 2) == (2, [8, 0])  # bigram 2 3: its latest earlier occurrence (at 11)
    ctx += [42]
    assert lookup.draft(ctx, 4) == (0, [])  # never seen
    assert PromptLookup().draft([5, 5, 5, 5], 3) == (3, [5])  # only what exists after the match
    assert PromptLookup().draft([1, 2, 1], 0) == (0, [])


def test_prompt_lookup_prefers_the_match_that_reaches_furthest_back():
    """Of an n-gram's latest occurrences, the one whose match with the context's end is longest
    (an id in a table row vs the same id in a sentence); the length comes back with the draft."""
    lookup = PromptLookup()
    ctx = [7, 8, 1, 2, 3, 4, 5, 0, 9, 1, 2, 3, 6, 6, 0, 9, 1, 2, 3, 6, 7, 8, 1, 2, 3]
    assert lookup.draft(ctx, 2) == (5, [4, 5])  # 7 8 1 2 3 matches at 0, only 1 2 3 or 9 1 2 3 later
    ctx += [4, 5, 0]
    assert lookup.draft(ctx, 3) == (8, [9, 1, 2])  # all of 7 8 1 2 3 4 5 0 at 0; the later "6 0" only 1
    long = list(range(100, 140))
    assert PromptLookup().draft(long + [1] + long, 1) == (speculate.MATCH_MAX, [1])  # followed back at most MATCH_MAX
    assert [speculate.match_class(n) for n in (1, 2, 3, 4, 7, 8, 15, 16)] == [1, 2, 3, 4, 4, 8, 8, 16]


# The layers take the C kernel only with its SIMD code, AVX-512 VNNI or AVX2 (ggml_dot.usable).
C_LAYERS = pytest.mark.skipif(not ggml_dot.usable(), reason=f"C kernel in the layers: {ggml_dot.status()}")


@pytest.fixture(autouse=True)
def _torch_paths(monkeypatch):
    """The torch paths' speculation (row-exact kernels); llama.cpp's numerics verify in the C step
    (tests/test_decode_layer.py, and the real models' determinism tests)."""
    monkeypatch.setenv("TALLOW_NUMERICS", "default")


def _tiny_engine(tmp_path, arch="llama", qtype=QT.Q4_0, n_ctx=128):
    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf", qtype=qtype))
    spec = spec_from_gguf(gf)
    return Engine(build_model(gf, spec), n_ctx=n_ctx), spec


@pytest.mark.parametrize("arch,qtype,env,kinds", [(arch, QT.Q4_0, {"TALLOW_CPU_GGML_DOT": "0"}, {"int4"}) for arch in ARCHITECTURES]
                         + [("llama", QT.Q8_0, {"TALLOW_OUTPUT_INT8G": "1", "TALLOW_CPU_GGML_DOT": "0"}, {"int8", "int4x2"}),
                            ("qwen2", QT.Q5_0, {"TALLOW_INT4X2": "1", "TALLOW_CPU_GGML_DOT": "0"}, {"int4x2"}),
                            *(pytest.param(arch, qtype, {}, {"ggml_dot"}, marks=C_LAYERS)
                              for arch, qtype in (("llama", QT.Q8_0), ("qwen2", QT.Q5_0)))])
def test_verification_logits_are_bit_identical_to_decode_steps(tmp_path, monkeypatch, arch, qtype, env, kinds):
    """Rows of one (k+1)-token verification pass == k+1 decode steps, bit for bit, over the
    row-exact kernel kinds (int8g, Q6_K's, needs 256-wide rows: the real qwen2.5 test has it;
    gemma3's tiny window of 8 is crossed)."""
    monkeypatch.setenv("TALLOW_NUMERICS", "default")  # the torch paths: this test's subject
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    engine, _ = _tiny_engine(tmp_path, arch, qtype)
    model = engine.model
    linears = [model.output] + [t for layer in model.layers for t in layer.tensors.values() if hasattr(t, "kind")]
    assert {k for t in linears for k in str(t.kind).split("+")} == kinds
    assert speculate.rows_are_exact(model)
    prompt, seq = list(range(40, 52)), [7, 200, 13, 13, 99, 5, 61, 250, 3, 17, 17, 80]
    engine.prefill(prompt, GenerationStats())
    steps = torch.stack([engine.decode_step(t) for t in seq])
    engine.kv.truncate(len(prompt))
    verifier = engine.model
    rows = torch.cat([verifier.forward(seq[:5], len(prompt), engine.kv, all_logits=True, phase=VERIFY),
                      verifier.forward(seq[5:], len(prompt) + 5, engine.kv, all_logits=True, phase=VERIFY)])
    assert torch.equal(rows, steps)
    assert engine.kv.tokens == prompt + seq


@pytest.mark.parametrize("kv_dtype", ["f16", "int8"])
def test_exact_over_wrapped_rings_and_quantized_kv(tmp_path, monkeypatch, always_draft, kv_dtype):
    """gemma3's window of 8 as a ring of 8 + 4 - 1 slots (prefill chunks of 4) that wraps many
    times, with f16 and int8 KV: each verification pass gives the decode steps' logits, and
    rolling back rejected drafts never evicts keys a later token needs (drafts are capped by the
    chunk the rings were sized for)."""
    gf = GGUFFile(write_tiny_model("gemma3", tmp_path / "gemma3.gguf", qtype=QT.Q4_0))
    spec = spec_from_gguf(gf)
    engine = Engine(build_model(gf, spec), n_ctx=128, prefill_chunk=4, kv_dtype=kv_dtype)
    assert engine.kv.has_rings
    prompt, seq = list(range(40, 70)), [7, 200, 13, 13, 99, 5, 61, 250, 3, 17, 17, 80]
    engine.prefill(prompt, GenerationStats())
    verifier = engine.model
    for i in range(0, len(seq), 4):  # a pass, the way speculation runs it: rewind at most its length
        start = len(prompt) + i
        steps = torch.stack([engine.decode_step(t) for t in seq[i : i + 4]])
        engine.kv.truncate(start)
        assert torch.equal(verifier.forward(seq[i : i + 4], start, engine.kv, all_logits=True, phase=VERIFY), steps)
    # Drafts that are always wrong and as long as allowed: every pass is rolled back. Compare the
    # logits each generated token came from, bit for bit (this model's logits are too peaked for
    # the tokens alone to show a wrong key).
    monkeypatch.setattr(PromptLookup, "draft", lambda self, ctx, k: (3, [(ctx[-1] * 7 + j) % 250 for j in range(k)]))
    runs = []
    for enabled in ("0", "1"):
        monkeypatch.setenv("TALLOW_SPECULATE", enabled)
        engine.reset()
        seen, stats = [], GenerationStats()
        sampler = Sampler(SamplingParams(temperature=1.0, seed=1), spec.vocab_size)
        tokens = list(engine.generate([10, 11, 12, 13] * 6, 30, sampler, set(), stats,
                                      observe=lambda t, x: seen.append(x.clone())))
        runs.append((tokens, torch.stack(seen), stats.draft_tokens))
    assert runs[1][0] == runs[0][0] and torch.equal(runs[1][1], runs[0][1])
    assert runs[1][2] > 30  # passes were as long as the rings allow, and all rolled back


def test_off_by_default_where_rows_are_not_exact(tmp_path, monkeypatch):
    """F32 matrices run through F.linear, whose one-row and many-row kernels round differently:
    speculation stays off unless asked for."""
    monkeypatch.delenv("TALLOW_SPECULATE", raising=False)
    dense, _ = _tiny_engine(tmp_path, qtype=QT.F32)
    assert not speculate.rows_are_exact(dense.model) and not speculate.speculation_enabled(dense.model)
    monkeypatch.setenv("TALLOW_SPECULATE", "1")
    assert speculate.speculation_enabled(dense.model)
    monkeypatch.setenv("TALLOW_SPECULATE", "0")
    quantized, _ = _tiny_engine(tmp_path, qtype=QT.Q4_0)
    assert not speculate.speculation_enabled(quantized.model)
    monkeypatch.delenv("TALLOW_SPECULATE")
    assert speculate.speculation_enabled(quantized.model)


def _generate(engine, spec, prompt, n, params, stop=frozenset(), should_stop=lambda: False):
    stats = GenerationStats()
    tokens = list(engine.generate(prompt, n, Sampler(params, spec.vocab_size), set(stop), stats, should_stop))
    return tokens, stats


def test_sampled_tokens_identical_per_seed_on_a_tiny_model(tmp_path, monkeypatch, always_draft):
    """At temperature > 0 speculation draws exactly what plain decoding draws with the same seed,
    so the output is distributed as without it (rejections included: random weights disagree
    with most drafts)."""
    engine, spec = _tiny_engine(tmp_path)
    prompt = [10, 11, 12, 13] * 6
    drafted = accepted = 0
    for seed in range(12):
        params = SamplingParams(temperature=0.3, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.1, seed=seed)
        monkeypatch.setenv("TALLOW_SPECULATE", "0")
        engine.reset()
        plain, _ = _generate(engine, spec, prompt, 24, params)
        monkeypatch.setenv("TALLOW_SPECULATE", "1")
        engine.reset()
        spec_tokens, stats = _generate(engine, spec, prompt, 24, params)
        assert spec_tokens == plain, seed
        drafted, accepted = drafted + stats.draft_tokens, accepted + stats.accepted_tokens
    assert drafted > accepted > 0  # drafts were accepted and rejected


def _chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Upper tail of Pearson's chi-square (Wilson–Hilferty approximation) for counts vs probs."""
    keep = probs > 0
    n = counts.sum()
    expected = n * probs[keep]
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    dof = int(keep.sum()) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _verify_once(sampler, logits, draft) -> tuple[bool, int]:
    """One verification position as the engine does it: sample, accept iff it equals the draft."""
    token = sampler.sample(logits, [])
    return token == draft, token


@pytest.mark.parametrize("params", [
    dict(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0),
    dict(temperature=1.3, top_k=6, top_p=0.9, min_p=0.02),
])
def test_acceptance_rule_is_the_rejection_rule(params):
    """For a deterministic draft d the rejection rule accepts with probability p(d) and otherwise
    draws from p without d, renormalised; p is the sampler's final distribution. Check both
    against `Sampler.distribution`, and check that the test notices a wrong rule."""
    logits = torch.randn(12, generator=torch.Generator().manual_seed(3)) * 1.5
    sampler = Sampler(SamplingParams(seed=7, **params), 12)
    p = sampler.distribution(logits, [])
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-9)
    draft = int(torch.argsort(p, descending=True)[1])  # a likely but not the likeliest token
    n = 10000
    accepted, rejected = 0, torch.zeros(12, dtype=torch.float64)
    for _ in range(n):
        ok, token = _verify_once(sampler, logits, draft)
        accepted += ok
        if not ok:
            rejected[token] += 1
    sd = math.sqrt(n * p[draft] * (1 - p[draft]))
    assert abs(accepted - n * p[draft]) < 4.5 * sd
    residual = p.clone()
    residual[draft] = 0
    residual /= residual.sum()
    assert _chi_square_p_value(rejected, residual) > 1e-4
    # The same checks notice the usual mistakes: it can fail. Resampling from p itself (d kept),
    # and an acceptance probability of p(d) / max p.
    assert _chi_square_p_value(rejected, p) < 1e-6
    assert abs(accepted - n * p[draft] / p.max()) > 4.5 * sd


def test_distribution_is_one_hot_when_greedy():
    s = Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0), vocab_size=3)
    assert s.distribution(torch.tensor([4.0, 3.0, 0.0]), [0]).tolist() == [0.0, 1.0, 0.0]


# -- the real models ------------------------------------------------------------------------

def _chat_tokens(llm, monkeypatch, enabled: str, max_tokens: int, **kw):
    """Generated tokens, stats, and the pool's tokens afterwards."""
    monkeypatch.setenv("TALLOW_SPECULATE", enabled)
    llm.engine.reset()
    out = llm.chat(EDIT, max_tokens=max_tokens, **kw)
    return out.tokens, out.stats, list(llm.engine.kv.tokens)


@pytest.mark.parametrize("name,n", [("smollm2-135m", 80), ("gemma3-270m", 48), ("qwen2.5-coder-1.5b-instruct", 32)])
def test_greedy_output_identical_with_and_without_speculation(name, n, monkeypatch, always_draft):
    import tallow

    llm = tallow.LLM(require_model(name), ctx=512)
    plain, plain_stats, plain_pool = _chat_tokens(llm, monkeypatch, "0", n)
    tokens, stats, pool = _chat_tokens(llm, monkeypatch, "1", n)
    assert tokens == plain
    assert (stats.decode_tokens, stats.finish_reason) == (plain_stats.decode_tokens, plain_stats.finish_reason)
    assert pool == plain_pool  # no unaccepted draft left behind
    assert plain_stats.draft_tokens == 0 and stats.accepted_tokens > 0  # the copy was drafted


@C_LAYERS
@pytest.mark.skipif(not decode_layer.usable(), reason=f"the one-call C step: {decode_layer.unavailable_reason()}")
def test_exact_path_speculates_through_the_c_step(monkeypatch, always_draft):
    """Under TALLOW_NUMERICS=ggml speculation is on by default where the one-call C step verifies (its rows are its
    decode steps bit for bit) and off where the composed blocks would (TALLOW_CPU_C_LAYER=0); the greedy tokens and
    the pool afterwards are plain decoding's."""
    import tallow
    from tallow.engine.speculate import speculation_enabled

    monkeypatch.setenv("TALLOW_NUMERICS", "ggml")
    monkeypatch.delenv("TALLOW_SPECULATE")
    llm = tallow.LLM(require_model("smollm2-135m"), ctx=512)
    model, kv = llm.engine.model, llm.engine.kv
    assert speculation_enabled(model, kv)
    monkeypatch.setenv("TALLOW_CPU_C_LAYER", "0")
    assert not speculation_enabled(model, kv)
    monkeypatch.delenv("TALLOW_CPU_C_LAYER")
    plain, plain_stats, plain_pool = _chat_tokens(llm, monkeypatch, "0", 40)
    tokens, stats, pool = _chat_tokens(llm, monkeypatch, "1", 40)
    assert tokens == plain and pool == plain_pool
    assert plain_stats.draft_tokens == 0 and stats.accepted_tokens > 0


def test_sampled_output_identical_per_seed_on_smollm2(smollm2, monkeypatch, always_draft):
    llm = smollm2
    for seed in (1, 2):
        kw = dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.05, seed=seed)
        plain = _chat_tokens(llm, monkeypatch, "0", 48, **kw)[0]
        tokens, stats, _ = _chat_tokens(llm, monkeypatch, "1", 48, **kw)
        assert tokens == plain and stats.draft_tokens > 0


def test_kv_after_rejections_continues_like_plain_decoding(smollm2, monkeypatch, always_draft):
    """Rejected drafts leave nothing behind: continuing from the pool (prefix reuse) gives the same
    tokens, with the same logits bit for bit, as continuing after plain decoding."""
    llm = smollm2
    runs = {}
    for enabled in ("0", "1"):
        first, stats, pool = _chat_tokens(llm, monkeypatch, enabled, 40)
        out = llm.generate(llm.chat_prompt(EDIT) + first, max_tokens=24, logprobs=2)
        runs[enabled] = (first, pool, stats, out.tokens, [(t.token, t.logprob, t.top) for t in out.logprobs],
                         out.stats.reused_tokens)
    plain, spec = runs["0"], runs["1"]
    assert spec[2].draft_tokens > spec[2].accepted_tokens > 0  # accepted and rejected drafts
    assert spec[0] == plain[0] and spec[1] == plain[1]  # same tokens, same pool afterwards
    assert spec[3:] == plain[3:]  # the continuation: tokens, logprobs, reuse


def test_stop_rules_inside_accepted_drafts(smollm2, monkeypatch, always_draft):
    """An end-of-generation token, max_tokens or should_stop that falls inside a verified draft
    ends generation exactly where plain decoding ends it, with the same counters and pool."""
    llm = smollm2
    engine, prompt = llm.engine, llm.chat_prompt(EDIT)
    greedy = SamplingParams(temperature=0.0)
    inside = []
    close = Speculation.close

    def recording_close(self, n_fed):
        inside.append(len(self.pending))  # rows verified but not yet consumed when generation ended
        close(self, n_fed)

    monkeypatch.setattr(Speculation, "close", recording_close)

    def run(enabled, **kw):
        monkeypatch.setenv("TALLOW_SPECULATE", enabled)
        engine.reset()
        tokens, stats = _generate(engine, llm.spec, prompt, kw.pop("n", 40), greedy, **kw)
        return tokens, stats.finish_reason, stats.decode_tokens, list(engine.kv.tokens)

    reference = run("0")[0]
    for j in (21, 33):
        # The first occurrence of that token stops; max_tokens j; a client gone after j tokens.
        for case in (lambda: dict(stop={reference[j]}), lambda: dict(n=j), lambda: dict(should_stop=_after(j))):
            assert run("1", **case()) == run("0", **case()), (j, case())
    assert sum(1 for x in inside if x > 0) >= 3  # several cases really ended inside a draft


class _after:
    """should_stop that turns true once it has been asked n times (once per yielded token)."""

    def __init__(self, n):
        self.n, self.asked = n, 0

    def __call__(self):
        self.asked += 1
        return self.asked >= self.n


def test_composes_with_a_grammar_constraint(smollm2, monkeypatch, always_draft):
    """Drafts pass through the constrained sampler like any token: the constraint advances once per
    committed token, a draft it forbids is rejected, and the answer is the one without speculation."""
    import json

    llm = smollm2
    schema = {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}}},
              "required": ["ids"]}
    rf = {"type": "json_schema", "json_schema": {"name": "ids", "schema": schema}}
    messages = [{"role": "user", "content": "Devices: lt-kit-0193 kitchen light, lt-kit-0194 counter strip, "
                 "bl-bed-0720 bedroom blinds. Give the ids of the kitchen devices as JSON."}]
    runs = {}
    for enabled in ("0", "1"):
        for kw in (dict(), dict(temperature=0.8, seed=3)):
            monkeypatch.setenv("TALLOW_SPECULATE", enabled)
            llm.engine.reset()
            out = llm.chat(messages, max_tokens=48, response_format=rf, **kw)
            runs[enabled, bool(kw)] = (out.tokens, out.finish_reason, out.stats.draft_tokens)
    for sampled in (False, True):
        assert runs["1", sampled][:2] == runs["0", sampled][:2]
        assert runs["1", sampled][2] > 0 and runs["0", sampled][2] == 0
    tokens, finish, _ = runs["1", False]
    if finish == "stop":
        assert isinstance(json.loads(llm.detokenize(tokens)), dict)


def test_k_follows_measured_costs_and_acceptance(tmp_path):
    """k maximises expected tokens per second; where drafts are mostly wrong it is 0 (plain
    decoding), except for a 1-draft probe every PROBE_EVERY matches."""
    engine, _ = _tiny_engine(tmp_path)
    s = Speculation(engine, GenerationStats())
    s.cost.update({1: 1.0, 2: 1.2, 3: 1.4, 4: 1.6, 5: 3.0, 6: 3.2, 7: 3.4, 8: 3.6})  # 4-row blocks
    s.accept[3], s.accept[1] = [0.9, 0.9], [0.1, 0.1]
    assert s._choose_k(3, 7) == 3  # 1 + .9 + .81 + .73 = 3.4 tokens in 1.6: better than 8 rows in 3.6
    assert s._choose_k(3, 2) == 2  # only two drafts available
    picks = [s._choose_k(1, 7) for _ in range(2 * speculate.PROBE_EVERY)]
    assert picks.count(1) == 2 and picks.count(0) == len(picks) - 2
    # The same first rate, but a copy that stays on track once it starts makes longer drafts pay:
    # 1 + .4 (1 + .95 + .95^2) = 2.14 tokens in 1.6 beats 1.4 in 1.2; without the streak
    # (.4 throughout) 1.62 in 1.6 does not.
    s.accept[8] = [0.4, 0.95]
    assert s._choose_k(8, 7) == 3 and s._choose_k(12, 7) == 3  # lengths 8..15: one class
    s.accept[8] = [0.4, 0.4]
    assert s._choose_k(8, 7) == 1
    s.cost.clear()
    assert s._choose_k(3, 7) == 0  # a plain step first, to measure t(1)


def test_acceptance_is_learned_per_match_class_first_and_further(tmp_path):
    """A round's first draft updates its class's first rate, later drafts the further rate."""
    engine, _ = _tiny_engine(tmp_path)
    s = Speculation(engine, GenerationStats())
    s.round_class, s.round_index = 4, 0
    for accepted in (True, True, False):
        s._learn(accepted)
    w = speculate.ACCEPT_WEIGHT
    first, further = s.accept[4]
    assert first == pytest.approx((1 - w) * 0.5 + w)
    assert further == pytest.approx((1 - w) * ((1 - w) * 0.5 + w))
    assert s.accept[3] == [speculate.ACCEPT_PRIOR] * 2


def test_grammar_forced_tokens_are_drafted(smollm2, monkeypatch):
    """Under tool_choice "required" the tokens the grammar forces (key names, separators) are
    drafted ahead of the lookup's guesses, every one of them accepted, and the answer is the one
    without speculation (the default controller: no always_draft)."""
    llm = smollm2
    tools = [{"type": "function", "function": {"name": "lock", "description": "Lock or unlock a door.", "parameters": {
        "type": "object", "properties": {"device_id": {"type": "string"}, "locked": {"type": "boolean"}},
        "required": ["device_id", "locked"]}}}]
    messages = [{"role": "user", "content": "Lock the front door, device lk-fro-0017."}]
    forced = []
    original = Speculation._forced

    def recording_forced(self, cap):
        out = original(self, cap)
        forced.append(len(out))
        return out

    monkeypatch.setattr(Speculation, "_forced", recording_forced)
    runs = {}
    for enabled in ("0", "1"):
        monkeypatch.setenv("TALLOW_SPECULATE", enabled)
        llm.engine.reset()
        out = llm.chat(messages, tools=tools, tool_choice="required", max_tokens=48)
        runs[enabled] = (out.tokens, out.finish_reason, out.stats, [c.name for c in out.tool_calls])
    assert runs["1"][:2] == runs["0"][:2] and runs["1"][3] == ["lock"]
    stats = runs["1"][2]
    assert sum(forced) >= 8  # '"name": "', '", "arguments": {"', ... came from the grammar
    assert stats.accepted_tokens >= sum(forced)  # each forced draft was accepted
