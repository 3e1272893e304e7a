"""MXFP4 and NVFP4 (tallow/quant/fp4.py) bit for bit against gguf.quants' numpy reference (gguf
0.19 has both dequantizers), on random bytes and on every scale byte value."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf.quants import dequantize as gguf_dequantize

from tallow.quant.reference import dequantize


def _rows(qtype: QT, n_rows: int, n_cols: int, seed: int) -> np.ndarray:
    """Random bytes; the scale bytes cycle through all 256 values (NaN-free for E8M0 by ggml's
    rule: 0xFF is 2^127, no NaN), so every exponent and mantissa is exercised."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (n_rows * n_cols // block, size), dtype=np.uint8)
    n_scale = 1 if qtype == QT.MXFP4 else 4
    raw[:, :n_scale] = (np.arange(raw.shape[0] * n_scale) % 256).reshape(-1, n_scale)
    return raw.reshape(n_rows, -1)


@pytest.mark.filterwarnings("ignore:overflow encountered")  # gguf's numpy: E8M0 255 times 12 is inf, as in ggml
@pytest.mark.parametrize("qtype", [QT.MXFP4, QT.NVFP4])
@pytest.mark.parametrize("n_rows, n_cols", [(1, 64), (37, 256), (256, 512)])
def test_dequantize_is_bit_exact_against_gguf(qtype, n_rows, n_cols):
    raw = _rows(qtype, n_rows, n_cols, n_rows * 7 + n_cols)
    ours = dequantize(raw, qtype, n_cols).numpy()
    ref = gguf_dequantize(raw, qtype).reshape(n_rows, n_cols).astype(np.float32)
    assert ours.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", [QT.MXFP4, QT.NVFP4])
def test_bf16_holds_every_fp4_weight_exactly(qtype):
    """Why dense bf16 is an exact CPU home for these types (kernels/cpu/linear.py): a code of <= 3
    significant bits times a scale of <= 4 has <= 7, within bf16's 8 (normal range)."""
    raw = _rows(qtype, 64, 256, 3)
    w = dequantize(raw, qtype, 256)
    normal = (w.abs() > 2.0**-126) & (w.abs() < 2.0**127)
    assert torch.equal(w[normal].bfloat16().float(), w[normal])


def test_hand_checked_values():
    """Values worked out from the spec: MXFP4 e = 127 is 2^0 for the E2M1 value, so code 0xF
    (-6, doubled -12 times 2^(127 - 128)) -> -6 and code 7 -> 6;
    NVFP4 scale byte 0x38 (exp 7, man 0) = 1.0 -> 0.5 after halving, code 0xF (-12) -> -6."""
    mx = np.zeros((1, 17), dtype=np.uint8)
    mx[0, 0], mx[0, 1] = 127, 0x7F  # element 0: code 0xF; element 16: code 7
    v = dequantize(mx, QT.MXFP4, 32)[0]
    assert v[0].item() == -6.0 and v[16].item() == 6.0 and v[1].item() == 0.0
    nv = np.zeros((1, 36), dtype=np.uint8)
    nv[0, :4] = [0x38, 0x40, 0x00, 0x7F]  # 1.0, 2.0, 0, 0 (halved: 0.5, 1.0, 0, 0)
    nv[0, 4], nv[0, 12] = 0x0F, 0x70  # sub-block 0 element 0: -12; sub-block 1 element 8: 12
    v = dequantize(nv, QT.NVFP4, 64)[0]
    assert v[0].item() == -6.0 and v[16 + 8].item() == 12.0 and v[1].item() == 0.0


def _tensor(qtype: QT, n: int, k: int, seed: int = 0):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from fp4_cpu_paths import random_fp4

    return random_fp4(qtype, n, k, seed)


def test_mxfp4_int8g_holds_the_weight_exactly():
    """MXFP4 through the int4 kernel as exact group-32 int8 (the default): a one-hot input row
    gives back the weight's column bit for bit (weights exact in bf16, one product per output)."""
    from tallow.kernels.cpu.linear import make_linear

    t = _tensor(QT.MXFP4, 48, 128)
    lin = make_linear(t)
    assert lin.kind == "int8g"
    w = dequantize(t.data, t.qtype, t.n_cols)  # (48, 128)
    cols = [0, 5, 31, 32, 127]
    x = torch.zeros(len(cols), 128)
    x[range(len(cols)), cols] = 1.0
    assert torch.equal(lin(x), w[:, cols].T)


@pytest.mark.parametrize("qtype, kind", [(QT.MXFP4, "int8g"), (QT.NVFP4, "dense_bf16")])
def test_fp4_linears_match_the_reference_and_the_plan(qtype, kind, monkeypatch):
    """Both paths within bf16-activation rounding of the fp32 reference product (decode and
    prefill row counts), TALLOW_MXFP4_INT8G=0 gives the dense path, and the plan's bytes are the
    layer's."""
    from tallow.kernels.cpu.linear import make_linear
    from tallow.memory import budget

    t = _tensor(qtype, 80, 256, 1)
    ref = make_linear(t, mode="reference")
    for m in (1, 3, 70):
        x = torch.randn(m, 256)
        for lin in (make_linear(t), make_linear(t, mode="dense")):
            y, r = lin(x), ref(x)
            assert float((y - r).norm() / r.norm()) < 1e-2
    lin = make_linear(t)
    assert budget.linear_kind(qtype) == kind and budget.linear_bytes(80, 256, kind) == lin.nbytes
    monkeypatch.setenv("TALLOW_MXFP4_INT8G", "0")
    assert make_linear(t).kind == "dense_bf16" == budget.linear_kind(qtype)
