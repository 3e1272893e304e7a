"""The decode step bound to device positions (what a CUDA graph captures) computes exactly
what the eager forward pass computes, for every architecture, past gemma3's window edge."""

from __future__ import annotations

import pytest
import torch

from tiny_models import ARCHITECTURES, tiny_prompt, write_tiny_model

from tallow.gguf_file import GGUFFile
from tallow.memory.kv_pool import KVPool
from tallow.models import build_model
from tallow.models.step import ALL, DECODE, VERIFY, Step
from tallow.spec import spec_from_gguf


def decode_step(token: int, position: int) -> Step:
    """The graph-safe decode Step of one token: position and seq_len as device tensors."""
    p = torch.tensor([position])
    return Step(DECODE, torch.tensor([token]), p, p, torch.tensor([position + 1], dtype=torch.int32), logits=ALL)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_forward_step_equals_forward(arch, tmp_path):
    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf"))
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    ids = tiny_prompt()
    eager_kv, step_kv = KVPool(spec, 64), KVPool(spec, 64)
    eager = torch.cat([model.forward([t], i, eager_kv) for i, t in enumerate(ids)])
    steps = torch.cat([
        model.run(decode_step(t, i), step_kv)
        for i, t in enumerate(ids)
    ])
    assert torch.equal(steps, eager)
    assert all(torch.equal(a, b) for a, b in zip(step_kv.k, eager_kv.k))


def check_rows_equal_steps(arch: str, tmp_path, ops=None, passes=(1, 3, 5, 2, 7, 6)) -> None:
    """m consecutive tokens in one pass (speculative verification) give bit for bit the logits and
    the cache of m decode steps, with quantized (row-exact) matrices; gemma3 past its window (the
    default passes cover 24 tokens, which wrap its rings)."""
    from gguf import GGMLQuantizationType

    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf", qtype=GGMLQuantizationType.Q8_0))
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    if ops is not None:
        model.ops = ops
    for table in model.rope.values():
        table.ensure(64)
    ids = tiny_prompt(sum(passes))
    # max_chunk 8: gemma3's sliding-window layers are rings of window + 7 slots, which the
    # 24 tokens wrap (passes of at most 8 tokens, as speculation caps them)
    step_kv, rows_kv = KVPool(spec, 64, max_chunk=8), KVPool(spec, 64, max_chunk=8)

    def step(kv, t, i):
        return model.run(decode_step(t, i), kv)

    steps = torch.cat([step(step_kv, t, i) for i, t in enumerate(ids)])
    got, i = [], 0
    for m in passes:
        got.append(step(rows_kv, ids[i], i) if m == 1 else model.run(Step(
            VERIFY, torch.tensor(ids[i : i + m]), torch.arange(i, i + m), torch.tensor([i]),
            torch.arange(i + 1, i + m + 1, dtype=torch.int32), logits=ALL), rows_kv))
        i += m
    assert torch.equal(torch.cat(got), steps)
    assert all(torch.equal(a, b) for a, b in zip(rows_kv.k + rows_kv.v, step_kv.k + step_kv.v))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_forward_rows_equals_steps(arch, tmp_path):
    check_rows_equal_steps(arch, tmp_path)
