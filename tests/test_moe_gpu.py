"""Routed experts on the GPU path (kernels/gpu/moe.py), run by Triton's interpreter on CPU tensors,
against the CPU path: the tiny qwen3moe and Gemma 4 26B-A4B-style models (tests/tiny_models.py).

The GPU placement is forced on the CPU device (Placement.on_gpu patched), so the model builds
GPULinear / GPUExpertBank and runs the Triton ops exactly as it would on cuda, on CPU tensors.
Bounds: a decode step (one token, every product an fp32 GEMV of exactly dequantized weights) within
1e-4 of the CPU reference linears' logits relative to their scale, and every layer's chosen experts
identical; the Triton expert GEMV and TALLOW_MOE_TRITON=0's torch reference within 1e-5; the
grouped prefill (bf16 weights and activations into fp32) within 2e-2 of the pair path.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

pytest.importorskip("triton")

from tiny_models import write_tiny_model  # noqa: E402

import tallow.kernels.triton  # noqa: E402,F401  (the interpreter shim)
import tallow.kernels.cpu.moe as cpu_moe  # noqa: E402
from tallow.gguf_file import GGUFFile  # noqa: E402
from tallow.kernels import dispatch  # noqa: E402
from tallow.kernels.gpu.moe import GPUExpertBank  # noqa: E402
from tallow.memory.kv_pool import KVPool  # noqa: E402
from tallow.models import build_model  # noqa: E402
from tallow.spec import spec_from_gguf  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from tallow.kernels.triton.moe_mmvq import _e2m1_words  # noqa: E402


def _models(tmp_path, monkeypatch, arch, qtype):
    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}-{qtype.name}.gguf", qtype=qtype))
    spec = spec_from_gguf(gf)
    cpu = build_model(gf, spec, linear_mode="reference")
    monkeypatch.setattr(dispatch.Placement, "on_gpu", property(lambda self: True))
    gpu = build_model(gf, spec)
    monkeypatch.undo()
    return spec, cpu, gpu


def _record_routes(monkeypatch):
    calls = []
    real = cpu_moe.route_softmax

    def record(logits, k):
        weights, ids = real(logits, k)
        calls.append(ids.clone())
        return weights, ids

    monkeypatch.setattr(cpu_moe, "route_softmax", record)
    return calls


# (gemma4-moe's MXFP4 file has MXFP4 attention too, which the GPU runs as a dense bf16 copy with
# bf16 activations: not this test's bound; its experts' kernel is the bank test's and kernel_cases'.)
# (Interpreted Triton is slow: three tokens; Q8_0 experts are the bank test's, gemma4-moe's the GPU script's too.)
@pytest.mark.parametrize("arch, qtype", [("qwen3moe", QT.NVFP4),
                                         pytest.param("gemma4-moe", QT.Q4_0, marks=pytest.mark.slow)])  # ~25 s interpreted
def test_gpu_decode_matches_cpu_and_routes_the_same(tmp_path, monkeypatch, arch, qtype):
    spec, cpu, gpu = _models(tmp_path, monkeypatch, arch, qtype)
    monkeypatch.setenv("TALLOW_MOE_MMVQ", "0")  # the fp32 expert GEMV: test_gpu_bank_integer_dot_path has the other
    assert isinstance(gpu.layers[0].ffn_experts, GPUExpertBank)
    assert gpu.layers[0].ffn_experts.kind.startswith("routed+triton_")
    tokens = [5, 40, 99]
    out = {}
    for name, model in (("cpu", cpu), ("gpu", gpu)):
        calls = _record_routes(monkeypatch)
        kv = KVPool(spec, 32, torch.float32)
        logits = torch.cat([model.forward([t], i, kv, all_logits=True) for i, t in enumerate(tokens)])
        out[name] = (logits, [c.tolist() for c in calls])
        monkeypatch.undo()
        monkeypatch.setenv("TALLOW_MOE_MMVQ", "0")
    (ref, ref_routes), (got, got_routes) = out["cpu"], out["gpu"]
    assert got_routes == ref_routes and len(ref_routes) == len(tokens) * spec.n_layers
    assert float((got - ref).abs().max()) <= 1e-4 * float(ref.abs().max())
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("arch, qtype", [("qwen3moe", QT.Q8_0), ("gemma4-moe", QT.MXFP4), ("qwen3moe", QT.F32)])
def test_gpu_bank_paths_agree(tmp_path, monkeypatch, arch, qtype):
    """One layer's bank on the same rows: pair path (Triton) = torch reference; the grouped
    prefill close to the pair path; F32 experts (no kernel) through the dense reference."""
    spec, _, gpu = _models(tmp_path, monkeypatch, arch, qtype)
    bank = gpu.layers[1].ffn_experts
    g = torch.Generator().manual_seed(1)
    n, k = 10, spec.n_experts_used  # > 8: two pair-path chunks, and the grouped path
    h = torch.randn(n, spec.dim, generator=g)
    weights, ids = cpu_moe.route_softmax(torch.randn(n, spec.n_experts, generator=g), k)
    glu = (lambda gu: gpu.ops.glu(gu, "swiglu")) if arch == "qwen3moe" else (lambda gu: gpu.ops.glu(gu, "geglu"))
    monkeypatch.setenv("TALLOW_MOE_GROUPED", "0")
    monkeypatch.setenv("TALLOW_MOE_MMVQ", "0")  # the fp32 expert GEMV (the integer-dot one: the next test)
    pairs = bank(h, ids, weights, glu)
    one = bank(h[3:4], ids[3:4], weights[3:4], glu)  # a decode step's row: bit for bit its pair-path row
    assert torch.equal(one[0], pairs[3])
    monkeypatch.setenv("TALLOW_MOE_TRITON", "0")
    ref = bank(h, ids, weights, glu)
    assert float((pairs - ref).norm() / ref.norm()) < 1e-5
    monkeypatch.delenv("TALLOW_MOE_TRITON")
    monkeypatch.delenv("TALLOW_MOE_GROUPED")
    grouped = bank(h, ids, weights, glu)
    assert float((grouped - ref).norm() / ref.norm()) < 2e-2


@pytest.mark.parametrize("arch, qtype", [("qwen3moe", QT.Q8_0), ("qwen3moe", QT.NVFP4), ("gemma4-moe", QT.MXFP4)])
def test_gpu_plan_counts_the_expert_banks(tmp_path, monkeypatch, arch, qtype):
    """The GPU account (memory/budget.py) of a routed-expert file is what the GPU placement holds:
    weights to the byte (FP4 experts as stored), and the prefill scratch the banks reserve."""
    from tallow.memory.budget import _gpu_expert_stack, gpu_weights_bytes

    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}-{qtype.name}.gguf", qtype=qtype))
    monkeypatch.setattr(dispatch.Placement, "on_gpu", property(lambda self: True))
    model = build_model(gf, spec_from_gguf(gf))
    banks = [layer.ffn_experts for layer in model.layers]
    planned = sum(t.n_bytes if len(t.shape) == 3 else t.n_rows * t.n_cols * 4 for t in gf.tensors.values()
                  if "_exps." in t.name)
    assert planned == sum(b.nbytes for b in banks)
    if arch == "qwen3moe":  # the whole account too, less qwen3's Q/K norm rows, held once per head
        qk = sum((layer.n_heads + layer.n_kv_heads - 2) * layer.head_dim * 4 for layer in model.spec.layers)
        assert gpu_weights_bytes(gf) == model.nbytes + model.embedding.nbytes - qk
    largest = max(t.n_rows * t.n_cols for t in gf.tensors.values() if len(t.shape) >= 2 and t.n_rows > 1)
    assert model.place._scratch.buffer.numel() <= max(largest, _gpu_expert_stack(gf))
    bank = model.layers[1].ffn_experts
    assert model.place._scratch.buffer.numel() >= sum(w.n_experts * w.rows * w.k for w in bank.gate_up[:1])


@pytest.mark.parametrize("arch, qtype", [("qwen3moe", QT.Q8_0), ("gemma4-moe", QT.Q4_0), ("qwen3moe", QT.NVFP4)])
def test_gpu_bank_integer_dot_path(tmp_path, monkeypatch, arch, qtype):
    """TALLOW_MOE_MMVQ (default): the routed experts through the integer-dot GEMV (x as Q8_1). A decode
    row (its GLU folded into down's quantization) bit for bit its row of a multi-token pair path
    (GLU materialized first); within Q8_1's rounding of the torch reference (fp32 products): two
    roundings in series, h (0.5% relative here) and the GLU output (0.8-1.0%), through the GLU and
    the slot sum: 5e-2 (measured 2.9e-2 on gemma4-moe Q4_0, under 2e-2 on qwen3moe Q8_0); the
    fp32 expert GEMV's output differs from it."""
    spec, _, gpu = _models(tmp_path, monkeypatch, arch, qtype)
    bank = gpu.layers[1].ffn_experts
    g = torch.Generator().manual_seed(2)
    n, k = 2, spec.n_experts_used  # two tokens (a pair path of several rows, and its row 1 alone): the interpreter is slow
    h = torch.randn(n, spec.dim, generator=g)
    weights, ids = cpu_moe.route_softmax(torch.randn(n, spec.n_experts, generator=g), k)
    glu = (lambda gu: gpu.ops.glu(gu, "swiglu")) if arch == "qwen3moe" else (lambda gu: gpu.ops.glu(gu, "geglu"))
    monkeypatch.setenv("TALLOW_MOE_GROUPED", "0")
    monkeypatch.setenv("TALLOW_MOE_MMVQ", "0")
    fp32 = bank(h, ids, weights, glu)
    monkeypatch.setenv("TALLOW_MOE_MMVQ", "1")
    pairs = bank(h, ids, weights, glu)
    one = bank(h[1:2], ids[1:2], weights[1:2], glu)
    assert torch.equal(one[0], pairs[1])
    assert not torch.equal(pairs, fp32)  # the switch took the other kernel
    monkeypatch.setenv("TALLOW_MOE_TRITON", "0")
    ref = bank(h, ids, weights, glu)
    assert float((pairs - ref).norm() / ref.norm()) < 5e-2


@triton.jit
def _decode_e2m1(w_ptr, lo_ptr, hi_ptr):
    i = tl.arange(0, 2)
    lo, hi = _e2m1_words(tl.load(w_ptr + i), False)
    tl.store(lo_ptr + i, lo)
    tl.store(hi_ptr + i, hi)


def test_nv_order_quantization_and_e2m1_bytes():
    """quantize_q8_1(nv_order=True) stores exactly the natural codes permuted per 16 (0, 8, 1, 9, ...);
    the portable E2M1 byte decoding (the interpreter's form of the NVFP4 kernel's byte permutes)
    gives ggml's kvalues for all 16 codes."""
    from tallow.kernels.triton.mmvq import nv_order_reference, quantize_q8_1
    from tallow.quant.fp4 import KVALUES

    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3))
    nat, nv = quantize_q8_1(x), quantize_q8_1(x, nv_order=True)
    assert torch.equal(nv.qs, nv_order_reference(nat.qs)) and not torch.equal(nv.qs, nat.qs)
    assert torch.equal(nv.d, nat.d) and torch.equal(nv.isum, nat.isum)

    words = torch.tensor([0x76543210, 0xFEDCBA98 - (1 << 32)], dtype=torch.int32)  # nibbles 0..7, then 8..15
    lo, hi = torch.empty(2, dtype=torch.int32), torch.empty(2, dtype=torch.int32)
    _decode_e2m1[(1,)](words, lo, hi)
    got = torch.stack([lo, hi], 1).view(torch.int8).reshape(-1).float()
    assert torch.equal(got, KVALUES)


def test_router_never_names_an_expert_past_the_layer():
    """A NaN or inf router logit (an overflowing random twin on the H200 did this): the Triton
    router's ids stay experts of the layer (a NaN once gave id n_experts, and the expert GEMV read
    past its weights: an illegal memory access), NaN ranking first as in torch.topk, the weights NaN."""
    from tallow.kernels.triton.moe_route import moe_route

    logits = torch.randn(3, 16, generator=torch.Generator().manual_seed(4))
    logits[0, 5] = float("nan")
    logits[1, :] = float("nan")
    logits[2, 7] = float("inf")
    weights, ids = moe_route(logits, 4, True, cpu_moe.MIN_WEIGHT_SUM)
    assert int(ids.min()) >= 0 and int(ids.max()) < 16
    # one NaN or inf logit makes the row's softmax all NaN (as torch's): every lane ties, lowest ids first
    assert ids.tolist() == [[0, 1, 2, 3]] * 3 and bool(weights.isnan().all())
    logits[:, :] = torch.randn(3, 16, generator=torch.Generator().manual_seed(5))
    assert torch.equal(moe_route(logits, 4, True, cpu_moe.MIN_WEIGHT_SUM)[1], cpu_moe.route_softmax(logits, 4)[1])


@pytest.mark.parametrize("arch", ["qwen3moe", "gemma4-moe"])
def test_gpu_plan_counts_the_rope_tables(tmp_path, monkeypatch, arch):
    """A GPU model keeps RoPE tables for its whole trained context from the load (Gemma 4 26B-A4B
    twin: 2.25 GiB, found as the gap between the plan and a cuda load on the H200): the GPU plan's
    weights count them to the byte."""
    from tallow.memory.budget import gpu_rope_bytes, gpu_weights_bytes, plan_memory

    gf = GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf", qtype=QT.Q8_0))
    spec = spec_from_gguf(gf)
    monkeypatch.setattr(dispatch.Placement, "on_gpu", property(lambda self: True))
    model = build_model(gf, spec)
    held = sum(getattr(t, f).numel() * 4 for t in model.rope.values() for f in ("cos", "sin", "cos_full", "sin_signed"))
    assert held == gpu_rope_bytes(spec) > 0
    monkeypatch.setattr("tallow.memory.budget.gpu_free_bytes", lambda device: 1 << 40)
    assert plan_memory(gf, 64, device="cuda").weights == gpu_weights_bytes(gf) + held


def test_scale_fold_off_is_the_torch_ops(tmp_path, monkeypatch):
    """TALLOW_MOE_SCALE_FOLD=0: gemma4-moe's per-expert output scales by torch's gather and multiply
    (the router's input scaling after its norm) -- within rounding of the folded launch's output."""
    spec, _, gpu = _models(tmp_path, monkeypatch, "gemma4-moe", QT.Q4_0)
    bank = gpu.layers[1].ffn_experts
    assert bank.out_scale is not None
    g = torch.Generator().manual_seed(6)
    h = torch.randn(2, spec.dim, generator=g)
    weights, ids = cpu_moe.route_softmax(torch.randn(2, spec.n_experts, generator=g), spec.n_experts_used)
    glu = lambda gu: gpu.ops.glu(gu, "geglu")  # noqa: E731
    folded = bank(h, ids, weights, glu)
    monkeypatch.setenv("TALLOW_MOE_SCALE_FOLD", "0")
    unfolded = bank(h, ids, weights, glu)
    assert float((folded - unfolded).norm() / unfolded.norm()) < 1e-6


@pytest.mark.parametrize("arch, qtype", [("qwen3moe", QT.Q8_0), ("qwen3moe", QT.NVFP4), ("gemma4-moe", QT.Q8_0)])
def test_grouped_prefill_kernel(tmp_path, monkeypatch, arch, qtype):
    """TALLOW_MOE_GROUPED_PREFILL (default): a prefill chunk's routed experts through moe_grouped
    (pairs sorted by expert, the weight's bf16 tiles rebuilt in registers, fp32 sums; its kernel
    case: 1e-6 of float64 on the same bf16 values). Against the torch reference (exact weights, fp32
    products): x and the weights rounded to bf16, ~2^-9 each: 1e-2 (measured 2.9e-3 to 4.5e-3); the
    dequantize-all path (=0) also rounds each product's output to bf16: 2e-2 (measured 4.6e-3 to 1.1e-2).
    The per-expert scales (gemma4-moe) in the launches or by torch ops (TALLOW_MOE_SCALE_FOLD=0): 1e-6."""
    spec, _, gpu = _models(tmp_path, monkeypatch, arch, qtype)
    bank = gpu.layers[1].ffn_experts
    g = torch.Generator().manual_seed(3)
    n, k = 9, spec.n_experts_used  # > 8: the grouped path
    h = torch.randn(n, spec.dim, generator=g)
    weights, ids = cpu_moe.route_softmax(torch.randn(n, spec.n_experts, generator=g), k)
    glu = (lambda gu: gpu.ops.glu(gu, "swiglu")) if arch == "qwen3moe" else (lambda gu: gpu.ops.glu(gu, "geglu"))
    assert bank._fused()
    fused = bank(h, ids, weights, glu)
    monkeypatch.setenv("TALLOW_MOE_GROUPED_PREFILL", "0")
    assert not bank._fused()
    old = bank(h, ids, weights, glu)
    monkeypatch.setenv("TALLOW_MOE_TRITON", "0")
    ref = bank(h, ids, weights, glu)
    assert float((fused - ref).norm() / ref.norm()) < 1e-2
    assert float((old - ref).norm() / ref.norm()) < 2e-2
    if bank.out_scale is not None:
        monkeypatch.delenv("TALLOW_MOE_GROUPED_PREFILL")
        monkeypatch.delenv("TALLOW_MOE_TRITON")
        monkeypatch.setenv("TALLOW_MOE_SCALE_FOLD", "0")
        assert float((bank(h, ids, weights, glu) - fused).norm() / fused.norm()) < 1e-6
