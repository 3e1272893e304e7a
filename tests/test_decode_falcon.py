"""TALLOW_CPU_C_LAYER on Falcon-H1 (kernels/cpu/decode_layer.c with each layer's Mamba-2 mixer beside the
attention): a decode step in one C call against the composed blocks (=0), bit for bit: logits, the K/V
left in the pool, every layer's conv and SSM states."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from tallow import switches
from tallow.kernels.cpu import c_ssm, decode_layer, ggml_ops

needs_c = pytest.mark.skipif(not (decode_layer.usable() and c_ssm.mixer_usable()),
                             reason=f"C decode step: {decode_layer.unavailable_reason()}")


def _count_runs(monkeypatch) -> list:
    calls: list = []
    real = decode_layer.DecodeLayers.run
    monkeypatch.setattr(decode_layer.DecodeLayers, "run", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


def _engine(path, kv_dtype="f16", ctx=128):
    from tallow.engine.engine import Engine
    from tallow.gguf_file import GGUFFile
    from tallow.models import build_model
    from tallow.spec import spec_from_gguf

    gf = GGUFFile(path)
    return Engine(build_model(gf, spec_from_gguf(gf)), ctx, prefill_chunk=8, kv_dtype=kv_dtype)


def _run(engine, ids, steps, monkeypatch, on: bool, calls: list, rows: list | None = None):
    """A prompt and `steps` greedy decode steps (then a verification of `rows`): every logit, the pool's K/V
    and the recurrent states, and how many steps ran in C."""
    monkeypatch.setenv("TALLOW_CPU_C_LAYER", "1" if on else "0")
    switches.refresh()
    calls.clear()
    engine.reset()
    out = [engine.prefill_chunk_at(ids, 0).clone()]
    token = ids[-1]
    for _ in range(steps):
        out.append(engine.decode_step(token).clone())
        token = int(out[-1].argmax())
    if rows:
        out.append(engine.decode_rows(rows).clone())
    kv = engine.kv
    out += [kv.k[i].clone() for i in kv.owners] + [kv.v[i].clone() for i in kv.owners]
    out += [t.clone() for t in kv.state.tensors()]
    return out, len(calls)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x.view(torch.int8), y.view(torch.int8))
                                    for x, y in zip(a, b))


@needs_c
@pytest.mark.parametrize("simd", (True, False))
def test_tiny_falcon_h1_decode_in_c_is_the_composed_step_bit_for_bit(simd, tmp_path, monkeypatch):
    """A tiny Q8_0 falcon-h1 (2 hybrid layers): a 20-token prompt (past the conv kernel and the 8-row chunk), 12
    decode steps in C, then a 4-row verification (composed: each row keeps its state); all the composed bits,
    with the AVX-512 norms, conv and scan and with their portable C."""
    from tiny_models import tiny_prompt, write_tiny_ssm

    path = write_tiny_ssm("falcon-h1", tmp_path / "f.gguf", qtype=QT.Q8_0)
    engine = _engine(path)
    assert engine.model.c_decode is not None and engine.model.c_decode.mixers
    calls = _count_runs(monkeypatch)
    ids = tiny_prompt(20)
    ggml_ops.set_simd(simd)
    try:
        (fast, n_fast), (ref, n_ref) = (_run(engine, ids, 12, monkeypatch, on, calls, rows=[5, 9, 17, 33])
                                        for on in (True, False))
    finally:
        ggml_ops.set_simd(True)
    assert n_fast == 12 and n_ref == 0
    assert _same(fast, ref)


@needs_c
def test_falcon_h1_steps_aside(tmp_path, monkeypatch):
    """The composed blocks run where the C step cannot: an int8 pool, the composed mixer (TALLOW_CPU_C_MIXER=0),
    the torch RMSNorm; F32 products (not the C kernel) build no C step."""
    from tiny_models import tiny_prompt, write_tiny_ssm

    path = write_tiny_ssm("falcon-h1", tmp_path / "f.gguf", qtype=QT.Q8_0)
    calls = _count_runs(monkeypatch)
    ids = tiny_prompt(12)
    engine = _engine(path, kv_dtype="int8")
    assert _run(engine, ids, 2, monkeypatch, True, calls)[1] == 0
    engine = _engine(path)
    for name in ("TALLOW_CPU_C_MIXER", "TALLOW_CPU_C_NORM"):
        monkeypatch.setenv(name, "0")
        assert _run(engine, ids, 2, monkeypatch, True, calls)[1] == 0
        monkeypatch.delenv(name)
    assert _run(engine, ids, 2, monkeypatch, True, calls)[1] == 2
    assert _engine(write_tiny_ssm("falcon-h1", tmp_path / "f32.gguf")).model.c_decode is None


TWIN = os.environ.get("TALLOW_FALCON_H1_TWIN", "/tmp/twins/falcon-h1-0.5b.gguf")


@needs_c
@pytest.mark.slow
def test_falcon_h1_twin_bit_identical(monkeypatch):
    """The Falcon-H1-0.5B twin (its real shapes and quant types): a short prompt and 16 decode steps, every
    step in C, all the composed bits."""
    if not Path(TWIN).exists():
        pytest.skip(f"{TWIN} is not there (scripts/make_*_twin.py)")
    engine = _engine(TWIN, ctx=256)
    assert engine.model.c_decode is not None
    calls = _count_runs(monkeypatch)
    ids = [100 + (7 * i) % 900 for i in range(12)]
    (fast, n_fast), (ref, n_ref) = (_run(engine, ids, 16, monkeypatch, on, calls) for on in (True, False))
    assert n_fast == 16 and n_ref == 0
    assert _same(fast, ref)
