"""Routed-expert models on the CPU against llama.cpp: tiny random-weight qwen3moe and Gemma 4
26B-A4B-style ("gemma4-moe") models (tests/tiny_models.py).

Fixtures (scripts/make_fixtures.py): llama-cpp-python 0.3.36 on the F32 model, with an eval
callback that copies out each layer's router logits (`ffn_moe_logits-<il>`) and chosen experts
(`ffn_moe_topk-<il>`) for every token it evaluates; llama-server b11434 for the Q8_0/Q4_0
models' greedy tokens (llama-cpp-python dies of SIGILL in quantized products here).
Bounds: the F32 logits to the dense families' (qwen3 1e-4, measured 1.8e-6; gemma4-31b's 5e-3 for
ggml's fp16 GELU table, measured 1.8e-4); routing
identical token by token, and shown not to be luck: the smallest gap at any token's top-k
boundary in llama.cpp's router logits is over twice the largest router-logit difference (the
least at which two experts could trade places; measured: qwen3moe 560x, gemma4-moe 6.8x).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from tiny_models import MOE_ARCHITECTURES, MOE_EXPERTS, MOE_USED, write_tiny_model
from test_conformance import NEAR_TIE  # two llama.cpp builds agree up to such gaps

import tallow
import tallow.kernels.cpu.moe as cpu_moe
from tallow.errors import ModelFileError
from tallow.gguf_file import GGUFFile
from tallow.memory import budget
from tallow.memory.kv_pool import KVPool
from tallow.models import build_model
from tallow.spec import spec_from_gguf

FIXTURES = Path(__file__).parent / "fixtures"
# As tiny qwen3 and gemma4-31b (tests/test_conformance.py); router logits: fp32 products alone.
TOLERANCE = {"qwen3moe": 1e-4, "gemma4-moe": 5e-3}
ROUTER_TOLERANCE = 1e-4


def _model(tmp_path, qtype=QT.F32, arch="qwen3moe"):
    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"tiny-{arch}-{qtype.name}.gguf", qtype=qtype))
    spec = spec_from_gguf(gf)
    return spec, build_model(gf, spec)


class _Routes:
    """Records every (router logits, chosen experts) the model computes, in call order."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = cpu_moe.route_softmax

        def record(logits, k):
            weights, ids = real(logits, k)
            self.calls.append((logits.detach().clone(), ids.clone()))
            return weights, ids

        monkeypatch.setattr(cpu_moe, "route_softmax", record)

    def per_layer(self, n_layers: int):
        """Per layer: router logits (tokens, n_experts) and expert ids (tokens, k), calls concatenated."""
        out = []
        for il in range(n_layers):
            calls = self.calls[il::n_layers]
            out.append((torch.cat([c[0] for c in calls]), torch.cat([c[1] for c in calls])))
        return out


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_tiny_moe_logits_and_routing_match_llama_cpp(tmp_path, monkeypatch, arch):
    """Prompt in one batch, then 16 greedy steps token by token: the logits within the bound, the
    greedy tokens llama.cpp's, and every token's chosen experts llama.cpp's, in its slot order."""
    ref = json.loads((FIXTURES / f"tiny_{arch}.json").read_text())
    spec, model = _model(tmp_path, arch=arch)
    routes = _Routes(monkeypatch)
    kv = KVPool(spec, 64, torch.float32)
    logits = model.forward(ref["ids"], 0, kv, all_logits=True)
    delta = (logits - torch.tensor(ref["logits"])).abs().max().item()
    assert delta < TOLERANCE[arch], f"prompt max |Δlogit| {delta:.2e}"
    ours, row = [], logits[-1:]
    for i in range(len(ref["greedy"]["ids"])):
        ours.append(int(row.argmax()))
        row = model.forward([ours[-1]], len(ref["ids"]) + i, kv)
    assert ours == ref["greedy"]["ids"], f"llama.cpp top-2 gaps: {ref['greedy']['gaps']}"
    k = spec.n_experts_used
    for il, (our_logits, our_ids) in enumerate(routes.per_layer(spec.n_layers)):
        theirs = ref["routing"][il]
        # llama.cpp evaluated the last greedy token too; we stopped after computing its logits.
        n = our_ids.shape[0]
        their_ids = torch.tensor(theirs["experts"][:n])
        their_logits = torch.tensor(theirs["router_logits"][:n])
        assert torch.equal(our_ids, their_ids.long()), f"layer {il}: routing differs"
        router_delta = (our_logits - their_logits).abs().max().item()
        top = their_logits.sort(dim=-1, descending=True).values
        boundary = (top[:, k - 1] - top[:, k]).min().item()
        # Every router logit of ours is within router_delta of llama.cpp's, so two experts can swap
        # places only where llama.cpp's gap between them is <= 2 * router_delta: no boundary is.
        assert router_delta < ROUTER_TOLERANCE and boundary > 2 * router_delta, (il, router_delta, boundary)


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_a_flipped_expert_moves_the_logits_far_past_the_bound(tmp_path, monkeypatch, arch):
    """The logit bound sees routing: choosing each token's (k+1)-th expert instead of its k-th
    moves the logits by far more than the bound."""
    spec, model = _model(tmp_path, arch=arch)
    ids = json.loads((FIXTURES / f"tiny_{arch}.json").read_text())["ids"]
    good = model.forward(ids, 0, KVPool(spec, 64, torch.float32), all_logits=True)
    real = cpu_moe.route_softmax

    def flipped(logits, k):
        weights, chosen = real(logits, k + 1)
        return weights[:, [*range(k - 1), k]], chosen[:, [*range(k - 1), k]]

    monkeypatch.setattr(cpu_moe, "route_softmax", flipped)
    bad = model.forward(ids, 0, KVPool(spec, 64, torch.float32), all_logits=True)
    assert (bad - good).abs().max().item() > 20 * TOLERANCE[arch]


@pytest.mark.parametrize("arch, qtype", [("qwen3moe", QT.F32), ("qwen3moe", QT.Q4_0), ("qwen3moe", QT.Q8_0),
                                         ("gemma4-moe", QT.Q4_0)])
def test_grouped_experts_equal_token_by_token(tmp_path, monkeypatch, arch, qtype):
    """A chunk's experts each run once over all their rows (default) or token by token in slot
    order (TALLOW_MOE_GROUPED=0, decode's way): the int4/int8 kernels are row-exact below 64
    rows, so the quantized logits are bit-identical; F32 (one GEMM vs GEMVs) within rounding (relative
    to the largest logit: the absolute 1e-5 this had failed at 1.34e-5 on a Sapphire Rapids CPU, whose
    fp32 GEMM kernels sum in another order)."""
    spec, model = _model(tmp_path, qtype, arch)
    ids = json.loads((FIXTURES / "tiny_qwen3moe.json").read_text())["ids"]
    grouped = model.forward(ids, 0, KVPool(spec, 64, torch.float32), all_logits=True)
    monkeypatch.setenv("TALLOW_MOE_GROUPED", "0")
    single = model.forward(ids, 0, KVPool(spec, 64, torch.float32), all_logits=True)
    if qtype == QT.F32:  # fp32 rounding: a few ulps of the largest logit (4.7e-7 of it measured on an AMX CPU)
        assert (grouped - single).abs().max().item() < 1e-6 * single.abs().max().item()
    else:
        assert torch.equal(grouped, single)


def test_experts_read_only_the_chosen_experts(tmp_path, monkeypatch):
    """A decode step calls exactly the k chosen experts' linears of each layer, once each."""
    spec, model = _model(tmp_path, QT.Q4_0)
    routes = _Routes(monkeypatch)
    called = []
    for w in model.layers:
        bank = w.ffn_experts
        real = bank.expert
        monkeypatch.setattr(bank, "expert", lambda e, x, glu, real=real, il=w.index: (called.append((il, e)), real(e, x, glu))[1])
    kv = KVPool(spec, 64, torch.float32)
    model.forward([1, 2, 3], 0, kv)
    routes.calls.clear()
    called.clear()
    model.forward([4], 3, kv)
    expected = [(il, e) for il, (_, chosen) in enumerate(routes.calls) for e in chosen[0].tolist()]
    assert called == expected and len(called) == spec.n_layers * MOE_USED


@pytest.mark.parametrize("arch, qtype", [(a, q) for a in MOE_ARCHITECTURES for q in ("Q8_0", "Q4_0")]
                         + [("qwen3moe", "MXFP4"), ("qwen3moe", "NVFP4")])  # 4-bit float experts, Q8_0 elsewhere
def test_quantized_greedy_through_the_api_matches_llama_server(tmp_path, arch, qtype):
    """`tallow.load(...).generate` on the CPU (int8 / int4 experts, f16 KV) gives llama-server's 16
    greedy tokens on the fixture's prompt. Routing amplifies activation rounding: where a token's
    top-k boundary is a near-tie, llama.cpp's 8-bit activations and our float ones can pick
    different experts and the logits move by ~0.5; of 12 prompts 7-11 per model give identical
    tokens (scripts/make_fixtures.py, QUANTIZED_MOE_PROMPT_SEED, says which prompt and why)."""
    ref = json.loads((FIXTURES / f"tiny_{arch}-{qtype.lower()}.json").read_text())
    expected, pairs = ref["greedy"]["ids"], ref["greedy"]["gaps_by_id"]
    gaps, j = [], 0
    for tok in expected:
        if j < len(pairs) and pairs[j][0] == tok:
            gaps.append(pairs[j][1])
            j += 1
        else:
            gaps.append(None)
    path = write_tiny_model(arch, tmp_path / f"moe-{qtype}.gguf", qtype=QT[qtype])
    llm = tallow.load(path, ctx=64, device="cpu", progress=False)
    ours = llm.generate(ref["ids"], max_tokens=len(expected), temperature=0).tokens
    if expected[-1] in llm.tokenizer.eog_ids:
        expected = expected[:-1]  # our tokens exclude the end-of-generation token
    # Identical up to llama.cpp's own first near-tie (tests/test_conformance.py's rule and bound): the Q4_0 files'
    # dense products run in llama.cpp's arithmetic (the C kernel), the experts in the torch kernels.
    n = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), min(len(ours), len(expected)))
    tie = next((i for i, g in enumerate(gaps) if g is not None and g < NEAR_TIE), len(gaps))
    assert (n == len(expected) == len(ours)) or n >= tie, f"ours {ours}, llama.cpp {expected}, its gaps {gaps}"


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_f32_greedy_through_the_api_matches_llama_cpp(tmp_path, arch):
    ref = json.loads((FIXTURES / f"tiny_{arch}.json").read_text())
    llm = tallow.load(write_tiny_model(arch, tmp_path / "moe.gguf"), ctx=64, device="cpu", progress=False)
    assert llm.generate(ref["ids"], max_tokens=16, temperature=0).tokens == ref["greedy"]["ids"]


@pytest.mark.parametrize("arch, qtype", [("qwen3moe", QT.F32), ("qwen3moe", QT.Q4_0), ("qwen3moe", QT.Q8_0),
                                         ("qwen3moe", QT.MXFP4), ("qwen3moe", QT.NVFP4), ("gemma4-moe", QT.Q4_0)])
def test_plan_counts_expert_tensors_exactly(tmp_path, arch, qtype):
    """The plan's bytes for the 3-D expert tensors equal what the expert banks hold (each
    expert its own linear, padded alone); the whole plan stays within the dense families' 2%."""
    path = write_tiny_model(arch, tmp_path / "moe.gguf", qtype=qtype)
    with GGUFFile(path) as gf:
        spec = spec_from_gguf(gf)
        model = build_model(gf, spec)
        planned = sum(t.shape[2] * budget.linear_bytes(t.shape[1], t.n_cols, budget.linear_kind(t.qtype))
                      for t in gf.tensors.values() if len(t.shape) == 3)
        held = sum(w.ffn_experts.nbytes - w.ffn_experts.out_scale.numel() * 4 if w.ffn_experts.out_scale is not None
                   else w.ffn_experts.nbytes for w in model.layers)  # out scales: 1-D, counted with the norms
        assert planned == held
        total = budget.weights_bytes(gf)
        assert abs(total - model.nbytes) <= 0.02 * model.nbytes


@pytest.mark.parametrize("arch, line", [
    ("qwen3moe", f"experts       {MOE_EXPERTS} routed, {MOE_USED} per token, width 32, on layers 0-1"),
    ("gemma4-moe", f"experts       {MOE_EXPERTS} routed, {MOE_USED} per token, width 32, beside a shared MLP, on layers 0-3")])
def test_inspect_shows_the_experts(tmp_path, capsys, arch, line):
    from tallow.cli import main

    path = write_tiny_model(arch, tmp_path / "moe.gguf", qtype=QT.Q4_0)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert line in out
    assert "a token reads" in out


def test_bad_expert_metadata_and_shapes_are_one_sentence(tmp_path):
    from gguf import GGUFReader  # noqa: F401  (the writer's own reader is not needed: patch the file)

    path = write_tiny_model("qwen3moe", tmp_path / "moe.gguf")
    raw = bytearray(path.read_bytes())
    key = b"qwen3moe.expert_count"
    at = raw.index(key)
    raw[at : at + len(key)] = b"qwen3moe.expert_cnnnt"
    bad = tmp_path / "no-count.gguf"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ModelFileError, match="expert_count is missing"):
        spec_from_gguf(GGUFFile(bad))
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    wrong = spec.__class__(**{**spec.__dict__, "expert_ffn_dim": 16})
    with pytest.raises(ModelFileError, match="ffn_down_exps.weight has shape"):
        build_model(gf, wrong)


def test_gate_and_up_scales_multiply_each_half_before_the_glu(tmp_path):
    """NVFP4 files' per-expert scales of gate and up (ffn_gate_exps.scale / ffn_up_exps.scale)
    multiply the gate and up halves of the product's output, as llama.cpp's build_lora_mm_id."""
    from tallow.kernels.cpu.moe import ExpertBank
    from tallow.layers import swiglu

    _, model = _model(tmp_path, QT.Q8_0)
    bank = model.layers[0].ffn_experts
    scale = torch.rand(bank.n_experts, 2) + 0.5
    scaled = ExpertBank(bank.gate_up, bank.down, None, scale)
    x = torch.randn(3, 64)

    def glu(gu):
        f = gu.shape[-1] // 2
        return swiglu(gu[:, :f], gu[:, f:])

    gu = bank.gate_up[5](x)
    f = gu.shape[-1] // 2
    want = bank.down[5](glu(torch.cat((gu[:, :f] * scale[5, 0], gu[:, f:] * scale[5, 1]), dim=1)))
    assert torch.equal(scaled.expert(5, x, glu), want)


def test_a_weight_scale_tallow_does_not_apply_is_refused(tmp_path):
    """An NVFP4 file's per-tensor scale on a dense weight (blk.N.attn_q.scale) is not applied: the
    load stops with one sentence instead of running without it."""
    gf = GGUFFile(write_tiny_model("qwen3moe", tmp_path / "moe.gguf"))
    gf.tensors["blk.1.attn_q.scale"] = gf.tensors["blk.1.ffn_norm.weight"]
    with pytest.raises(ModelFileError, match="blk.1.attn_q.scale .* not applied"):
        build_model(gf, spec_from_gguf(gf))


def test_experts_map_from_the_weight_cache_and_speculation_keeps_the_tokens(tmp_path, monkeypatch):
    """A second load maps every expert's packed linear from the weight cache (a hit) and gives
    the same greedy tokens; forcing speculation (off by default: the F32 router is not a
    row-exact kernel) changes no token either."""
    monkeypatch.setenv("TALLOW_HOME", str(tmp_path / "home"))
    ref = json.loads((FIXTURES / "tiny_qwen3moe-q4_0.json").read_text())
    path = write_tiny_model("qwen3moe", tmp_path / "moe.gguf", qtype=QT.Q4_0)
    first = tallow.load(path, ctx=64, device="cpu", progress=False)
    tokens = first.generate(ref["ids"], max_tokens=16, temperature=0).tokens
    second = tallow.load(path, ctx=64, device="cpu", progress=False)
    assert second.stats.load.weight_cache == "hit"
    assert second.generate(ref["ids"], max_tokens=16, temperature=0).tokens == tokens
    monkeypatch.setenv("TALLOW_SPECULATE", "1")
    llm = tallow.load(path, ctx=64, device="cpu", progress=False)
    repeated = ref["ids"] * 2  # a prompt that repeats itself: drafts to verify
    out = llm.generate(repeated, max_tokens=16, temperature=0)
    monkeypatch.setenv("TALLOW_SPECULATE", "0")
    plain = tallow.load(path, ctx=64, device="cpu", progress=False).generate(repeated, max_tokens=16, temperature=0)
    assert out.tokens == plain.tokens and llm.stats.last.draft_tokens > 0


def test_a_bank_of_row_exact_experts_is_not_called_row_invariant(tmp_path):
    """Even with every matrix in a row-exact int4 kernel (router included), how many rows an
    expert gets in a chunk picks its kernel, so the prefill plan must not treat the model as
    row-invariant, and speculation is not on by default."""
    from tallow.engine.prefill_plan import plan_for
    from tallow.engine.speculate import rows_are_exact

    spec, model = _model(tmp_path, QT.Q4_0)
    for w in model.layers:  # as if the router were quantized too
        w.tensors["ffn_gate_inp"] = SimpleNamespace(kind="int4")
    assert model.layers[0].ffn_experts.kind == "routed+int4"
    assert not rows_are_exact(model) and not plan_for(model, 64).row_invariant
