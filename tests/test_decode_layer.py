"""The whole llama/qwen2/qwen3/gemma3/Gemma 4 decode step in one C call (kernels/cpu/decode_layer.c, TALLOW_CPU_C_LAYER).

In torch's arithmetic (TALLOW_CPU_GGML_STEP=0, which the tests below set unless they say otherwise) its logits are the
composed default path's bit for bit (the reference: the same C products, norms and attention reached from Python,
with torch's RoPE, f16 cast and SiLU between them), and it steps aside where it does not compute what the composed
blocks compute. In ggml's (the default for the llama block and gemma3's) a decode step is the composed
TALLOW_NUMERICS=ggml path's decode step bit for bit, whose ops are llama.cpp b11434's (tests/test_ggml_numerics.py;
tests/test_conformance.py compares the real models' decode steps with llama.cpp's), and a verification's rows are
its decode steps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from tallow import switches
from tallow.kernels.cpu import decode_layer

needs_c = pytest.mark.skipif(not decode_layer.usable(), reason=f"C decode step: {decode_layer.unavailable_reason()}")


@pytest.fixture(autouse=True)
def torch_arithmetic(monkeypatch):
    """The C step in torch's arithmetic, the composed default path's bits, unless a test says otherwise."""
    monkeypatch.setenv("TALLOW_CPU_GGML_STEP", "0")
    switches.refresh()


@needs_c
@pytest.mark.parametrize("n", [1, 16, 31, 32, 33, 47, 1536, 8960, 8963])
def test_swiglu_is_torchs(n):
    """SiLU as torch's AVX-512 loop computes it (Sleef's expf on whole blocks of 32, libm's expf on the rest),
    times up: the bits of F.silu(g) * u, over small, large and overflowing values."""
    gen = torch.Generator().manual_seed(n)
    for scale in (0.5, 4.0, 30.0, 120.0):
        g = torch.randn(n, generator=gen) * scale
        u = torch.randn(n, generator=gen)
        assert torch.equal(decode_layer.swiglu(g, u).view(torch.int32), (F.silu(g) * u).view(torch.int32))


@needs_c
@pytest.mark.parametrize("ffn", [1536, 8960, 4864, 2048])
def test_swiglu_rows_are_torchs(ffn):
    """A verification's rows: F.silu over (m, ffn) views of gate/up side by side, at 2 threads, gives every
    value the C SwiGLU's row-by-row bits wherever `silu_rows_match` says so (smollm2: 1536, qwen2.5: 8960)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(ffn)
        for m in range(1, 9):
            gu = torch.randn(m, 2 * ffn, generator=gen) * 6
            ref = F.silu(gu[:, :ffn]) * gu[:, ffn:]
            rows = torch.stack([decode_layer.swiglu(r[:ffn].contiguous(), r[ffn:].contiguous()) for r in gu])
            if decode_layer.silu_rows_match(m, ffn, 2):
                assert torch.equal(rows.view(torch.int32), ref.view(torch.int32)), m
    finally:
        torch.set_num_threads(threads)
    assert decode_layer.silu_rows_match(8, 8960, 2) and decode_layer.silu_rows_match(8, 1536, 2)


def _model(path, kv_dtype="f16"):
    from tallow.gguf_file import GGUFFile
    from tallow.memory.kv_pool import KVPool
    from tallow.models import build_model
    from tallow.spec import spec_from_gguf

    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    return build_model(gf, spec), KVPool(spec, 64, kv_dtype)


def _logits(model, kv, ids, monkeypatch, on: bool, counter: list):
    """A 6-token prompt, then the rest one decode step at a time; every step's logits."""
    monkeypatch.setenv("TALLOW_CPU_C_LAYER", "1" if on else "0")
    switches.refresh()
    counter.clear()
    kv.truncate(0)
    out = [model.forward(ids[:6], 0, kv, all_logits=True)]
    out += [model.forward([t], 6 + i, kv) for i, t in enumerate(ids[6:])]
    return out


def _count_runs(monkeypatch) -> list:
    calls: list = []
    real = decode_layer.DecodeLayers.run
    monkeypatch.setattr(decode_layer.DecodeLayers, "run", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


IDS = [3, 70, 101, 256, 257, 9, 44, 200, 17, 5, 88, 120, 64, 33, 2, 190]


@needs_c
@pytest.mark.parametrize("arch,qtype,chunk", [("llama", QT.Q8_0, 0), ("llama", QT.Q4_1, 0), ("qwen2", QT.Q8_0, 0),
                                              ("qwen2", QT.Q5_0, 0), ("qwen3", QT.Q8_0, 0), ("gemma3", QT.Q8_0, 0),
                                              ("gemma3", QT.Q8_0, 4), ("gemma4", QT.Q8_0, 0), ("gemma4", QT.Q5_0, 4),
                                              ("gemma4-31b", QT.Q8_0, 0), ("gemma4-31b", QT.Q8_0, 4)])
def test_tiny_models_bit_identical(arch, qtype, chunk, tmp_path, monkeypatch):
    """Tiny random llama (norm RoPE), qwen2 (neox RoPE, Q/K/V biases), qwen3 (per-head Q/K norms), gemma3
    (sandwich norms, GeGLU, scaled embeddings, two RoPE bases, sliding windows of 8 keys: the steps run past
    them) and Gemma 4 models (E2B-style: per-layer inputs and their gate, shared-KV layers, two head sizes,
    proportional RoPE, output scales; 31B-style: V is K on the global layers) models: 10 decode steps in one C
    call each give the composed path's logits bit for bit, and the K/V they write are the same bits. chunk 4:
    a pool with rings (the sliding layers hold 8 + 4 - 1 slots and wrap)."""
    monkeypatch.setenv("TALLOW_NUMERICS", "default")  # the torch paths: this test's subject
    from tallow.memory.kv_pool import KVPool
    from tiny_models import write_tiny_model

    model, kv = _model(write_tiny_model(arch, tmp_path / "m.gguf", qtype=qtype))
    if chunk:
        kv = KVPool(model.spec, 64, max_chunk=chunk)
        assert kv.has_rings
    assert model.c_decode is not None
    calls = _count_runs(monkeypatch)
    fast = _logits(model, kv, IDS, monkeypatch, True, calls)
    assert len(calls) == len(IDS) - 6
    k_fast = [k.clone() for k in kv.k]
    ref = _logits(model, kv, IDS, monkeypatch, False, calls)
    assert not calls
    for a, b in zip(fast, ref):
        assert torch.equal(a, b)
    for a, b in zip(k_fast, kv.k):
        assert torch.equal(a, b)


@needs_c
@pytest.mark.parametrize("arch,chunk", [("llama", 0), ("qwen2", 0), ("gemma3", 0), ("gemma3", 4), ("gemma4", 0),
                                        ("gemma4", 4), ("gemma4-31b", 4)])
def test_verification_rows_bit_identical(arch, chunk, tmp_path, monkeypatch):
    """A speculative verification (VERIFY, 2..8 rows) in one C call: the composed verification's logits and
    K/V bit for bit, and so each row the decode step's (chunk 4: with rings of 11 slots, the rows past the
    8-key window)."""
    from tallow.memory.kv_pool import KVPool
    from tallow.models.step import VERIFY
    from tiny_models import write_tiny_model

    model, kv = _model(write_tiny_model(arch, tmp_path / "m.gguf", qtype=QT.Q8_0))
    if chunk:
        kv = KVPool(model.spec, 64, max_chunk=chunk)
    calls = _count_runs(monkeypatch)
    out = {}
    for on in (True, False):
        monkeypatch.setenv("TALLOW_CPU_C_LAYER", "1" if on else "0")
        switches.refresh()
        calls.clear()
        kv.truncate(0)
        model.forward(IDS[:6], 0, kv)
        rows = [model.forward(IDS[6 : 6 + m], 6, kv, all_logits=True, phase=VERIFY) for m in (2, 5, 8)]
        out[on] = rows, [k[:, :14].clone() for k in kv.k] + [v[:, :14].clone() for v in kv.v], len(calls)
    passes = sum(-(-m // (chunk or m)) for m in (2, 5, 8))  # forward splits a ring pool's rows into chunks
    assert out[True][2] == passes and out[False][2] == 0
    for a, b in zip(out[True][0] + out[True][1], out[False][0] + out[False][1]):
        assert torch.equal(a, b)


@needs_c
def test_steps_aside(tmp_path, monkeypatch):
    """The composed blocks run where the C step does not compute what they compute: an int8 pool,
    the torch RMSNorm (TALLOW_CPU_C_NORM=0), Gemma 4 with routed experts. (A pool with rings decodes in C since
    session 13: test_tiny_models_bit_identical; TALLOW_NUMERICS=ggml since session 17:
    test_ggml_numerics_decodes_in_the_c_step.)"""
    from tiny_models import write_tiny_model

    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q8_0)
    model, kv8 = _model(path, "int8")
    calls = _count_runs(monkeypatch)
    _logits(model, kv8, IDS[:8], monkeypatch, True, calls)
    assert not calls
    _, kv = _model(path)
    monkeypatch.setenv("TALLOW_CPU_C_NORM", "0")
    _logits(model, kv, IDS[:8], monkeypatch, True, calls)
    assert not calls
    monkeypatch.delenv("TALLOW_CPU_C_NORM")
    _logits(model, kv, IDS[:8], monkeypatch, True, calls)
    assert len(calls) == 2
    assert _model(write_tiny_model("gemma4-moe", tmp_path / "g4moe.gguf", qtype=QT.Q8_0))[0].c_decode is None


# (file, prompt tokens, context, decode steps): qwen2.5 takes 8 steps, not 24 (each is ~10x smollm2's; the suite's time)
REAL = [pytest.param("smollm2-135m", 20, 128, 24, id="smollm2"),
        pytest.param("gemma3-270m", 600, 700, 24, id="gemma3"),  # past its 512-key window, no ring at ctx 700
        pytest.param("gemma3-270m", 1100, 2048, 24, id="gemma3-ring"),  # rings of 1023 slots, wrapped
        pytest.param("qwen2.5-coder-1.5b-instruct", 20, 128, 8, id="qwen2.5", marks=pytest.mark.slow),
        # scripts/make_gemma4_twin.py e2b /tmp/twins/gemma4-e2b.gguf (or TALLOW_E2B_TWIN): rings past the window
        pytest.param(os.environ.get("TALLOW_E2B_TWIN", "/tmp/twins/gemma4-e2b.gguf"), 600, 2048, 24, id="gemma4-e2b-twin",
                     marks=pytest.mark.slow)]


@needs_c
@pytest.mark.parametrize("name,prompt,ctx,steps", REAL)
def test_real_models_bit_identical(name, prompt, ctx, steps, monkeypatch):
    """The real files (smollm2: Q8_0/Q4_1 products, ffn 1536; gemma3: Q/K norms, GeGLU, two RoPE bases, the
    sliding window, rings; qwen2.5: Q4_K/Q6_K, biases, ffn 8960; the Gemma 4 E2B twin: per-layer inputs,
    shared-KV layers, head sizes 256/512, rings): a prompt and `steps` greedy decode steps, then a verification of
    6 rows through engine.decode_rows, every logit and the K/V left in the pool the composed path's, every step
    in C."""
    monkeypatch.setenv("TALLOW_NUMERICS", "default")  # the torch paths: this test's subject
    path = Path(name if "/" in name else os.path.expanduser(f"~/.cache/tallow/models/{name}.gguf"))
    if not path.exists():
        pytest.skip(f"{name} is not downloaded")
    import tallow

    engine = tallow.LLM(str(path), ctx=ctx, device="cpu").engine
    assert engine.model.c_decode is not None
    calls = _count_runs(monkeypatch)
    ids = [100 + (7 * i) % 900 for i in range(prompt)]

    def run(on: bool):
        monkeypatch.setenv("TALLOW_CPU_C_LAYER", "1" if on else "0")
        switches.refresh()
        calls.clear()
        engine.reset()
        out = [engine.prefill_chunk_at(ids, 0)]
        token = 5
        for _ in range(steps):
            out.append(engine.decode_step(token).clone())
            token = int(out[-1].argmax())
        out.append(engine.decode_rows([5, 900, 17, 33, 2000, 7]))
        kv = engine.kv
        return out + [kv.k[i].clone() for i in kv.owners] + [kv.v[i].clone() for i in kv.owners], len(calls)

    (fast, n_fast), (ref, n_ref) = run(True), run(False)
    assert n_fast == steps + 1 and n_ref == 0
    for a, b in zip(fast, ref):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ the C step in ggml's arithmetic (TALLOW_CPU_GGML_STEP)

def _numerics(monkeypatch, ggml: bool) -> None:
    """TALLOW_NUMERICS=ggml or =default (the torch paths; unset, these tiny files would choose llama.cpp's numerics):
    read at load (linears, RoPE tables, the C step) and, outside a model's own passes, per call (the ops)."""
    monkeypatch.setenv("TALLOW_NUMERICS", "ggml" if ggml else "default")
    switches.refresh()


def _ggml_model(path, monkeypatch):
    """The same file loaded under TALLOW_NUMERICS=ggml, its C step taken away: the composed blocks with ggml's ops."""
    _numerics(monkeypatch, True)
    model = _model(path)[0]
    assert model.c_decode is not None and model.c_decode.numerics_ggml
    model.c_decode = None
    _numerics(monkeypatch, False)
    return model


@needs_c
@pytest.mark.parametrize("arch,qtype,chunk", [("llama", QT.Q8_0, 0), ("llama", QT.Q4_1, 0), ("qwen2", QT.Q8_0, 0),
                                              ("qwen2", QT.Q5_0, 0), ("qwen3", QT.Q8_0, 0), ("gemma3", QT.Q8_0, 0),
                                              ("gemma3", QT.Q8_0, 4)])
def test_ggml_step_is_ggml_numerics(arch, qtype, chunk, tmp_path, monkeypatch):
    """After the same prompt (written by the TALLOW_NUMERICS=ggml model), 10 decode steps of the C step in ggml's
    arithmetic give the composed TALLOW_NUMERICS=ggml path's logits and K/V bit for bit: tiny llama (norm RoPE),
    qwen2 (neox RoPE, biases), qwen3 (Q/K norms), gemma3 (GeGLU by ggml's table, Q scaled before the scores, two
    RoPE bases, windows of 8 keys passed; chunk 4: rings that wrap). With TALLOW_CPU_GGML_STEP=0 they differ."""
    from tallow.memory.kv_pool import KVPool
    from tiny_models import write_tiny_model

    path = write_tiny_model(arch, tmp_path / "m.gguf", qtype=qtype)
    _numerics(monkeypatch, False)
    model, reference = _model(path)[0], _ggml_model(path, monkeypatch)
    assert model.c_decode is not None and model.c_decode.ggml_capable
    kv = KVPool(model.spec, 64, max_chunk=chunk) if chunk else KVPool(model.spec, 64, "f16")
    calls = _count_runs(monkeypatch)

    def steps(stepper, ggml_step: bool):
        monkeypatch.setenv("TALLOW_CPU_GGML_STEP", "1" if ggml_step else "0")
        switches.refresh()
        kv.truncate(0)
        _numerics(monkeypatch, True)
        reference.forward(IDS[:6], 0, kv)
        _numerics(monkeypatch, stepper is reference)
        out = [stepper.forward([t], 6 + i, kv) for i, t in enumerate(IDS[6:])]
        _numerics(monkeypatch, False)
        return out, [k.clone() for k in kv.k]

    ref, k_ref = steps(reference, True)
    assert not calls
    fast, k_fast = steps(model, True)
    assert len(calls) == len(IDS) - 6
    for a, b in zip(fast + k_fast, ref + k_ref):
        assert torch.equal(a, b)
    torch_step, _ = steps(model, False)
    assert any(not torch.equal(a, b) for a, b in zip(torch_step, ref))


@needs_c
@pytest.mark.parametrize("arch,chunk", [("qwen2", 0), ("gemma3", 4)])
def test_ggml_numerics_decodes_in_the_c_step(arch, chunk, tmp_path, monkeypatch):
    """Under TALLOW_NUMERICS=ggml the C step is taken, in ggml's arithmetic whatever TALLOW_CPU_GGML_STEP says,
    and its decode steps are the composed blocks' bit for bit (logits and K/V); Falcon-H1's C step, which has
    no ggml arithmetic, is declined there."""
    from tallow.memory.kv_pool import KVPool
    from tiny_models import write_tiny_model, write_tiny_ssm

    monkeypatch.setenv("TALLOW_CPU_GGML_STEP", "0")
    path = write_tiny_model(arch, tmp_path / "m.gguf", qtype=QT.Q8_0)
    composed = _ggml_model(path, monkeypatch)
    _numerics(monkeypatch, True)
    model = _model(path)[0]
    assert model.c_decode is not None and model.c_decode.ggml_on()
    calls = _count_runs(monkeypatch)
    outs = []
    for stepper in (model, composed):
        kv = KVPool(model.spec, 64, max_chunk=chunk) if chunk else KVPool(model.spec, 64, "f16")
        stepper.forward(IDS[:6], 0, kv)
        outs.append(([stepper.forward([t], 6 + i, kv) for i, t in enumerate(IDS[6:])], [k.clone() for k in kv.k]))
    assert len(calls) == len(IDS) - 6
    for a, b in zip(outs[0][0] + outs[0][1], outs[1][0] + outs[1][1]):
        assert torch.equal(a, b)
    hybrid = write_tiny_ssm("falcon-h1", tmp_path / "h.gguf", qtype=QT.Q8_0)
    assert _model(hybrid)[0].c_decode is None
    _numerics(monkeypatch, False)
    assert _model(hybrid)[0].c_decode is not None


@needs_c
@pytest.mark.parametrize("arch,chunk", [("llama", 0), ("qwen2", 0), ("gemma3", 0), ("gemma3", 4)])
def test_ggml_step_verification_rows_are_its_decode_steps(arch, chunk, tmp_path, monkeypatch):
    """In ggml's arithmetic a verification's rows (2, 5, 8 in one C call) are the decode steps of the same tokens
    bit for bit, logits and K/V (so speculation stays exact), whatever the thread count."""
    from tallow.memory.kv_pool import KVPool
    from tallow.models.step import VERIFY
    from tiny_models import write_tiny_model

    monkeypatch.setenv("TALLOW_CPU_GGML_STEP", "1")
    switches.refresh()
    model, kv = _model(write_tiny_model(arch, tmp_path / "m.gguf", qtype=QT.Q8_0))
    if chunk:
        kv = KVPool(model.spec, 64, max_chunk=chunk)
    calls = _count_runs(monkeypatch)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for m in (2, 5, 8):
                kv.truncate(0)
                model.forward(IDS[:6], 0, kv)
                rows = model.forward(IDS[6 : 6 + m], 6, kv, all_logits=True, phase=VERIFY)
                k_rows = [k.clone() for k in kv.k]
                kv.truncate(0)  # (a ring cannot go back to position 6 after 8 more: start again)
                model.forward(IDS[:6], 0, kv)
                steps = torch.cat([model.forward([t], 6 + i, kv) for i, t in enumerate(IDS[6 : 6 + m])])
                assert torch.equal(rows, steps), (n_threads, m)
                if not chunk:  # (a ring's slots past what both wrote hold older rows)
                    for a, b in zip(k_rows, kv.k):
                        assert torch.equal(a[:, : 6 + m], b[:, : 6 + m])
    finally:
        torch.set_num_threads(threads)
    assert calls


@needs_c
@pytest.mark.parametrize("name,prompt,ctx,_steps", REAL[:3])
def test_real_models_ggml_step_is_ggml_numerics(name, prompt, ctx, _steps, monkeypatch):
    """smollm2, gemma3 (past its window; with rings that wrap): after the same prompt, 16 decode steps of the
    C step in ggml's arithmetic give the composed TALLOW_NUMERICS=ggml path's logits bit for bit (a planted
    fault of one ulp anywhere shows on the real files, where the tiny models' Q8 rounding may absorb it)."""
    path = Path(os.path.expanduser(f"~/.cache/tallow/models/{name}.gguf"))
    if not path.exists():
        pytest.skip(f"{name} is not downloaded")
    import tallow

    monkeypatch.setenv("TALLOW_CPU_GGML_STEP", "1")
    _numerics(monkeypatch, True)
    reference = tallow.LLM(str(path), ctx=ctx, device="cpu").engine
    reference.model.c_decode = None  # the composed blocks
    _numerics(monkeypatch, False)
    engine = tallow.LLM(str(path), ctx=ctx, device="cpu").engine
    assert engine.model.c_decode is not None
    ids = [100 + (7 * i) % 900 for i in range(prompt)]
    reference.reset()
    engine.reset()
    _numerics(monkeypatch, True)
    reference.prefill_chunk_at(ids, 0)
    for a, b in zip(engine.kv.k + engine.kv.v, reference.kv.k + reference.kv.v):
        a.copy_(b)
    engine.kv.tokens[:] = reference.kv.tokens
    engine.kv.mark_written(len(ids) - 1)
    calls = _count_runs(monkeypatch)
    token = 5
    for step in range(16):
        _numerics(monkeypatch, True)
        theirs = reference.decode_step(token)
        _numerics(monkeypatch, False)
        ours = engine.decode_step(token)
        assert torch.equal(ours, theirs), step
        token = int(theirs.argmax())
    assert len(calls) == 16
