"""The C RMSNorm in the default mode too (layers.rms_norm -> kernels/cpu/ggml_ops.c's go_rms_norm,
ggml's arithmetic): bit for bit numerics.ggml_rms_norm for plain rows, heads sliced out of a
projection with a per-head weight, weightless rows, and the residual add before it; within float
rounding of the op-by-op reference; torch's F.rms_norm with TALLOW_CPU_C_NORM=0."""

from __future__ import annotations

import pytest
import torch

from tallow.kernels.block_ops import TorchOps
from tallow.kernels.cpu import ggml_ops
from tallow.layers import rms_norm, rms_norm_reference
from tallow.numerics import ggml_rms_norm

pytestmark = pytest.mark.skipif(not ggml_ops.built(), reason="the C library is not built")


def _x(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 3.0


@pytest.mark.parametrize("rows,n", [(1, 1536), (3, 7), (130, 576)])
def test_rows_equal_the_ggml_emulation_bit_for_bit(rows, n):
    x, w = _x(rows, n), _x(n, seed=1)
    assert torch.equal(rms_norm(x, w, 1e-6), ggml_rms_norm(x, w, 1e-6))
    assert torch.allclose(rms_norm(x, w, 1e-6), rms_norm_reference(x, w, 1e-6), rtol=1e-5, atol=1e-5)


def test_heads_sliced_from_a_projection_with_a_per_head_weight():
    proj = _x(5, 12 * 64)
    qk = proj[:, : 10 * 64].view(5, 10, 64)  # rows are not evenly strided: 10 heads of each token
    w = _x(10, 64, seed=2)
    got = rms_norm(qk, w, 1e-6)
    assert torch.equal(got, torch.stack([ggml_rms_norm(qk[:, h], w[h], 1e-6) for h in range(10)], 1))


def test_the_residual_add_and_norm_in_one_call_are_the_torch_composition():
    x, d, w = _x(4, 256), _x(4, 256, seed=3), _x(256, seed=4)
    total, h = TorchOps().add_norm(x, d, w, 1e-6)
    assert torch.equal(total, x + d) and torch.equal(h, ggml_rms_norm(x + d, w, 1e-6))


def test_switched_off_torch_runs(monkeypatch):
    x, w = _x(2, 96), _x(96, seed=5)
    monkeypatch.setenv("TALLOW_CPU_C_NORM", "0")
    assert torch.equal(rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (96,), w, 1e-6))
