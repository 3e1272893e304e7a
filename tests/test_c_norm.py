"""kernels/cpu/c_norm.py (row_norm.c): RMSNorm rows in C, bit for bit numerics.ggml_rms_norm (ggml's
arithmetic), for plain rows, heads sliced out of a projection with a per-head weight, weightless rows,
many rows split over threads, and the fused norm-add with a scale."""

from __future__ import annotations

import pytest
import torch

from tallow.kernels.cpu import c_norm
from tallow.layers import rms_norm, rms_norm_reference
from tallow.numerics import ggml_rms_norm

pytestmark = pytest.mark.skipif(not c_norm.usable(), reason="the C library is not built")


def _x(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 3.0


@pytest.mark.parametrize("rows,n", [(1, 1536), (3, 7), (130, 576)])  # 130: split over threads
def test_rows_equal_the_ggml_emulation_bit_for_bit(rows, n):
    x, w = _x(rows, n), _x(n, seed=1)
    assert torch.equal(c_norm.rms_norm(x, w, 1e-6), ggml_rms_norm(x, w, 1e-6))
    assert torch.equal(c_norm.rms_norm(x, None, 1e-6), ggml_rms_norm(x, None, 1e-6))
    assert torch.allclose(c_norm.rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), rtol=1e-5, atol=1e-5)


def test_heads_sliced_from_a_projection_with_a_per_head_weight():
    proj = _x(5, 12 * 64)
    qk = proj[:, : 10 * 64].view(5, 10, 64)  # rows are not evenly strided: 10 heads of each token
    assert not qk.is_contiguous()
    w = _x(10, 64, seed=2)
    want = ggml_rms_norm(qk.contiguous(), None, 1e-6) * w  # the per-head weight after the scale
    got = c_norm.rms_norm(qk, w, 1e-6)
    assert torch.equal(got, torch.stack([ggml_rms_norm(qk[:, h], w[h], 1e-6) for h in range(10)], 1))
    assert torch.equal(got, want)


def test_norm_add_is_the_torch_composition():
    x, b, w, s = _x(4, 256), _x(4, 256, seed=3), _x(256, seed=4), torch.tensor([0.7])
    assert torch.equal(c_norm.norm_add(x, b, w, 1e-6), x + ggml_rms_norm(b, w, 1e-6))
    assert torch.equal(c_norm.norm_add(x, b, w, 1e-6, s), (x + ggml_rms_norm(b, w, 1e-6)) * s)


def test_layers_route_cpu_rows_to_c_unless_switched_off(monkeypatch):
    x, w = _x(2, 96), _x(96, seed=5)
    assert torch.equal(rms_norm(x, w, 1e-6), ggml_rms_norm(x, w, 1e-6))
    monkeypatch.setenv("TALLOW_CPU_C_NORM", "0")
    assert torch.equal(rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (96,), w, 1e-6))
