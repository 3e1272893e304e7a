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


def test_the_split_prefill_attention_scratch_is_planned(monkeypatch):
    """The plan's figure for the split attention's partials is the largest a layer's call allocates
    (the kernels themselves stubbed: only the wrapper's allocations are counted), on a model with
    full layers (split at this depth) and 512-token sliding windows (never split); none with the
    switch off."""
    pytest.importorskip("triton")
    import torch

    from tallow.gguf_file import GGUFFile
    from tallow.kernels.triton import prefill_attention as pa
    from tallow.memory.budget import PREFILL_SPLIT_SPAN, gpu_split_attention_bytes, kv_layer_slots
    from tallow.spec import spec_from_gguf

    assert PREFILL_SPLIT_SPAN == pa.SPLIT_SPAN
    spec = spec_from_gguf(GGUFFile(require_model("gemma3-270m")))
    n_ctx, rows = 16384, 512
    assert any(layer.sliding_window for layer in spec.layers) and not all(layer.sliding_window for layer in spec.layers)

    class Launch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    monkeypatch.setattr(pa, "_prefill_kernel", Launch())
    monkeypatch.setattr(pa, "_merge_kernel", Launch())
    sizes = []
    real_empty = torch.empty

    def empty(shape, **kwargs):
        t = real_empty(shape, **kwargs)
        if len(shape) == 4:  # (ranges, rows, heads, width or 2): the partials
            sizes.append(t.numel() * t.element_size())
        return t

    monkeypatch.setattr(pa.torch, "empty", empty)
    most = 0
    for layer, slots in zip(spec.layers, kv_layer_slots(spec, n_ctx, rows)):
        q = torch.zeros(rows, layer.n_heads, layer.head_dim)
        kv = torch.zeros(layer.n_kv_heads, slots, layer.head_dim, dtype=torch.float16)
        sizes.clear()
        pa.prefill_attention(q, kv, kv, torch.zeros(1, dtype=torch.int64), 0, 1.0, layer.sliding_window or None)
        assert bool(sizes) == (not layer.sliding_window)
        most = max(most, sum(sizes))
    assert most > 0 and gpu_split_attention_bytes(spec, n_ctx, rows) == most
    monkeypatch.setenv("TALLOW_PREFILL_SPLIT", "0")
    assert gpu_split_attention_bytes(spec, n_ctx, rows) == 0
