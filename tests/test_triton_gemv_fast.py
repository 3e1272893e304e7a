"""Second-generation decode GEMV (tallow/kernels/triton/gemv.py) through Triton's interpreter,
against fp32 x @ dequantize(W).T (planes.py's dequantization, bit-exact with the quant reference).

Tolerance: the kernels turn codes into floats 1 + q/2^b exactly and fold the offset into a
per-sub-block sum of x, so the result is fp32 rounding (a cancellation of ~2-3x on top of
quant_gemv.py's): we demand 4e-6 relative to the output norm (measured ~3-6e-7); a wrong nibble,
shift, scale or plane gives > 1e-2.
"""

from __future__ import annotations

import os
import zlib

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

import tallow.kernels.triton  # noqa: E402,F401  (applies the interpreter shim)
from tallow.kernels.triton.gemv import (GemvInput, concat_weights, gemv, gemv_multi, gemv_prep,  # noqa: E402
                                        gemv_reference, layout_perm)
from tallow.kernels.triton.planes import pack_planes, random_raw  # noqa: E402

TYPES = ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0"]


def _weight(name: str, n: int, k: int, g: torch.Generator):
    return pack_planes(random_raw(name, n, k, g), name, k)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y - ref).norm() / ref.norm())


@pytest.mark.parametrize("name", TYPES)
def test_layout_perm_is_a_permutation(name: str) -> None:
    p = layout_perm(name, 512)
    assert torch.equal(torch.sort(p.long()).values, torch.arange(512))


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n,k,m,config", [(16, 512, 1, None), (13, 768, 2, (8, 2, 4, 1))])
def test_gemv_matches_reference(name: str, n: int, k: int, m: int, config) -> None:
    """Rows not a multiple of the tile and (second case) K not a multiple of the step."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}-{n}-{k}-{m}".encode()))
    w = _weight(name, n, k, g)
    x = torch.randn(m, k, generator=g)
    if config is not None and name not in ("Q4_K", "Q6_K"):
        config = (8, 16, 4, 1)  # 24 blocks of 32, steps of 16: a masked tail
    y = torch.full((m, n), float("nan"))  # poisoned: every element must be written
    gemv(x, w, out=y, config=config)
    assert torch.isfinite(y).all()
    assert _rel(y, gemv_reference(x, w)) < 4e-6


def test_shared_prep_multi_and_concat() -> None:
    """One prep for a Q4_K + Q6_K pair (two layouts), bf16 input, and a concatenated weight."""
    g = torch.Generator().manual_seed(7)
    k = 256
    wq, wk, wv = _weight("Q4_K", 8, k, g), _weight("Q4_K", 4, k, g), _weight("Q6_K", 4, k, g)
    x = torch.randn(k, generator=g).bfloat16()
    prep = gemv_prep(x, GemvInput(1, k, ("Q4_K", "Q6_K"), "cpu"))
    ys = gemv_multi(None, [concat_weights([wq, wk]), wv], prep=prep)
    xf = x.float()
    assert _rel(ys[0][0, :8], gemv_reference(xf, wq)[0]) < 4e-6
    assert _rel(ys[0][0, 8:], gemv_reference(xf, wk)[0]) < 4e-6
    assert _rel(ys[1][0], gemv_reference(xf, wv)[0]) < 4e-6
    y1 = gemv(xf, wv)  # 1-D in, 1-D out
    assert y1.shape == (4,) and _rel(y1, gemv_reference(xf, wv)[0]) < 4e-6
