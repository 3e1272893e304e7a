"""The prefill path (tallow/kernels/triton/dequant.py: dequant to a dense fp16/bf16 scratch, then
a dense product) through Triton's interpreter, against the reference plane dequantization.

The dense dequant must equal the reference rounded to the dtype exactly. Triton 3.6's
interpreter truncates fp32 -> bf16 (the GPU rounds to nearest even), so bf16 is checked here to
within one ulp, and the bf16 products on the GPU by scripts/gpu_bench_kernels.py (section
prefill).
"""

from __future__ import annotations

import os
import zlib

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

import tallow.kernels.triton  # noqa: E402,F401  (applies the interpreter shim)
from tallow.kernels.triton.dequant import dequantize_to  # noqa: E402
from tallow.kernels.triton.planes import dequantize_planes, pack_planes, random_raw  # noqa: E402


def _weight(name: str, n: int, k: int, seed: str):
    g = torch.Generator().manual_seed(zlib.crc32(seed.encode()))
    scale = 0.02 if name == "Q8_0" else 0.02 / 32  # K-quant sub-scales multiply d by up to 63
    return pack_planes(random_raw(name, n, k, g, scale=scale), name, k), g


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16])  # fp16 (exact) and scratch_matmul: tests/kernel_cases.py
def test_dequantize_to_is_the_rounded_reference(name: str, dtype: torch.dtype) -> None:
    w, _ = _weight(name, 20, 512, f"dq{name}")
    dense = dequantize_to(w, dtype, block_n=8)
    exact = dequantize_planes(w)
    assert ((dense.float() - exact).abs() <= exact.abs() * 2.0 ** -7).all()

