"""The same request gives the same greedy answer whatever the cache holds (issue 13).

For each prompt the cold answer (empty pool) is the reference; then the same prompt runs
after other cache states — the identical request again, requests sharing part of it, the
previous turn of a conversation, the pool restored from disk, speculation on and off — and
the logits of the first generated token must be bit-identical and the greedy tokens equal.
Runs on the GPU too when one is present (real models where the machine has them, tiny
random-weight models always).
"""

from __future__ import annotations

import pytest
import torch

from model_paths import require_model
from tiny_models import write_tiny_model

from tallow.engine.engine import Engine, GenerationStats
from tallow.engine.prefill_plan import PrefillPlan, plan_for
from tallow.gguf_file import GGUFFile
from tallow.models import build_model
from tallow.sampling import Sampler, SamplingParams
from tallow.spec import spec_from_gguf

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GREEDY = SamplingParams(temperature=0.0)

SYSTEM = ("You are the assistant of a small bakery in Lyon. You answer questions about opening hours "
          "(Tuesday to Sunday, 7:00 to 19:30), the bread of the day, cakes to order two days ahead, and "
          "allergens: every product may contain gluten, eggs, milk and nuts. Keep answers short, friendly and "
          "precise, and never invent a product that is not on the menu. ")
QUESTIONS = ["Say hello in French.", "Are you open on Monday morning?", "Can I order a birthday cake for Saturday?"]
TEXT = ("The river wound through the valley past the old mill, where the miller's daughter kept the ledgers "
        "of every sack of grain that came down from the farms on the hill. In the spring the water rose ")


def answer(engine: Engine, prompt: list[int], n: int, conversation_id: str | None = None):
    """(logits of the first generated token, greedy tokens, stats) from whatever the pool holds now."""
    stats, seen = GenerationStats(), []
    sampler = Sampler(GREEDY, engine.model.spec.vocab_size)
    tokens = list(engine.generate(prompt, n, sampler, set(), stats, conversation_id=conversation_id,
                                  observe=lambda token, logits: seen.append(logits.detach().float().cpu().clone())))
    return seen[0], tokens, stats


def same(got, ref, what: str) -> None:
    assert torch.equal(got[0], ref[0]), f"{what}: first-token logits differ by {(got[0] - ref[0]).abs().max().item():.3g}"
    assert got[1] == ref[1], f"{what}: greedy tokens differ"


def check_cache_states(engine: Engine, prompts: list[list[int]], n: int, monkeypatch, tmp_path,
                       spec_off: bool = True) -> int:
    """Each prompt's answer from a cold pool equals its answer after other cache states; returns
    the prompt tokens reused in all (the states must actually reuse something)."""
    engine.kv_store_dir = str(tmp_path / "kv")
    cold = []
    for prompt in prompts:
        engine.reset()
        cold.append(answer(engine, prompt, n))
    reused = 0

    def check(i: int, what: str, conversation_id: str | None = None) -> GenerationStats:
        nonlocal reused
        got = answer(engine, prompts[i], n, conversation_id)
        reused += got[2].reused_tokens
        same(got, cold[i], f"prompt {i} {what}")
        return got[2]

    # One after another, each after whatever the one before left: the same request again, then
    # requests sharing a system prompt or a text's beginning (part of the pool), then one back.
    order = [0, 0] + list(range(1, len(prompts))) + [0]
    for j, i in enumerate(order):
        check(i, f"after prompt {order[j - 1]}" if j else "again")
    # A pool holding all but the last few tokens of the prompt, then a different ending.
    engine.reset()
    answer(engine, prompts[0][:-5], 3)
    check(0, "after its own beginning")
    answer(engine, prompts[0][:-40] + prompts[-1][-30:], 3)
    check(0, "after a request that parts from it 40 tokens before its end")
    # Disk: the previous turn saved, then the pool emptied (a restart).
    answer(engine, prompts[0][:-8], 4, conversation_id="disk")
    engine.reset()
    stats = check(0, "restored from disk", conversation_id="disk")
    # Reusable: on the CPU all but the last 64 tokens; elsewhere whole chunks (engine/prefill_plan.py).
    plan = plan_for(engine.model, engine.prefill_chunk)
    reusable = len(prompts[0]) - plan.min_rows if plan.row_invariant else (len(prompts[0]) - 8) // plan.chunk * plan.chunk
    assert stats.reused_from_disk > 0 or reusable <= 0, "nothing came from the disk"
    if spec_off:  # speculative decoding on (the default for quantized weights) and off
        monkeypatch.setenv("TALLOW_SPECULATE", "0")
        check(len(prompts) - 1, "with speculation off")
        monkeypatch.delenv("TALLOW_SPECULATE")
    return reused


# -- the plan itself ----------------------------------------------------------------------
def test_plan_chunks_and_reuse_points():
    inv = PrefillPlan(512, row_invariant=True, min_rows=64)
    assert inv.start(shared=300, canonical=300, n=301) == 237  # the last chunk keeps >= 64 rows
    assert inv.start(shared=300, canonical=120, n=1000) == 120  # never past what is canonical
    assert inv.start(shared=30, canonical=30, n=40) == 0  # too short to reuse anything
    assert inv.chunks(0, 530) == [(0, 466), (466, 530)]  # never a last chunk under 64 rows
    assert inv.chunks(100, 1200) == [(100, 612), (612, 1124), (1124, 1200)]
    assert all(b - a >= 64 for n in range(64, 1500, 37) for a, b in inv.chunks(0, n))
    aligned = PrefillPlan(512, row_invariant=False)
    assert aligned.start(shared=1500, canonical=1024, n=2000) == 1024
    assert aligned.start(shared=1500, canonical=1500, n=2000) == 1024  # a boundary, never mid-chunk
    assert aligned.chunks(1024, 1600) == [(1024, 1536), (1536, 1600)]
    assert aligned.extends_canonical(1024, 1536, 1024) and not aligned.extends_canonical(1536, 1600, 1536)
    old = PrefillPlan(512, row_invariant=False, stable=False)  # TALLOW_ALIGNED_REUSE=0
    assert old.start(shared=300, canonical=0, n=301) == 300 and not old.extends_canonical(0, 512, 0)


# -- tiny random-weight models: every architecture, fast, CPU and GPU ----------------------
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_tiny_models_answer_the_same_whatever_the_cache(tmp_path, monkeypatch, arch):
    from gguf import GGMLQuantizationType as QT

    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf", qtype=QT.Q4_0))
    spec = spec_from_gguf(gf)
    engine = Engine(build_model(gf, spec, device=DEVICE), n_ctx=256, prefill_chunk=128)
    plan = plan_for(engine.model, engine.prefill_chunk)
    assert plan.row_invariant == (DEVICE == "cpu")
    gen = torch.Generator().manual_seed(3)
    head = torch.randint(0, 256, (100,), generator=gen).tolist()
    prompts = [head + torch.randint(0, 256, (n,), generator=gen).tolist() for n in (60, 10, 100)]
    reused = check_cache_states(engine, prompts, 6, monkeypatch, tmp_path)
    assert reused > 0


def test_old_reuse_switch_reuses_more(tmp_path, monkeypatch):
    """TALLOW_ALIGNED_REUSE=0: any common prefix is reused again (the faster, unstable reuse)."""
    from gguf import GGMLQuantizationType as QT

    monkeypatch.setenv("TALLOW_NUMERICS", "default")  # the torch paths' 64-row chunks (llama.cpp's numerics: 8)
    gf = GGUFFile(write_tiny_model("llama", tmp_path / "llama.gguf", qtype=QT.Q4_0))
    engine = Engine(build_model(gf, spec_from_gguf(gf), device=DEVICE), n_ctx=256, prefill_chunk=128)
    prompt = list(range(40, 140))
    answer(engine, prompt[:-3], 2)
    assert answer(engine, prompt, 2)[2].reused_tokens == (36 if DEVICE == "cpu" else 0)
    monkeypatch.setenv("TALLOW_ALIGNED_REUSE", "0")
    engine.reset()
    answer(engine, prompt[:-3], 2)
    assert answer(engine, prompt, 2)[2].reused_tokens == 97


# -- the three real models (CPU here; the GPU where one is present) ------------------------
@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct"])
def llm(request):
    import tallow

    return tallow.LLM(require_model(request.param), ctx=1024, device=DEVICE)


def test_real_models_answer_the_same_whatever_the_cache(llm, tmp_path, monkeypatch):
    engine = llm.engine
    small = "qwen" not in llm.path  # qwen2.5-1.5b is slow on these CPUs: one system-prompt question, fewer tokens
    if llm.template.source:  # chat models: the repro ("Say hello in French.") and its siblings
        prompts = [llm.chat_prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
                   for q in (QUESTIONS if small else QUESTIONS[:1])]
        prompts.append(llm.chat_prompt([{"role": "user", "content": QUESTIONS[0]}]))  # short: nothing reusable
    else:  # gemma3-270m is a base model: raw text, and one prompt past its 512-token sliding window
        prompts = [llm.tokenize(TEXT * k) for k in (3, 12)]
    n = 10 if small else 5
    assert check_cache_states(engine, prompts, n, monkeypatch, tmp_path, spec_off=small) > 0
    if llm.template.source:  # the next turn of a conversation, after the turn before and its answer
        turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[1]}]
        turn.append({"role": "assistant", "content": llm.chat(turn, max_tokens=n).text})
        turn.append({"role": "user", "content": "And on Sunday?"})
        warm = answer(engine, llm.chat_prompt(turn), n)
        engine.reset()
        same(warm, answer(engine, llm.chat_prompt(turn), n), "the next turn")


def test_importing_tallow_keeps_bf16_gemms_row_invariant():
    """oneDNN's AMX bf16 GEMMs round a row differently for different row counts (measured on a
    Sapphire Rapids CPU: up to 0.25 apart on one output); importing tallow caps oneDNN below AMX
    unless TALLOW_CPU_AMX=1, so a row computed alone equals the same row of a 64-row product."""
    import os
    import subprocess
    import sys

    code = ("import os, tallow, torch\n"
            "torch.manual_seed(0)\n"
            "w = torch.randn(1536, 576).bfloat16(); x = torch.randn(64, 576).bfloat16()\n"
            "one = torch.cat([x[i:i + 1] @ w.T for i in range(64)])\n"
            "print(os.environ.get('ONEDNN_MAX_CPU_ISA'), torch.equal(x @ w.T, one))")
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "TALLOW_CPU_AMX")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["AVX512_CORE_BF16", "True"]
    out = subprocess.run([sys.executable, "-c", code], env={**env, "TALLOW_CPU_AMX": "1"}, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "None"  # left to oneDNN (row-invariant or not, depending on the CPU)


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU's prefill attention")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_prefill_attention_in_query_tiles_is_the_same_bits(tmp_path, monkeypatch, arch):
    """A long context's prefill attention runs its queries in tiles (budget.attention_query_rows) so the
    mask stays small: the logits and the K/V written are those of one call per chunk, bit for bit
    (gemma3: sliding-window layers too)."""
    from gguf import GGMLQuantizationType as QT

    from tallow.memory import budget

    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf", qtype=QT.Q4_0))
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec, device="cpu")
    prompt = torch.randint(0, 256, (1100,), generator=torch.Generator().manual_seed(5)).tolist()

    def prefill(tile_bytes: int):
        monkeypatch.setattr(budget, "MASK_TILE_BYTES", tile_bytes)
        engine = Engine(model, n_ctx=1152, prefill_chunk=512)
        logits = answer(engine, prompt, 1)[0]
        return logits, [t[:, :1100].clone() for t in engine.kv.k + engine.kv.v]

    assert budget.attention_query_rows(1152) >= 512 and budget.MASK_TILE_BYTES // (5 * 1152) >= 512
    one_call = prefill(budget.MASK_TILE_BYTES)
    tiled = prefill(1)  # one 64-row query block a call
    assert budget.attention_query_rows(1152) == 64
    assert torch.equal(one_call[0], tiled[0])
    assert all(torch.equal(a, b) for a, b in zip(one_call[1], tiled[1]))
