"""Conformance with llama.cpp: tiny random-weight models of every architecture (exact
logits), and the three real models (greedy continuations and teacher-forced logits).

Fixtures come from scripts/make_fixtures.py (llama-cpp-python 0.3.36). Bounds:
- Tiny F32 models run without llama.cpp's activation quantization, so they must agree to
  float32 rounding (gemma3 to 5e-3: ggml's GELU reads an fp16 table we emulate, but its
  rounding of table entries differs from torch's tanh in a few places).
- On quantized models llama.cpp rounds activations to 8-bit blocks with fp16 scales and we
  round them to bf16: both are ~0.4% noise per activation, which moves logits by ~0.2 on
  average. A greedy divergence therefore passes only at a near-tie: llama.cpp's own top-2
  gap at that step below NEAR_TIE[model]. The bound is the 99th percentile of how far our
  top-1/top-2 gap differs from llama.cpp's, measured teacher-forced over the fixture text
  (smollm2 0.65, gemma3 0.76, qwen2.5 0.48; medians 0.12/0.17/0.08), rounded up. For
  scale: DESIGN.md measured two llama.cpp builds diverging at gaps up to 0.34.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from model_paths import require_model
from tiny_models import ARCHITECTURES, write_tiny_model

from tallow.gguf_file import GGUFFile
from tallow.memory.kv_pool import KVPool
from tallow.models import build_model
from tallow.spec import spec_from_gguf

FIXTURES = Path(__file__).parent / "fixtures"
REAL_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct")
NEAR_TIE = {"smollm2-135m": 0.7, "gemma3-270m": 0.8, "qwen2.5-coder-1.5b-instruct": 0.5}
# For suite time (qwen2.5-1.5b decodes ~10 tokens/s on two cores) the continuations are checked
# over their first 24 tokens on qwen2.5 and 32 on gemma3 (smollm2 all 64).
GREEDY_TOKENS = {"qwen2.5-coder-1.5b-instruct": 24, "gemma3-270m": 32}
# The fixtures hold 12 prompts, each raw then as a chat turn (24 cases, alternating). qwen2.5 and
# gemma3 run every prompt once, raw and chat in turn, each the half the other leaves out, so that
# every (prompt, mode) case still runs on one of the two larger models. qwen2.5: cases 0, 3, 4, 7,
# ... (France raw, fibonacci chat, fruits raw, once-upon chat, 17x23 raw, translate chat, JSON raw,
# thermodynamics chat, haiku raw, SELECT chat, Apollo raw, kitchen-lights chat), two of whose chat
# answers end in an end-of-generation token inside the 24 (translate: 9 tokens, kitchen lights:
# 21); gemma3: cases 1, 2, 5, 6, ... (France chat, fibonacci raw, ...). smollm2 runs all 24 cases.
GREEDY_CASES = {"qwen2.5-coder-1.5b-instruct": [i * 2 + i % 2 for i in range(12)],
                "gemma3-270m": [i * 2 + 1 - i % 2 for i in range(12)]}
# gemma4: the same fp16 GELU table as gemma3, in more places (a double-wide MLP, the per-layer
# embeddings' gate), where a GELU input one float ulp across an fp16 rounding edge moves its
# output a whole fp16 ulp. Measured max |Δlogit|: 2.0e-3 (31B style, tied logits up to ~10)
# and 1.05e-2 (E2B style, untied logits up to 24), the same as our own prefill in chunks of 5
# against one batch on that model (1.05e-2): rounding order alone, not a difference in the model.
TINY_TOLERANCE = {"llama": 1e-4, "qwen2": 1e-4, "qwen3": 1e-4, "gemma3": 5e-3, "gemma4": 2e-2, "gemma4-31b": 5e-3}
# Teacher-forced bounds. At positions where llama.cpp's own top-2 gap is below NEAR_TIE,
# its activation rounding alone decides the argmax (our exact-weight fp32 reference agrees
# with it there no more often than our fast path does), so top-1 agreement is required at
# >= 99% on the other positions, and reported on all. |Δlogit| bounds: measured, with margin.
TEACHER_TOP1_DECIDED_MIN = 0.99
TEACHER_TOP1_ALL_MIN = 0.90
TEACHER_MAX_DELTA = 3.0
TEACHER_MEAN_DELTA = 0.35




@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tiny_model_logits_match_llama_cpp(arch, tmp_path):
    ref = json.loads((FIXTURES / f"tiny_{arch}.json").read_text())
    path = write_tiny_model(arch, tmp_path / f"tiny-{arch}.gguf")
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    # F32 KV like the fixture (llama.cpp run with type_k = type_v = F32).
    out = model.forward(ref["ids"], 0, KVPool(spec, 64, torch.float32), all_logits=True).numpy()
    delta = np.abs(out - np.array(ref["logits"], dtype=np.float32)).max()
    assert delta < TINY_TOLERANCE[arch], f"{arch}: max |Δlogit| {delta:.2e}"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tiny_model_incremental_decode_matches_batch(arch, tmp_path):
    """Token-by-token decode through the KV pool equals one batched forward pass,
    including gemma3's sliding-window layers past the window edge (window 8, 24 tokens)."""
    ref = json.loads((FIXTURES / f"tiny_{arch}.json").read_text())
    path = write_tiny_model(arch, tmp_path / f"tiny-{arch}.gguf")
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    ids = ref["ids"]
    batch = model.forward(ids, 0, KVPool(spec, 64, torch.float32), all_logits=True)
    kv = KVPool(spec, 64, torch.float32)
    steps = torch.cat([model.forward([t], i, kv) for i, t in enumerate(ids)])
    assert (steps - batch).abs().max().item() < TINY_TOLERANCE[arch]


@pytest.fixture(scope="module", params=REAL_MODELS)
def real(request):
    """(name, loaded model), one real model in memory at a time: pytest runs every test of this
    module that uses it on one model before loading the next, so each loads once, not once per test."""
    import tallow

    name = request.param
    return name, tallow.LLM(require_model(name), ctx=1024)


def test_greedy_continuations_match_llama_cpp(real):
    name, llm = real
    fixture = json.loads((FIXTURES / f"conformance_{name}.json").read_text())
    eog = llm.tokenizer.eog_ids
    report, failures = [], []
    for case in [fixture["greedy"][i] for i in GREEDY_CASES.get(name, range(len(fixture["greedy"])))]:
        expected = case["ids"][: GREEDY_TOKENS.get(name)]
        ours = llm.generate(case["prompt_ids"], max_tokens=len(expected), temperature=0).tokens
        if expected and expected[-1] in eog:
            expected = expected[:-1]  # our tokens exclude the end-of-generation token
        n = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), min(len(ours), len(expected)))
        if n == len(expected) and len(ours) == len(expected):
            report.append(f"{case['mode']:4s} identical ({n} tokens)")
            continue
        gap = case["gaps"][n] if n < len(case["gaps"]) else float("inf")
        report.append(f"{case['mode']:4s} diverges at step {n} of {len(expected)}, llama.cpp top-2 gap {gap:.3f}")
        if gap >= NEAR_TIE[name]:
            failures.append(f"{case['mode']} {case['prompt'][:40]!r}: step {n}, gap {gap:.3f} ≥ {NEAR_TIE[name]}")
    print(f"\n{name}:\n  " + "\n  ".join(report))
    assert not failures, "divergences that are not near-ties:\n" + "\n".join(failures)


def test_teacher_forced_logits_match_llama_cpp(real):
    name, llm = real
    fixture = json.loads((FIXTURES / f"conformance_{name}.json").read_text())["teacher_forced"]
    llm.engine.reset()
    ids = fixture["ids"]
    kv = llm.engine.kv
    ours = torch.cat([llm.model.forward(ids[s : s + 256], s, kv, all_logits=True) for s in range(0, len(ids), 256)]).cpu()
    # Position 0 is left out: without a BOS (qwen) the first token carries activations in
    # the thousands, where llama.cpp's 8-bit activation blocks are coarse (|Δlogit| ~12 there
    # for our exact-weight fp32 reference too). Its logits only ever predict prompt token 1.
    ours = ours[1:]
    top_ids = torch.tensor(fixture["top_ids"])[1:]
    ref_top = torch.tensor(fixture["top_logits"])[1:]
    same = ours.argmax(-1) == top_ids[:, 0]
    decided = (ref_top[:, 0] - ref_top[:, 1]) >= NEAR_TIE[name]
    agree_all = same.float().mean().item()
    agree_decided = same[decided].float().mean().item()
    delta = (ours.gather(1, top_ids) - ref_top).abs()
    print(
        f"\n{name}: {len(ids) - 1} positions, top-1 agreement {agree_all:.4f} (all), {agree_decided:.4f} on the"
        f" {int(decided.sum())} positions with a top-2 gap >= {NEAR_TIE[name]}; |Δlogit| max {delta.max():.3f}, mean {delta.mean():.3f}"
    )
    assert agree_decided >= TEACHER_TOP1_DECIDED_MIN
    assert agree_all >= TEACHER_TOP1_ALL_MIN
    assert delta.max().item() <= TEACHER_MAX_DELTA
    assert delta.mean().item() <= TEACHER_MEAN_DELTA


GEMMA4_VARIANTS = ("gemma4", "gemma4-31b")


def _tiny(arch: str, tmp_path, qtype=None):
    from gguf import GGMLQuantizationType as QT

    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"tiny-{arch}.gguf", qtype=qtype or QT.F32))
    spec = spec_from_gguf(gf)
    return spec, build_model(gf, spec)


@pytest.mark.parametrize("arch", GEMMA4_VARIANTS)
@pytest.mark.parametrize("max_chunk", [64, 5])
def test_tiny_gemma4_greedy_matches_llama_cpp(arch, max_chunk, tmp_path):
    """Greedy decode of 16 tokens after the 24-token prompt (positions to 39, window 8), token by
    token through the pool, equals llama.cpp's; with max_chunk 5 the sliding layers are rings of
    12 slots that wrap several times, read by the shared-KV layers too."""
    ref = json.loads((FIXTURES / f"tiny_{arch}.json").read_text())
    spec, model = _tiny(arch, tmp_path)
    kv = KVPool(spec, 64, torch.float32, max_chunk=max_chunk)
    assert kv.has_rings == (max_chunk == 5)
    logits = model.forward(ref["ids"], 0, kv, all_logits=True)
    delta = (logits - torch.tensor(ref["logits"])).abs().max().item()
    assert delta < TINY_TOLERANCE[arch], f"{arch}: prompt max |Δlogit| {delta:.2e}"
    ours, row = [], logits[-1:]
    for i in range(len(ref["greedy"]["ids"])):
        ours.append(int(row.argmax()))
        row = model.forward([ours[-1]], len(ref["ids"]) + i, kv)
    assert ours == ref["greedy"]["ids"], f"llama.cpp top-2 gaps: {ref['greedy']['gaps']}"


def test_tiny_gemma4_shared_layers_own_no_cache(tmp_path):
    """The E2B-style tiny model's 3 trailing layers read layers 3 (sliding) and 4 (global): they
    hold no tensors of their own, and the pool's bytes are the 5 cached layers' only."""
    spec, _ = _tiny("gemma4", tmp_path)
    assert [layer.kv_source for layer in spec.layers] == [0, 1, 2, 3, 4, 3, 3, 4]
    kv = KVPool(spec, 64, torch.float32)
    assert kv.k[5] is kv.k[3] and kv.v[7] is kv.v[4]
    assert kv.owners == [0, 1, 2, 3, 4]
    per_token = sum(2 * layer.n_kv_heads * layer.head_dim * 4 for layer in spec.layers[:5])
    assert kv.nbytes == 64 * per_token


TINY_QUANTIZED_NEAR_TIE = 0.5  # as for the real Q4 models: 8-bit activation rounding moves gaps by ~0.3 here


@pytest.mark.parametrize("arch, qtype", [("gemma4", "Q8_0"), ("gemma4-31b", "Q4_0")])
def test_tiny_gemma4_quantized_greedy_matches_llama_cpp(arch, qtype, tmp_path):
    """Quantized weights: llama.cpp rounds activations to 8 bits, we keep them in float, so
    logits differ a little. The 16 greedy tokens must be llama-server's (fixture from
    ../shared/llama.cpp: llama-cpp-python dies of SIGILL on quantized products here) up to a
    near-tie: a divergence passes only at a step whose llama.cpp top-2 gap is known and below
    TINY_QUANTIZED_NEAR_TIE, after at least 8 identical tokens. (The server gives no gap for a
    byte token that is not whole UTF-8, so its gaps come as (token, gap) pairs, matched in order.)"""
    from gguf import GGMLQuantizationType as QT

    ref = json.loads((FIXTURES / f"tiny_{arch}-{qtype.lower()}.json").read_text())
    expected, pairs = ref["greedy"]["ids"], ref["greedy"]["gaps_by_id"]
    gaps, j = [], 0
    for tok in expected:
        if j < len(pairs) and pairs[j][0] == tok:
            gaps.append(pairs[j][1])
            j += 1
        else:
            gaps.append(None)
    spec, model = _tiny(arch, tmp_path, QT[qtype])
    kv = KVPool(spec, 64, torch.float32)
    row, ours = model.forward(ref["ids"], 0, kv), []
    for i in range(len(expected)):
        ours.append(int(row.argmax()))
        row = model.forward([ours[-1]], len(ref["ids"]) + i, kv)
    n = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), len(expected))
    if n < len(expected):
        assert n >= 8 and gaps[n] is not None and gaps[n] < TINY_QUANTIZED_NEAR_TIE, \
            f"diverges at step {n}: ours {ours}, llama.cpp {expected}, its gaps {gaps}"
