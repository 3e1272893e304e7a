"""The memory account on a GPU (memory/budget.py, device="cuda"): weights as the GPU layers hold
them, the GPU's free memory as the budget — checked on the CPU, with the GPU layers built on
CPU tensors and the driver's free-memory figure stubbed."""

from __future__ import annotations

import pytest

from model_paths import require_model

from tallow.errors import MemoryBudgetError
from tallow.memory import budget
from tallow.memory.budget import gpu_weights_bytes, plan_memory


def test_gpu_weights_match_the_gpu_layers(monkeypatch):
    """Byte planes, dense copies, fp32 norms, and the tied output's second copy of the embedding:
    the planned figure is what the GPU placement allocates, to the byte."""
    pytest.importorskip("triton")
    from tallow.gguf_file import GGUFFile
    from tallow.kernels.dispatch import Placement
    from tallow.models import build_model
    from tallow.spec import spec_from_gguf

    monkeypatch.setattr(Placement, "on_gpu", property(lambda self: True))
    gf = GGUFFile(require_model("smollm2-135m"))
    model = build_model(gf, spec_from_gguf(gf))
    assert gpu_weights_bytes(gf) == model.nbytes + model.embedding.nbytes


def test_gpu_plan_uses_the_gpus_free_memory(monkeypatch):
    path = require_model("qwen2.5-coder-1.5b-instruct")
    monkeypatch.setattr(budget, "gpu_free_bytes", lambda device: 8 << 30)
    plan = plan_memory(path, 4096, "50%", device="cuda")
    assert plan.budget == 4 << 30 and "free on the GPU" in plan.budget_text
    assert plan.fits and plan.prefix_cache == 0 and plan.runtime == budget.GPU_RUNTIME
    assert "in cuda memory" in plan.describe()
    monkeypatch.setattr(budget, "gpu_free_bytes", lambda device: 1 << 30)
    tight = plan_memory(path, 4096, "100%", device="cuda")
    with pytest.raises(MemoryBudgetError, match="free on the GPU"):
        tight.check()
