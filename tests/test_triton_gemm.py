"""Prefill paths (tallow/kernels/triton/quant_gemm.py: dequant inside the tensor-core loop;
dequant.py: dequant to a dense fp16/bf16 scratch) through Triton's interpreter, against
x @ reference-dequantized W in fp32.

Tolerance: the weight and the activations are each rounded once to fp16 (2^-11 relative) before
an fp32-accumulated product, so the output is off by ~2e-4 relative to the output norm; we
demand 1e-3. The dense dequant must equal the reference rounded to the dtype exactly.
bf16 `tl.dot` is wrong in Triton 3.6's interpreter (it multiplies the raw bit patterns), so
the bf16 products are checked on the GPU by scripts/gpu_bench_kernels.py; here bf16 is tested
for the dequantization only (and the interpreter truncates fp32 -> bf16, so to within one ulp).
"""

from __future__ import annotations

import os
import zlib

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

import tallow.kernels.triton  # noqa: E402,F401  (applies the interpreter shim)
from tallow.kernels.triton.dequant import dequantize_to, scratch_matmul  # noqa: E402
from tallow.kernels.triton.planes import dequantize_planes, pack_planes, random_raw  # noqa: E402
from tallow.kernels.triton.quant_gemm import quant_gemm  # noqa: E402

# (n, k, m, config): small tiles so the interpreter stays fast; the second has partial M and N
# tiles and, for Q8_0, a K tail (16 blocks, step 3 would not divide -- use 4 with 512/32 = 16).
CASES = [(16, 256, 16, (16, 16, 2, 4, 1)), (48, 512, 33, (32, 32, 1, 4, 1))]


def _weight(name: str, n: int, k: int, seed: str):
    g = torch.Generator().manual_seed(zlib.crc32(seed.encode()))
    scale = 0.02 if name == "Q8_0" else 0.02 / 32  # K-quant sub-scales multiply d by up to 63
    return pack_planes(random_raw(name, n, k, g, scale=scale), name, k), g


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("case", CASES)
def test_fused_gemm_matches_reference(name: str, case) -> None:
    n, k, m, cfg = case
    w, g = _weight(name, n, k, f"{name}{case}")
    x = torch.randn(m, k, generator=g).half()
    ref = x.float() @ dequantize_planes(w).T
    y = torch.full((m, n), float("nan"))
    quant_gemm(x, w, out=y, config=cfg)
    assert torch.isfinite(y).all()
    assert (y - ref).norm() / ref.norm() < 1e-3


def test_fused_gemm_q8_0_k_tail() -> None:
    w, g = _weight("Q8_0", 16, 96, "tail")  # 3 blocks in steps of 2: a masked tail
    x = torch.randn(16, 96, generator=g).half()
    y = quant_gemm(x, w, config=(16, 16, 2, 4, 1))
    ref = x.float() @ dequantize_planes(w).T
    assert (y - ref).norm() / ref.norm() < 1e-3


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dequantize_to_is_the_rounded_reference(name: str, dtype: torch.dtype) -> None:
    w, _ = _weight(name, 20, 512, f"dq{name}")
    dense = dequantize_to(w, dtype, block_n=8)
    exact = dequantize_planes(w)
    if dtype == torch.float16:
        assert torch.equal(dense, exact.to(dtype))
    else:
        # Triton 3.6's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even), so on
        # the CPU we accept one bf16 ulp (2^-7 relative) and check the rest on the GPU.
        assert ((dense.float() - exact).abs() <= exact.abs() * 2.0 ** -7).all()


def test_scratch_matmul() -> None:
    w, g = _weight("Q4_K", 24, 256, "scratch")
    x = torch.randn(5, 256, generator=g)
    scratch = torch.empty(24 * 256 + 100)
    y = scratch_matmul(x, w, scratch)  # fp32 on the CPU; fp16/bf16 on the GPU
    ref = x @ dequantize_planes(w).T
    assert (y - ref).norm() / ref.norm() < 1e-5


def test_fused_gemm_rejects_fp32() -> None:
    w, _ = _weight("Q4_K", 16, 256, "bad")
    with pytest.raises(ValueError):
        quant_gemm(torch.randn(4, 256), w)
