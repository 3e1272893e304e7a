"""The decode step with the GPU's Triton block ops (kernels/block_ops.py: RMSNorm + residual,
GLU; step.py: Q/K norm + RoPE + K/V write in one launch), run by Triton's interpreter on CPU
tensors, against the eager torch forward pass — every architecture, past gemma3's window.

Tolerance: the fused kernels do the same fp32 operations in a different order (a sum of
squares in blocks, a sigmoid-form SiLU, GeGLU's exp-based tanh that may land one fp16 ulp
away), so logits drift by float noise: 1e-3 of the logit scale over 24 steps. A wrong head,
position, norm weight or cache row moves them by O(1).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import tallow.kernels.triton  # noqa: E402,F401
from tiny_models import ARCHITECTURES, tiny_prompt, write_tiny_model  # noqa: E402

from tallow.gguf_file import GGUFFile  # noqa: E402
from tallow.kernels.block_ops import TritonOps, block_ops  # noqa: E402
from tallow.memory.kv_pool import KVPool  # noqa: E402
from tallow.models import build_model  # noqa: E402
from tallow.models.step import PREFILL, Step  # noqa: E402
from test_graph_step import decode_step  # noqa: E402
from tallow.spec import spec_from_gguf  # noqa: E402

# The interpreter is slow (the two tiny gemma4 variants took 6.5 minutes here): the 31B-style one,
# whose Triton path is the E2B style's without its extras, is left to the torch-path tests.
FUSED_ARCHITECTURES = tuple(a for a in ARCHITECTURES if a != "gemma4-31b")


def _decode_steps(gf, spec, ids):
    """A fresh model's decode steps over ids (logits stacked) and the model."""
    model = build_model(gf, spec)
    for table in model.rope.values():
        table.ensure(64)
    kv = KVPool(spec, 64)
    return torch.cat([model.run(decode_step(t, i), kv) for i, t in enumerate(ids)]), model

def fused_steps_and_eager(arch: str, tmp_path, n_tokens: int, **pool) -> tuple:
    """(fused decode steps' logits, eager torch forward's logits, their two KV pools) over the
    same tokens, the steps with the GPU's Triton ops."""
    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf"))
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    ids = tiny_prompt(n_tokens)
    eager_kv, step_kv = KVPool(spec, 64, **pool), KVPool(spec, 64, **pool)
    eager = torch.cat([model.forward([t], i, eager_kv) for i, t in enumerate(ids)])
    model.ops = TritonOps()  # what a GPU placement picks
    for table in model.rope.values():
        table.ensure(64)
    steps = torch.cat([
        model.run(decode_step(t, i), step_kv)
        for i, t in enumerate(ids)
    ])
    return steps, eager, step_kv, eager_kv


@pytest.mark.parametrize("arch", FUSED_ARCHITECTURES)
def test_fused_step_matches_eager_forward(arch, tmp_path):
    steps, eager, step_kv, eager_kv = fused_steps_and_eager(arch, tmp_path, 20)
    scale = eager.abs().max()
    # gemma4's per-layer GELU gates run the Triton GeGLU here (one fp16 ulp from ggml's table at
    # a rounding boundary): measured 1.33e-3, against 0.8e-3 with the table.
    assert float((steps - eager).abs().max() / scale) < (2e-3 if arch == "gemma4" else 1e-3)
    assert torch.equal(steps.argmax(-1), eager.argmax(-1))
    for a, b in zip(step_kv.k + step_kv.v, eager_kv.k + eager_kv.v):  # every cache row written where it belongs
        assert float((a.float() - b.float()).abs().max()) < 2e-3 * max(1.0, float(b.float().abs().max()))


def test_triton_ops_switch(monkeypatch):
    monkeypatch.setenv("TALLOW_TRITON_OPS", "0")
    assert not block_ops(on_gpu=True).fused_step
    monkeypatch.setenv("TALLOW_TRITON_OPS", "1")
    assert block_ops(on_gpu=True).fused_step and not block_ops(on_gpu=False).fused_step


@pytest.mark.parametrize("arch", FUSED_ARCHITECTURES)
def test_triton_prefill_matches_torch_prefill(arch, tmp_path):
    """A whole prefill (two chunks, the second after a reused prefix) with the GPU's Triton ops —
    flash attention over the pool included — against the torch path."""
    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf"))
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    ids = tiny_prompt(40)
    kv_a, kv_b = KVPool(spec, 64, max_chunk=16), KVPool(spec, 64, max_chunk=16)  # gemma3: rings of 8 + 15 slots
    want = torch.cat([model.forward(ids[:25], 0, kv_a, all_logits=True), model.forward(ids[25:], 25, kv_a, all_logits=True)])
    model.ops = TritonOps()
    got = torch.cat([model.forward(ids[:25], 0, kv_b, all_logits=True), model.forward(ids[25:], 25, kv_b, all_logits=True)])
    # The tiny E2B-style gemma4 (per-layer embeddings' GELU gates, a double-wide MLP: more fp16
    # GELU roundings) measured 2.03e-3 here; its own torch prefill in chunks of 5 against one
    # batch differs by 1.05e-2 absolute (tests/test_conformance.py).
    assert float((got - want).abs().max() / want.abs().max()) < (4e-3 if arch == "gemma4" else 2e-3)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_fused_step_on_rings_matches_eager(tmp_path):
    """gemma3's sliding-window layers as rings (8 + 7 slots here): the fused step writes K/V at
    position % ring, and decoding past the ring's wrap (24 tokens: 9 past it) matches the eager
    torch forward."""
    steps, eager, step_kv, _ = fused_steps_and_eager("gemma3", tmp_path, 24, max_chunk=8)
    assert step_kv.has_rings
    assert float((steps - eager).abs().max() / eager.abs().max()) < 1e-3


@pytest.mark.parametrize("arch", FUSED_ARCHITECTURES)
@pytest.mark.parametrize("triton_ops", [False, True])
def test_forward_chunk_with_padding_matches_forward(arch, triton_ops, tmp_path):
    """The graph-safe prefill chunk (positions and start on the device, padded to a bucket,
    logits of row `last`) gives the eager forward's logits, and the padding's K/V writes do not
    disturb what comes next."""
    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf"))
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    if triton_ops:
        model.ops = TritonOps()
    ids = tiny_prompt(30)
    kv_a, kv_b = KVPool(spec, 64, max_chunk=16), KVPool(spec, 64, max_chunk=16)
    want = [model.forward(ids[:13], 0, kv_a), model.forward(ids[13:24], 13, kv_a), model.forward(ids[24:], 24, kv_a)]
    got = []
    for start, end in ((0, 13), (13, 24), (24, 30)):
        bucket = 16
        padded = ids[start:end] + [0] * (bucket - (end - start))
        got.append(model.run(Step(PREFILL, torch.tensor(padded), torch.arange(start, start + bucket), torch.tensor([start]),
                                  logits=torch.tensor([end - start - 1])), kv_b))
        kv_b.tokens.extend(ids[start:end])
        kv_b.mark_written(start + bucket - 1)
    # Padded shapes reorder sums. The E2B-style tiny gemma4 measured 3.5e-4 on the torch path: its
    # fp16 GELU roundings amplify reordering (with every GELU in fp32 its chunked-vs-batch
    # prefill spread falls from 1.05e-2 to 5e-5; docs/performance.md).
    torch_bound = 1e-3 if arch == "gemma4" else 1e-4
    for g_, w_ in zip(got, want):
        assert float((g_ - w_).abs().max() / w_.abs().max()) < (2e-3 if triton_ops else torch_bound)


@pytest.mark.parametrize("arch", ["gemma3"])  # GeGLU, sandwich norms; slow in the interpreter, so one arch
def test_gemv_prologues_match_separate_kernels(arch, tmp_path, monkeypatch):
    """The whole GPU placement (GEMVs over byte planes, Triton ops) on CPU tensors: with the
    norms and GLUs folded into the GEMVs' x loads the decode step gives what the separate
    kernels give (TALLOW_GEMV_PROLOGUE=0)."""
    from tallow.kernels.dispatch import Placement

    monkeypatch.setattr(Placement, "on_gpu", property(lambda self: True))
    from gguf import GGMLQuantizationType as QT

    # Two blocks, two steps (the second reads a cached key): the folding is per GEMV, so more blocks
    # or steps repeat the same check at ~2 s each in the interpreter.
    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf", qtype=QT.Q8_0, n_layers=2))
    spec = spec_from_gguf(gf)
    ids = tiny_prompt(2)

    folded, model = _decode_steps(gf, spec, ids)
    assert model.ops.lazy
    monkeypatch.setenv("TALLOW_GEMV_PROLOGUE", "0")
    separate, model = _decode_steps(gf, spec, ids)
    assert not model.ops.lazy
    assert float((folded - separate).abs().max() / separate.abs().max()) < 1e-4


# Rows against steps depends on the attention layout, not the block: global-only (llama), Q/K norms
# folded into the launch (qwen3), and rings read by shared-KV layers (gemma4); gemma3's rings are
# gemma4's kind, and each costs ~25 s in the interpreter.
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma4"])
def test_fused_rows_equal_fused_steps(arch, tmp_path):
    """Speculative verification with the GPU's ops: m rows in one pass, the fused Q/K norm + RoPE
    + K/V write launched per row, are bit for bit m fused decode steps."""
    from test_graph_step import check_rows_equal_steps

    check_rows_equal_steps(arch, tmp_path, TritonOps())


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_kernel_attention_with_shared_scratch(arch, tmp_path, monkeypatch):
    """The GPU's decode attention (the Triton split-K kernel, its scratch shared by every layer of
    one shape; gemma3's ring layers have another shape) inside decode steps and verification
    passes: steps match the eager torch forward, rows equal steps bit for bit."""
    import tallow.models.step as step_module
    from test_graph_step import check_rows_equal_steps

    monkeypatch.setattr(step_module, "_kernel_attention", lambda q: True)
    steps, eager, _, _ = fused_steps_and_eager(arch, tmp_path, 12, max_chunk=8)
    assert float((steps - eager).abs().max() / eager.abs().max()) < 2e-3
    assert torch.equal(steps.argmax(-1), eager.argmax(-1))
    check_rows_equal_steps(arch, tmp_path, TritonOps())


def test_integer_dot_decode_with_folded_q8(tmp_path, monkeypatch):
    """The whole GPU placement on CPU tensors with every product on the integer-dot GEMV
    (TALLOW_MMVQ_NARROW, its size floor lifted): x quantized once per input with the norm or GLU
    folded into the quantization gives what the separate norm/GLU kernels and a quantization per
    product give (TALLOW_Q8_PROLOGUE=0; the folded norm's 1/RMS sums in another order, so a code
    can move by one at a tie: 1e-3), and verification rows stay bit for bit decode steps."""
    from gguf import GGMLQuantizationType as QT
    from test_graph_step import check_rows_equal_steps

    import tallow.kernels.gpu.linear as lin
    from tallow.kernels.dispatch import Placement

    monkeypatch.setattr(Placement, "on_gpu", property(lambda self: True))
    monkeypatch.setattr(lin, "NARROW_MIN_WEIGHTS", 0)
    gf = GGUFFile(write_tiny_model("llama", tmp_path / "llama.gguf", qtype=QT.Q8_0, n_layers=2))
    spec = spec_from_gguf(gf)
    ids = tiny_prompt(2)

    folded, model = _decode_steps(gf, spec, ids)
    layers = lin_layers(model)
    assert len(layers) >= 8 and all(p.kind.startswith("mmvq_") for p in layers)
    monkeypatch.setenv("TALLOW_Q8_PROLOGUE", "0")
    separate, _ = _decode_steps(gf, spec, ids)
    assert float((folded - separate).abs().max() / separate.abs().max()) < 1e-3
    monkeypatch.delenv("TALLOW_Q8_PROLOGUE")
    check_rows_equal_steps("llama", tmp_path, None, passes=(1, 3))  # a decode step and a verification pass: the interpreter is slow


def test_norm_add_writing_q8_is_bit_identical(tmp_path, monkeypatch):
    """TALLOW_NORM_ADD_Q8 (gpu/linear.norm_add_norm_q8) on the tiny E2B-style gemma4 with the whole GPU placement on CPU tensors
    and every product on the integer-dot GEMV: the norms after the attention and per-layer joins
    writing their output's Q8_1 blocks give the decode steps' logits bit for bit what the norm then
    the quantization in launches of their own give (the switch off), and they did run."""
    from gguf import GGMLQuantizationType as QT

    import tallow.kernels.gpu.linear as lin
    import tallow.kernels.triton.mmvq as mmvq_module
    from tallow.kernels.dispatch import Placement

    monkeypatch.setattr(Placement, "on_gpu", property(lambda self: True))
    monkeypatch.setattr(lin, "NARROW_MIN_WEIGHTS", 0)
    calls = []
    fused = mmvq_module.rmsnorm_add_q8
    monkeypatch.setattr(mmvq_module, "rmsnorm_add_q8", lambda *a, **k: calls.append(1) or fused(*a, **k))
    gf = GGUFFile(write_tiny_model("gemma4", tmp_path / "gemma4.gguf", qtype=QT.Q8_0))
    spec = spec_from_gguf(gf)
    ids = tiny_prompt(1)  # one step: the norms' inputs do not depend on the history (the interpreter is slow)

    monkeypatch.setenv("TALLOW_NORM_ADD_Q8", "1")
    on, model = _decode_steps(gf, spec, ids)
    assert len(calls) == 2 * spec.n_layers - 1  # two a block, but the last block's second
    monkeypatch.setenv("TALLOW_NORM_ADD_Q8", "0")
    calls.clear()
    off, _ = _decode_steps(gf, spec, ids)
    assert not calls and torch.equal(on, off)
    # Verification rows stay decode steps: the fused kernel's rows each equal its one-row call
    # (tests/test_triton_mmvq.py), and the rows of the path it replaces equal steps (check_rows_equal_steps).


def lin_layers(model):
    """The model's GPU linears (walking its attributes and lists)."""
    from tallow.kernels.gpu.linear import GPULinear

    seen, out, todo = set(), [], [model]
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (torch.Tensor, str, int, float)):
            continue
        seen.add(id(o))
        if isinstance(o, GPULinear):
            out.append(o)
        elif isinstance(o, (list, tuple)):
            todo.extend(o)
        elif isinstance(o, dict):
            todo.extend(o.values())
        elif hasattr(o, "__dict__"):
            todo.extend(vars(o).values())
    return out
