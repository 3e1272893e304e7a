"""Triton decode GEMV kernels (tallow/kernels/triton/quant_gemv.py) and their byte-plane repack,
run on the CPU through Triton's interpreter against tallow.quant.reference.

Tolerance: the kernels rebuild the reference's fp32 weights (bit-exact up to fma contraction of
`d*q - m`) and sum fp32 products in another order than torch's matmul, so the difference is
fp32 rounding: a few ulps times sqrt(K) relative to the output norm. We demand 2e-6 relative
(measured ~2-4e-7 at K <= 512); a wrong nibble, scale or offset anywhere gives > 1e-2.
"""

from __future__ import annotations

import os
import zlib

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

import tallow.kernels.triton  # noqa: E402,F401  (applies the interpreter shim)
from tallow.kernels.triton.planes import (QTYPES, dequantize_planes, pack_planes, random_raw,  # noqa: E402
                                          unpack_planes)
from tallow.kernels.triton.quant_gemv import quant_gemv, quant_gemv_reference  # noqa: E402

TYPES = ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0"]
TYPE_ID = {name: tid for tid, (name, _, _) in QTYPES.items()}


def _ref_dequant(raw: torch.Tensor, name: str, k: int) -> torch.Tensor:
    reference = pytest.importorskip("tallow.quant.reference")  # needs the gguf package
    return reference.dequantize(raw, TYPE_ID[name], k)


@pytest.mark.parametrize("name", TYPES)
def test_planes_are_a_lossless_repack_and_dequantize_bit_exactly(name: str) -> None:
    g = torch.Generator().manual_seed(1)
    raw = random_raw(name, 7, 512, g)
    w = pack_planes(raw, name, 512)
    assert torch.equal(unpack_planes(w), raw)
    assert w.nbytes == raw.numel()
    assert torch.equal(dequantize_planes(w), _ref_dequant(raw, name, 512))


def test_pack_planes_rejects_bad_rows() -> None:
    with pytest.raises(ValueError):
        pack_planes(torch.zeros((4, 100), dtype=torch.uint8), "Q4_K", 256)
    with pytest.raises(ValueError):
        pack_planes(torch.zeros((4, 144), dtype=torch.uint8), "Q5_K", 256)


# quant_gemv against quant_gemv_reference on every type (16x256x1, 48x512x3): tests/kernel_cases.py.


def test_gemv_fp16_activations_and_1d_input() -> None:
    g = torch.Generator().manual_seed(5)
    w = pack_planes(random_raw("Q4_K", 16, 256, g), "Q4_K", 256)
    x = torch.randn(256, generator=g).half()
    y = quant_gemv(x, w)
    ref = quant_gemv_reference(x.float().reshape(1, -1), w).reshape(-1)
    assert y.shape == (16,) and y.dtype == torch.float32
    assert (y - ref).norm() / ref.norm() < 2e-6


def test_gemv_tail_blocks_and_rows() -> None:
    """K not a multiple of the step (masked tail chunks) and N not a multiple of BLOCK_N."""
    g = torch.Generator().manual_seed(6)
    w = pack_planes(random_raw("Q6_K", 13, 768, g), "Q6_K", 768)  # 3 blocks, step of 2
    x = torch.randn(2, 768, generator=g)
    y = quant_gemv(x, w, config=(8, 2, 4, 1))
    ref = quant_gemv_reference(x, w)
    assert (y - ref).norm() / ref.norm() < 2e-6


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q4_1", "Q5_0"])
@pytest.mark.parametrize("kind", ["norm+residual", "norm", "swiglu", "geglu"])
def test_gemv_prologue_equals_the_op_then_the_product(name: str, kind: str) -> None:
    """RMSNorm (+ residual, writing the new residual stream) or a GLU folded into the x loads
    gives the separate kernels' result: the same fp32 operations, summed in another order."""
    from tallow.kernels.triton.glu import glu
    from tallow.kernels.triton.quant_gemv import Prologue
    from tallow.kernels.triton.rmsnorm import rmsnorm

    k, n, m = 512, 24, 2
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}{kind}".encode()))
    w = pack_planes(random_raw(name, n, k, g), name, k)
    if kind.startswith("norm"):
        x, r, nw = torch.randn(m, k, generator=g), torch.randn(m, k, generator=g), torch.randn(k, generator=g)
        res = r if kind == "norm+residual" else None
        s_out = torch.full((m, k), float("nan"))
        y = quant_gemv(x, w, prologue=Prologue("norm", nw, 1e-6, res, s_out if res is not None else None))
        want = quant_gemv(rmsnorm(x, nw, 1e-6, residual=res), w)
        if res is not None:
            assert torch.equal(s_out, x + r)
    else:
        gu = torch.randn(m, 2 * k, generator=g)
        y = quant_gemv(gu, w, prologue=Prologue(kind))
        want = quant_gemv(glu(gu[:, :k], gu[:, k:], kind), w)
    assert float((y - want).norm() / want.norm()) < 1e-5


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("prologue", [None, "norm+residual"])
def test_gemv_rows_are_computed_independently(name: str, prologue) -> None:
    """Speculative verification on the GPU relies on it: m rows in one launch give bit for bit
    the m one-row products (an accumulator per row, the same code for any m), the norm
    prologue's per-row statistics included."""
    from tallow.kernels.triton.quant_gemv import Prologue

    g = torch.Generator().manual_seed(9)
    w = pack_planes(random_raw(name, 24, 512, g), name, 512)
    x = torch.randn(8, 512, generator=g)
    res, nw = torch.randn(8, 512, generator=g), torch.rand(512, generator=g)

    def product(rows: slice) -> torch.Tensor:
        if prologue is None:
            return quant_gemv(x[rows], w)
        return quant_gemv(x[rows], w, prologue=Prologue("norm", nw, 1e-6, res[rows], torch.empty_like(x[rows])))

    assert torch.equal(product(slice(0, 8)), torch.cat([product(slice(i, i + 1)) for i in range(8)]))


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q4_1"])
def test_split_k_matches_reference_and_keeps_rows_exact(name: str) -> None:
    # K splits whose last one is ragged (k=2048 Q4_K: 8 blocks in 3 splits of whole steps); the
    # ticket slots must be back at zero after each launch or the next one would merge too early.
    from tallow.kernels.triton.quant_gemv import TICKET_SLOTS, _tickets

    g = torch.Generator().manual_seed(zlib.crc32(f"split-{name}".encode()))
    k = 2048 if name.endswith("K") else 1024
    raw = random_raw(name, 12, k, g)
    w = pack_planes(raw, name, k)
    x = torch.randn(3, k, generator=g)
    ref = x @ _ref_dequant(raw, name, k).T
    for cfg in ((4, 1, 4, 1, 3), (4, 2, 4, 1, 8)):
        y = quant_gemv(x, w, config=cfg)
        assert float((y - ref).norm() / ref.norm()) < 2e-6, cfg
        for r in range(3):
            assert torch.equal(y[r], quant_gemv(x[r:r + 1], w, config=cfg)[0])
    assert int(_tickets(torch.device("cpu")).abs().sum()) == 0 and TICKET_SLOTS >= 4


def test_split_k_switch_and_config(monkeypatch) -> None:
    from tallow.kernels.triton.quant_gemv import gemv_config

    assert gemv_config("Q4_1", 576, 1536)[4] == 6  # smollm2 down: 72 row tiles, split over K
    assert gemv_config("Q4_K", 19456, 2560)[4] == 1  # qwen3-4b gate+up: the grid is full
    monkeypatch.setenv("TALLOW_GEMV_SPLITK", "0")  # tests/conftest.py refreshes tallow.switches
    assert gemv_config("Q4_1", 576, 1536)[4] == 1
    assert gemv_config("Q6_K", 2560, 9728)[4] == 1
