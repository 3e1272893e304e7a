"""GPU layers (Triton GEMV / dequant-to-scratch, embedding from byte planes) against the
CPU reference, run by Triton's interpreter on CPU tensors so CI checks them without a GPU."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

pytest.importorskip("triton")

from tiny_models import write_tiny_model  # noqa: E402

from tallow.gguf_file import GGUFFile  # noqa: E402
from tallow.kernels.cpu.linear import ReferenceLinear, make_embedding  # noqa: E402
from tallow.kernels.gpu.linear import GPUEmbedding, GPULinear, Scratch  # noqa: E402


@pytest.fixture(scope="module", params=[QT.Q8_0, QT.Q4_0, QT.Q4_1])
def tiny(request, tmp_path_factory):
    path = write_tiny_model("llama", tmp_path_factory.mktemp("gpu") / "tiny.gguf", qtype=request.param)
    return GGUFFile(path)


@pytest.mark.parametrize("rows", [1, 3, 12])
def test_gpu_linear_matches_reference(tiny, rows):
    t = tiny.tensors["blk.0.ffn_up.weight"]
    bias = np.random.RandomState(0).standard_normal(t.n_rows).astype(np.float32)
    gpu = GPULinear(t, bias, torch.device("cpu"), Scratch(torch.device("cpu")))
    ref = ReferenceLinear(t, torch.from_numpy(bias))
    x = torch.randn(rows, t.n_cols, generator=torch.Generator().manual_seed(rows))
    y, y_ref = gpu(x), ref(x)
    # GEMV (rows <= 8): fp32 throughout, only summation order differs. Prefill: bf16 weights
    # and activations (8 significant bits each, ~3e-3 norm-relative) into an fp32 accumulator.
    tol = 1e-5 if rows <= 8 else 1e-2
    assert (y - y_ref).norm() / y_ref.norm() < tol


def test_gpu_embedding_matches_cpu(tiny):
    t = tiny.tensors["token_embd.weight"]
    ids = torch.tensor([0, 5, 257, 3])
    assert torch.equal(GPUEmbedding(t, torch.device("cpu"))(ids), make_embedding(t)(ids))


def test_stacked_gpu_linear_equals_its_parts(tiny):
    from tallow.kernels.dispatch import Placement

    place = Placement("cpu")
    place._scratch = Scratch(torch.device("cpu"))
    names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]
    parts = [GPULinear(tiny.tensors[n], None, torch.device("cpu"), place._scratch) for n in names]
    stacked = GPULinear.stacked(parts)
    x = torch.randn(2, parts[0].in_features, generator=torch.Generator().manual_seed(7))
    assert torch.allclose(stacked(x), torch.cat([p(x) for p in parts], dim=-1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["token_embd.weight", "output.weight"])  # Q4_K and Q6_K rows
def test_gpu_embedding_k_quants_match_cpu(name):
    from model_paths import require_model

    path = require_model("qwen2.5-coder-1.5b-instruct")  # skips, or fails under TALLOW_REQUIRE_MODELS=1
    t = GGUFFile(path).tensors[name]
    rows = t.data[:64]  # a slice of the table is enough, and keeps the test fast
    from dataclasses import replace

    small = replace(t, shape=(t.shape[0], 64), n_bytes=rows.nbytes, data=rows)
    ids = torch.tensor([0, 17, 63])
    assert torch.equal(GPUEmbedding(small, torch.device("cpu"))(ids), make_embedding(small)(ids))


@pytest.mark.parametrize("rows", [1, 12])  # the GEMV and the dequant + matmul paths
def test_linear_group_of_mixed_types_writes_each_part_in_place(tmp_path, rows):
    """Q4_K_M files mix types inside Q/K/V (Q6_K V): the group's parts write their own columns
    of one output instead of being concatenated; with a bias, as qwen2 has."""
    from tallow.kernels.dispatch import LinearGroup

    scratch = Scratch(torch.device("cpu"))
    a = GGUFFile(write_tiny_model("llama", tmp_path / "a.gguf", qtype=QT.Q8_0)).tensors["blk.0.attn_q.weight"]
    b = GGUFFile(write_tiny_model("llama", tmp_path / "b.gguf", qtype=QT.Q4_1)).tensors["blk.0.attn_k.weight"]
    bias = np.arange(b.n_rows, dtype=np.float32)
    parts = [GPULinear(a, None, torch.device("cpu"), scratch), GPULinear(b, bias, torch.device("cpu"), scratch)]
    x = torch.randn(rows, a.n_cols, generator=torch.Generator().manual_seed(3))
    expected = torch.cat([p(x) for p in parts], dim=-1)
    assert torch.equal(LinearGroup(parts)(x), expected)


def test_the_short_k_switch_sends_only_mamba_dt_projections_to_the_fp32_gemv(monkeypatch):
    """TALLOW_GEMV_SHORT_K: a wide matrix over <= 256 columns and < 2M weights (Mamba-1.4B's dt
    projection, 4096 x 128) leaves the integer-dot GEMV; the wide matrices of the transformers
    (Qwen2.5-1.5B's gate+up and output projection, a 4096 x 4096) and FalconMamba-7B's dt
    projection (8192 x 256, 2M weights) keep it."""
    from tallow.kernels.gpu.linear import mmvq_wins

    keep = [("Q4_K", 17920, 1536), ("Q6_K", 151936, 1536), ("Q4_K", 4096, 4096), ("Q5_0", 8192, 256)]
    monkeypatch.setenv("TALLOW_GEMV_SHORT_K", "0")
    assert mmvq_wins("Q5_0", 4096, 128) and all(mmvq_wins(*s) for s in keep)
    monkeypatch.setenv("TALLOW_GEMV_SHORT_K", "1")
    assert not mmvq_wins("Q5_0", 4096, 128) and all(mmvq_wins(*s) for s in keep)


def test_mmvq_switch_routes_wide_matrices_to_the_integer_gemv(monkeypatch):
    """By default a matrix mmvq_wins picks decodes through mmvq (its own numbers, x rounded to
    Q8_1) and says so in its kind; a stacked layer decides again for its own shape;
    TALLOW_GEMV_MMVQ=0 sends every matrix through the fp32 GEMV."""
    from test_quant_reference import random_rows

    from tallow.gguf_file import TensorInfo
    from tallow.kernels.gpu import linear as gpu_linear
    from tallow.kernels.triton.mmvq import mmvq

    raw = random_rows(QT.Q4_K, 64, 256, seed=3)
    t = TensorInfo("w", QT.Q4_K, (256, 64), 0, raw.nbytes, raw)
    cpu = torch.device("cpu")
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(5))
    fp32 = GPULinear(t, None, cpu, Scratch(cpu))
    assert fp32.kind == "triton_q4_k" and not fp32.use_mmvq  # 64 x 256 is not a shape mmvq wins on
    monkeypatch.setattr(gpu_linear, "mmvq_wins", lambda qtype, n, k: n >= 128)
    layer = GPULinear(t, None, cpu, Scratch(cpu))
    assert layer.kind == "triton_q4_k"
    stacked = GPULinear.stacked([layer, layer])
    assert stacked.kind == "mmvq_q4_k" and stacked.use_mmvq
    y = stacked(x)
    assert torch.equal(y, mmvq(x, stacked.planes))
    monkeypatch.setenv("TALLOW_GEMV_MMVQ", "0")
    assert GPULinear.stacked([layer, layer]).kind == "triton_q4_k"
    ref = torch.cat([fp32(x)] * 2, dim=-1)
    assert 0 < float((y - ref).norm() / ref.norm()) < 2e-2  # Q8_1 activations: near, not equal


@pytest.mark.parametrize("kernel", ["mmvq", "gemv"])
@pytest.mark.parametrize("rows, split", [(1, 1), (3, 1), (2, 2)])
def test_the_add_epilogue_is_the_separate_add(kernel, rows, split):
    """TALLOW_GEMV_ADD_EPILOGUE: the GEMVs add a bias (every row) or an addend (one per row) as they
    store y, the same fp32 add as a launch of its own after them, also after a K-split merge."""
    from test_quant_reference import random_rows

    from tallow.kernels.triton.mmvq import mmvq
    from tallow.kernels.triton.planes import pack_planes
    from tallow.kernels.triton.quant_gemv import quant_gemv

    raw = random_rows(QT.Q4_K, 8, 512, seed=11)  # two 4-row tiles, two K blocks (a split of 2)
    w = pack_planes(torch.from_numpy(raw.copy()), QT.Q4_K, 512)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 512, generator=g)
    bias, addend = torch.randn(8, generator=g), torch.randn(rows, 8, generator=g)
    if kernel == "mmvq":
        def run(add=None):
            return mmvq(x, w, config=(4, 1, 1, 1, split, False), add=add)
    else:
        def run(add=None):
            return quant_gemv(x, w, config=(4, 1, 1, 1, split), add=add)
    assert torch.equal(run(bias), run() + bias)
    assert torch.equal(run(addend), addend + run())
    with pytest.raises(ValueError):
        run(torch.randn(rows + 1, 8))


def test_the_add_epilogue_switch(monkeypatch):
    """GPULinear folds its bias, or an `addend`, into the GEMV; with both, or with the switch off,
    torch adds them: the same bits either way."""
    from test_quant_reference import random_rows

    from tallow.gguf_file import TensorInfo

    raw = random_rows(QT.Q4_K, 24, 256, seed=5)
    t = TensorInfo("w", QT.Q4_K, (256, 24), 0, raw.nbytes, raw)
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(2)
    layer = GPULinear(t, np.arange(24, dtype=np.float32) / 7, cpu, Scratch(cpu))
    x, addend = torch.randn(2, 256, generator=g), torch.randn(2, 24, generator=g)
    on = [layer(x), layer(x, addend=addend), layer(x, add_bias=False, addend=addend)]
    monkeypatch.setenv("TALLOW_GEMV_ADD_EPILOGUE", "0")
    off = [layer(x), layer(x, addend=addend), layer(x, add_bias=False, addend=addend)]
    for a, b in zip(on, off):
        assert torch.equal(a, b)
    assert torch.equal(off[1], addend + (layer(x, add_bias=False) + layer.bias))
