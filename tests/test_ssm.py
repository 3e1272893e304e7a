"""State-space and hybrid models (mamba, mamba2, falcon-h1) on the CPU: conformance with llama.cpp on tiny random-weight
models (tests/fixtures/tiny_<arch>.json, scripts/make_fixtures.py), and the recurrent memory
(memory/recurrent.py): chunked prefill and decode continue one state, padded rows leave it alone,
prefix reuse restores a checkpoint and answers as a cold run does, so does a conversation
restored from disk, speculation steps aside, the memory plan counts the fixed state."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_models import SSM_ARCHITECTURES, tiny_prompt, write_tiny_ssm

import tallow
from tallow.engine import speculate
from tallow.engine.engine import Engine, GenerationStats
from tallow.errors import ModelFileError
from tallow.gguf_file import GGUFFile
from tallow.kernels.cpu.ssm import causal_conv, selective_scan
from tallow.memory.budget import plan_memory
from tallow.memory.kv_store import KVStoreWarning
from tallow.memory.recurrent import RecurrentMemory, make_memory
from tallow.models import build_model
from tallow.sampling import Sampler, SamplingParams
from tallow.spec import layer_kind_lines, spec_from_gguf
from tallow.ssm_spec import VERIFY_COPIES

FIXTURES = Path(__file__).parent / "fixtures"
# Measured max |Δlogit| against llama.cpp over the 40-token prompt: 1.4e-6 (mamba), 1.8e-6
# (mamba2), 2.8e-6 (falcon-h1, F32 KV); a wrong tap, decay or gate gives > 1e-1.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ssm")
    return {arch: write_tiny_ssm(arch, folder / f"tiny-{arch}.gguf") for arch in SSM_ARCHITECTURES}


def _model(path):
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    return spec, build_model(gf, spec)


def _ref(arch):
    return json.loads((FIXTURES / f"tiny_{arch}.json").read_text())


@pytest.mark.parametrize("blocked", ("1", "0"))
@pytest.mark.parametrize("arch", SSM_ARCHITECTURES)
def test_logits_match_llama_cpp(arch, blocked, tiny, monkeypatch):
    """Both scans (the op-by-op reference and the opt-in blocked one, TALLOW_SSM_BLOCKED_SCAN=1,
    its blocks cut to 3 tokens, so the 40-token prompt crosses 13 block boundaries)."""
    from tallow.kernels.cpu import ssm as ssm_ops

    monkeypatch.setenv("TALLOW_SSM_BLOCKED_SCAN", blocked)
    ref = _ref(arch)
    spec, model = _model(tiny[arch])
    monkeypatch.setattr(ssm_ops, "BLOCK_ELEMENTS", 3 * spec.ssm.d_inner * spec.ssm.d_state)
    out = model.forward(ref["ids"], 0, make_memory(spec, 64, "f32"), all_logits=True).numpy()  # falcon-h1: F32 KV as the fixture
    delta = np.abs(out - np.array(ref["logits"], dtype=np.float32)).max()
    assert delta < TOLERANCE, f"{arch}: max |Δlogit| {delta:.2e}"


@pytest.mark.parametrize("arch", SSM_ARCHITECTURES)
def test_greedy_matches_llama_cpp_through_the_api(arch, tiny):
    """tallow.load(...).generate on the CPU: the 16 greedy tokens llama.cpp chose after the
    40-token prompt (ten times the conv kernel), speculation asked for and stepping aside."""
    ref = _ref(arch)
    llm = tallow.load(str(tiny[arch]), ctx=128, device="cpu")  # falcon-h1: f16 KV (llama.cpp's F32: |Δlogit| 6e-4)
    out = llm.generate(ref["ids"], max_tokens=len(ref["greedy"]["ids"]))
    assert out.tokens == ref["greedy"]["ids"]
    assert out.stats.draft_tokens == 0


@pytest.mark.parametrize("arch", SSM_ARCHITECTURES)
def test_chunks_and_steps_continue_one_state(arch, tiny):
    """Prefill in chunks of 3 (shorter than the conv window) and token-by-token decode give the
    one-pass logits: the conv and SSM states carry across calls."""
    ids = _ref(arch)["ids"]
    spec, model = _model(tiny[arch])
    whole = model.forward(ids, 0, make_memory(spec, 64, "f32"), all_logits=True)
    mem = make_memory(spec, 64, "f32")
    chunks = torch.cat([model.forward(ids[s : s + 3], s, mem, all_logits=True) for s in range(0, len(ids), 3)])
    assert (chunks - whole).abs().max().item() < 1e-5
    mem = make_memory(spec, 64, "f32")
    steps = torch.cat([model.forward([t], i, mem) for i, t in enumerate(ids)])
    assert (steps - whole).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="cannot continue at position 3"):
        model.forward(ids[:2], 3, make_memory(spec, 64))  # a state cannot skip positions


@pytest.mark.parametrize("version", (1, 2))
def test_padded_rows_do_not_advance_the_state(version):
    g = torch.Generator().manual_seed(version)
    n, n_pad, heads, hd, groups, ds, ch, d_conv = 5, 3, 4, 1 if version == 1 else 8, 1 if version == 1 else 2, 16, 12, 4
    x, dt = torch.randn(n + n_pad, heads, hd, generator=g), torch.randn(n + n_pad, heads, generator=g)
    A = -torch.rand(heads, ds, generator=g) if version == 1 else -torch.rand(heads, generator=g)
    B, C = torch.randn(n + n_pad, groups, ds, generator=g), torch.randn(n + n_pad, groups, ds, generator=g)
    s0 = torch.randn(heads, hd, ds, generator=g)
    plain, padded = s0.clone(), s0.clone()
    y = selective_scan(plain, x[:n], dt[:n], A, B[:n], C[:n])
    y_pad = selective_scan(padded, x, dt, A, B, C, n_valid=n)
    assert torch.equal(plain, padded) and torch.equal(y, y_pad[:n])
    assert not torch.equal(plain, s0)
    cx, w, b = torch.randn(n + n_pad, ch, generator=g), torch.randn(ch, d_conv, generator=g), torch.randn(ch, generator=g)
    c0 = torch.randn(d_conv - 1, ch, generator=g)
    c_plain, c_pad = c0.clone(), c0.clone()
    out = causal_conv(cx[:n], c_plain, w, b)
    out_pad = causal_conv(cx, c_pad, w, b, n_valid=n)
    assert torch.equal(c_plain, c_pad) and torch.equal(out, out_pad[:n])
    assert torch.equal(c_plain, cx[n - d_conv + 1 : n])


def _engine(model, chunk=8, **kw):
    return Engine(model, 128, prefill_chunk=chunk, kv_dtype="f16", **kw)


def _greedy(engine, prompt, n=6):
    stats = GenerationStats()
    tokens = list(engine.generate(prompt, n, Sampler(SamplingParams(temperature=0.0), engine.model.spec.vocab_size), set(), stats))
    return tokens, stats


@pytest.mark.parametrize("arch", SSM_ARCHITECTURES)
def test_prefix_reuse_restores_a_checkpoint_and_answers_as_cold(arch, tiny):
    """A first prompt of 20 tokens prefilled in chunks of 8 leaves checkpoints at 8, 16 and 20;
    a second prompt that leaves it after 18 tokens reuses the state at 16 (the last canonical
    chunk boundary) and gets bit for bit the cold run's logits and tokens."""
    ids = _ref(arch)["ids"]
    spec, model = _model(tiny[arch])
    warm = _engine(model)
    _greedy(warm, ids[:20])
    assert isinstance(warm.kv, RecurrentMemory) and sorted(warm.kv.checkpoints) == [8, 16, 20]
    second = ids[:18] + ids[30:40]
    tokens, stats = _greedy(warm, second)
    cold_tokens, cold_stats = _greedy(_engine(model), second)
    assert stats.reused_tokens == 16 and cold_stats.reused_tokens == 0
    assert tokens == cold_tokens
    # The logits of the prompt's end, bit for bit.
    a, b = _engine(model), _engine(model)
    _greedy(a, ids[:20])
    s1, s2 = GenerationStats(), GenerationStats()
    assert torch.equal(a.prefill(second, s1), b.prefill(second, s2)) and s1.reused_tokens == 16


@pytest.mark.parametrize("arch", SSM_ARCHITECTURES)
def test_reuse_of_the_live_state_at_the_end_of_the_previous_sequence(arch, tiny, monkeypatch):
    """With any prefix reusable (TALLOW_ALIGNED_REUSE=0) a prompt that extends everything the
    memory holds — prompt and answer — continues the live state; one that leaves it before any
    checkpoint reuses nothing."""
    monkeypatch.setenv("TALLOW_ALIGNED_REUSE", "0")
    monkeypatch.setenv("TALLOW_STATE_CHECKPOINTS", "0")
    ids = _ref(arch)["ids"]
    spec, model = _model(tiny[arch])
    engine = _engine(model)
    answer, _ = _greedy(engine, ids[:20])
    held = list(engine.kv.tokens)  # the prompt and all but the last answer token
    assert held == ids[:20] + answer[:-1] and not engine.kv.checkpoints
    follow = held + ids[30:36]
    tokens, stats = _greedy(engine, follow)
    assert stats.reused_tokens == len(held)
    cold, _ = _greedy(_engine(model), follow)
    assert tokens == cold
    _, stats = _greedy(engine, ids[:10] + ids[25:30])
    assert stats.reused_tokens == 0


@pytest.mark.parametrize("arch", ("mamba2", "falcon-h1"))
def test_speculation_rolls_the_state_back_exactly(arch, tmp_path, monkeypatch):
    """Q8_0 (row-exact projections: speculation on by default): prompt-lookup drafts are verified,
    rejected ones rolled back to the state after the last accepted row (the pass's start with the
    accepted rows folded again), and the greedy tokens and their logits are plain decoding's, bit
    for bit."""
    from gguf import GGMLQuantizationType as QT

    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "0")  # the torch kernels the accepted drafts were measured with
    monkeypatch.setattr(speculate, "GUARD", False)  # every match drafted: what is verified must not hang on timings
    spec, model = _model(write_tiny_ssm(arch, tmp_path / "q8.gguf", qtype=QT.Q8_0))
    ids = tiny_prompt(24) * 3  # repeats: the lookup finds drafts

    def run(speculate: str):
        monkeypatch.setenv("TALLOW_SPECULATE", speculate)
        engine = Engine(model, 256, kv_dtype="f16")
        stats, seen = GenerationStats(), []
        sampler = Sampler(SamplingParams(temperature=0.0), spec.vocab_size)
        tokens = list(engine.generate(ids, 40, sampler, set(), stats, observe=lambda t, logits: seen.append(logits.clone())))
        return tokens, seen, stats

    plain, plain_logits, plain_stats = run("0")
    fast, fast_logits, stats = run("1")
    assert plain_stats.draft_tokens == 0 and stats.draft_tokens > 0
    assert stats.accepted_tokens < stats.draft_tokens  # drafts were rolled back
    if arch == "falcon-h1":  # its continuation repeats the prompt in places: drafts accepted too (measured)
        assert stats.accepted_tokens > 0
    assert fast == plain and all(torch.equal(a, b) for a, b in zip(fast_logits, plain_logits))


@pytest.mark.parametrize("arch", ("mamba2", "falcon-h1"))
def test_a_restored_conversation_reuses_its_saved_state(arch, tiny, tmp_path):
    """A conversation's file holds its tokens, any attention K/V and the states (the live one and
    the checkpoints): a fresh engine hydrates it, reuses the state at 16 for a prompt that leaves
    the first after 18 tokens, and answers as a cold run; a file whose state is cut short is
    ignored with a warning."""
    ids = _ref(arch)["ids"]
    spec, model = _model(tiny[arch])
    first = _engine(model, kv_store_dir=str(tmp_path))
    stats = GenerationStats()
    sampler = Sampler(SamplingParams(temperature=0.0), spec.vocab_size)
    list(first.generate(ids[:20], 6, sampler, set(), stats, conversation_id="c1"))
    saved = list(tmp_path.glob("*.kv"))
    assert len(saved) == 1
    second = ids[:18] + ids[30:40]
    restored = _engine(model, kv_store_dir=str(tmp_path))
    stats = GenerationStats()
    tokens = list(restored.generate(second, 6, sampler, set(), stats, conversation_id="c1"))
    cold, _ = _greedy(_engine(model), second)
    assert stats.reused_from_disk == 16 and tokens == cold
    data = saved[0].read_bytes()  # saved again by the second turn
    saved[0].write_bytes(data[:-100])
    with pytest.warns(KVStoreWarning, match="ignoring the KV cache file"):
        stats = GenerationStats()
        tokens = list(_engine(model, kv_store_dir=str(tmp_path)).generate(second, 6, sampler, set(), stats,
                                                                           conversation_id="c1"))
    assert stats.reused_tokens == 0 and tokens == cold


@pytest.mark.parametrize("arch", SSM_ARCHITECTURES)
def test_the_plan_counts_the_fixed_state(arch, tiny):
    spec, model = _model(tiny[arch])
    ssm = spec.ssm
    per_layer = ((ssm.d_conv - 1) * ssm.conv_channels + ssm.d_inner * ssm.d_state) * 4
    assert ssm.layer_state_bytes == per_layer and ssm.state_bytes == 2 * per_layer
    small, big = plan_memory(tiny[arch], n_ctx=32), plan_memory(tiny[arch], n_ctx=256)
    assert small.state == big.state == ssm.state_bytes * 6  # live + 4 checkpoints + a verification pass's start, whatever the context
    if spec.layers:  # falcon-h1: every layer's attention K/V beside its state
        assert 0 < small.kv < big.kv
    else:  # no attention layer: no KV, and past one prefill chunk no scratch that grows with it (no mask, no K/V views)
        assert small.kv == big.kv == 0
        assert plan_memory(tiny[arch], n_ctx=1024).scratch == plan_memory(tiny[arch], n_ctx=32768).scratch
    assert ("recurrent state", small.state) in small.parts() and "recurrent layers" in small.describe()
    memory = make_memory(spec, 256)
    assert memory.nbytes == big.kv + ssm.state_bytes  # what is allocated: the KV (if any) and the live state
    engine = _engine(model)
    _greedy(engine, _ref(arch)["ids"])  # 40 tokens in chunks of 8: 5 checkpoints, 4 kept
    assert engine.kv.checkpoint_bytes == 4 * ssm.state_bytes
    assert engine.kv.state.nbytes + engine.kv.checkpoint_bytes + VERIFY_COPIES * ssm.state_bytes == small.state
    assert any("recurrent layers" in line for line in layer_kind_lines(spec))


@pytest.mark.parametrize("arch, key, value, message", [
    ("mamba", "add_ssm_inner_size", 96, "not twice the embedding size"),
    ("mamba2", "add_ssm_inner_size", 96, "ssm_in.weight has shape"),
    ("mamba2", "add_ssm_group_count", 3, "do not divide evenly"),
    ("mamba", "add_ssm_conv_kernel", 0, "ssm.conv_kernel is 0, outside"),
])
def test_a_bad_ssm_file_is_one_sentence(arch, key, value, message, tmp_path, monkeypatch):
    from gguf import GGUFWriter

    original = getattr(GGUFWriter, key)
    monkeypatch.setattr(GGUFWriter, key, lambda self, v: original(self, value))
    path = write_tiny_ssm(arch, tmp_path / "bad.gguf")
    with pytest.raises(ModelFileError, match=message):
        gf = GGUFFile(path)
        build_model(gf, spec_from_gguf(gf))


@pytest.mark.parametrize("arch", ("mamba2", "falcon-h1"))
def test_quantized_prefill_is_row_invariant_and_reuses_the_end_of_the_prompt(arch, tmp_path):
    """With Q8_0 matrices (row-exact kernels) the prefill plan lets reuse start at any canonical
    position: a second prompt extending the first 150-token prompt continues its state at 150,
    and its logits are bit for bit the cold run's; one that leaves it at 120 — no state there —
    reuses nothing."""
    from gguf import GGMLQuantizationType as QT

    spec, model = _model(write_tiny_ssm(arch, tmp_path / "q8.gguf", qtype=QT.Q8_0))
    ids = tiny_prompt(260)
    engine = Engine(model, 256, kv_dtype="f16")
    engine.prefill(ids[:150], GenerationStats())
    assert list(engine.kv.checkpoints) == [86, 150] and engine.kv.canonical == 150  # the last chunk cut 64 before the end
    stats = GenerationStats()
    warm = engine.prefill(ids[:230], stats)
    cold = Engine(model, 256, kv_dtype="f16").prefill(ids[:230], GenerationStats())
    assert stats.reused_tokens == 150 and torch.equal(warm, cold)
    stats = GenerationStats()
    engine.prefill(ids[:120] + ids[240:260], stats)
    assert stats.reused_tokens == 0


def test_the_server_answers_with_a_recurrent_model(tiny):
    """The OpenAI-shaped completion endpoint on the tiny falcon-h1 (K/V and state): the same
    greedy text as the Python API, a second request with the same prompt reusing its prefix."""
    import httpx
    from server_utils import LiveServer

    path = str(tiny["falcon-h1"])
    expected = tallow.load(path, ctx=128, device="cpu").generate("the cat sat on the mat", max_tokens=8).text
    server = LiveServer(lambda: tallow.LLM(path, ctx=128, device="cpu"), "tiny-falcon-h1", path)
    try:
        server.wait_ready(60)
        for _ in range(2):
            r = httpx.post(server.url + "/v1/completions", timeout=60, json={
                "model": "tiny-falcon-h1", "prompt": "the cat sat on the mat", "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == expected
    finally:
        server.stop()


def test_the_same_prompt_again_reuses_all_but_its_last_rows(tmp_path):
    """Row-invariant plan (Q8_0): the last prefill chunk is cut 2·min_rows and min_rows (64) before
    the end, so a retried 200-token prompt continues the checkpoint at 136 and gets the cold run's
    logits, and one that shares all but its last 100 tokens continues the checkpoint at 72."""
    from gguf import GGMLQuantizationType as QT

    spec, model = _model(write_tiny_ssm("falcon-h1", tmp_path / "q8.gguf", qtype=QT.Q8_0))
    ids = tiny_prompt(200)
    engine = Engine(model, 256, kv_dtype="f16")
    first = engine.prefill(ids, GenerationStats())
    assert list(engine.kv.checkpoints) == [72, 136, 200] and engine.kv.canonical == 200
    stats = GenerationStats()
    again = engine.prefill(ids, stats)
    assert stats.reused_tokens == 136 and torch.equal(first, again)
    other = ids[:100] + tiny_prompt(100, seed=7)  # another 100-token question after the same 100
    cold = Engine(model, 256, kv_dtype="f16").prefill(other, GenerationStats())
    stats = GenerationStats()
    assert torch.equal(engine.prefill(other, stats), cold) and stats.reused_tokens == 72


def test_tail_cuts_reach_into_the_chunk_before_a_short_last_one():
    """A 2,100-token prompt's plan ends (1536, 2036), (2036, 2100): the cut 2·min_rows before the
    end goes into the chunk before, so a second prompt sharing its first 2,000 tokens resumes at
    1972, not 1536; every part keeps >= min_rows rows; no cut without checkpoints."""
    from types import SimpleNamespace

    from tallow.engine.prefill_plan import PrefillPlan

    plan = PrefillPlan(512, row_invariant=True, min_rows=64)
    chunks = RecurrentMemory.prefill_chunks(SimpleNamespace(keep=4), plan, 0, 2100)
    assert chunks[-3:] == [(1536, 1972), (1972, 2036), (2036, 2100)] and all(b - a >= 64 for a, b in chunks)
    assert RecurrentMemory.prefill_chunks(SimpleNamespace(keep=4), plan, 0, 100) == [(0, 100)]
    assert RecurrentMemory.prefill_chunks(SimpleNamespace(keep=0), plan, 0, 2100) == plan.chunks(0, 2100)
