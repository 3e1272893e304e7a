"""The decode step bound to device positions (what a CUDA graph captures) computes exactly
what the eager forward pass computes, for every architecture, past gemma3's window edge."""

from __future__ import annotations

import pytest
import torch

from tiny_models import ARCHITECTURES, tiny_prompt, write_tiny_model

from tallow.gguf_file import GGUFFile
from tallow.memory.kv_pool import KVPool
from tallow.models import build_model
from tallow.spec import spec_from_gguf


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_forward_step_equals_forward(arch, tmp_path):
    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf"))
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    ids = tiny_prompt()
    eager_kv, step_kv = KVPool(spec, 64), KVPool(spec, 64)
    eager = torch.cat([model.forward([t], i, eager_kv) for i, t in enumerate(ids)])
    steps = torch.cat([
        model.forward_step(torch.tensor([t]), torch.tensor([i]), torch.tensor([i + 1], dtype=torch.int32), step_kv)
        for i, t in enumerate(ids)
    ])
    assert torch.equal(steps, eager)
    assert all(torch.equal(a, b) for a, b in zip(step_kv.k, eager_kv.k))
