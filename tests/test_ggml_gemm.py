"""The prefill product (tallow/kernels/cpu/ggml_gemm.c): Q4_K, Q5_K and Q6_K products of many activation rows in
llama.cpp's tiled prompt order (Q4_1/Q5_0/Q8_0 in vec_dot's), bit for bit the row functions that compute that order one output at a time
(themselves checked against libggml-cpu's ggml_mul_mat in test_ggml_dot.py, whose 8-row fixture now runs
through this product), so a row's bits do not depend on the rows beside it; decode and verification rows
(up to 8) keep vec_dot's order; TALLOW_CPU_GEMM builds the layers without a torch copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from tallow.gguf_file import TensorInfo
from tallow.kernels.cpu import ggml_dot
from test_quant_reference import random_rows

needs_c = pytest.mark.skipif(not ggml_dot.available(), reason=f"C kernel: {ggml_dot.unavailable_reason()}")


@pytest.fixture(params=[ggml_dot.AVX512, ggml_dot.AVX2], ids=["avx512", "avx2"])
def level(request):
    """The product's AVX-512 VNNI and AVX2 code, each where this CPU runs it."""
    if ggml_dot.set_simd(request.param) != request.param:
        ggml_dot.set_simd(True)
        pytest.skip(f"this CPU runs {ggml_dot.status()}")
    yield request.param
    ggml_dot.set_simd(True)
GEMM_TYPES = (QT.Q4_K, QT.Q5_K, QT.Q6_K)
VEC_DOT_TYPES = (QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0)  # vec_dot's order at every row count


def _bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def _tiled(raw, qt, k, xq):
    """The reference: the row functions (gemv_quantized takes the tiled order from 8 rows) with the GEMM off."""
    old = ggml_dot.gemm(False)
    try:
        return ggml_dot.gemv_quantized(raw, qt, k, xq)
    finally:
        ggml_dot.gemm(old)


@needs_c
@pytest.mark.parametrize("qt", GEMM_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("n, k", [(16, 256), (37, 768), (100, 1536), (5, 2304), (3, 512)])
@pytest.mark.parametrize("m", [8, 9, 13, 64, 131])
def test_gemm_is_the_tiled_row_order_bit_for_bit(qt, n, k, m, level):
    """Panels with a short last one (n % 16, and under 8 rows), register tiles with a short last one (m % 6,
    m % 4), 1-9 super-blocks."""
    raw = random_rows(qt, n, k, seed=int(qt) * 1000 + n + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)) * 4
    x[0, :17] = 0.0  # a row with a zero block sum
    xq = ggml_dot.quantize(x, qt)
    assert ggml_dot.gemm() and ggml_dot.gemm_takes(qt)
    ours, ref = ggml_dot.gemv_quantized(raw, qt, k, xq), _tiled(raw, qt, k, xq)
    assert (_bits(ours) == _bits(ref)).all()


@needs_c
def test_extreme_codes_and_scales_stay_exact(level):
    """Every code at its largest, activations at +-127 (Q8_K's range), the largest scales: the int32 sums,
    the Q6_K offset of 128 and AVX2's int16 partial sums stay inside their ranges."""
    k, n = 1536, 20
    for qt in GEMM_TYPES:
        raw = random_rows(qt, n, k, seed=7).copy()
        blocks = raw.reshape(n, k // 256, -1)
        if qt in (QT.Q4_K, QT.Q5_K):
            blocks[:, :, 4:16] = 0xFF  # scales and mins 63
            blocks[:, :, 16:] = 0xFF  # codes 15 (Q5_K: 31)
        else:
            blocks[:, :, :192] = 0xFF  # codes 63
            blocks[:, :, 192:208] = np.array([0x80, 0x7F] * 8, np.uint8)  # scales -128, 127
        for sign in (1.0, -1.0):
            x = torch.full((9, k), sign * 3.0)
            x[1::2] *= -1
            xq = ggml_dot.quantize(x, qt)
            assert (_bits(ggml_dot.gemv_quantized(raw, qt, k, xq)) == _bits(_tiled(raw, qt, k, xq))).all()


@needs_c
def test_a_row_has_the_same_bits_in_any_prompt_chunk_and_decode_rows_keep_vec_dot(level):
    k = 1536
    parts = [(QT.Q4_K, torch.from_numpy(random_rows(QT.Q4_K, 48, k, seed=1))),
             (QT.Q6_K, torch.from_numpy(random_rows(QT.Q6_K, 40, k, seed=2)))]
    products = ggml_dot._Products(parts, k)  # the default mode: every row in vec_dot's order up to 8 rows
    x = torch.randn(131, k, generator=torch.Generator().manual_seed(3))
    full = products(x)
    for a, b in [(0, 9), (5, 64), (60, 131), (122, 131)]:
        assert torch.equal(products(x[a:b]), full[a:b])
    ggml_dot.gemm(False)
    try:  # the group's parts as the row functions compute them: the tiled order from 9 rows
        assert torch.equal(ggml_dot._Products(parts, k, row_invariant=False)(x), full)
    finally:
        ggml_dot.gemm(True)
    eight = products(x[:8])  # verification's most rows: each row its decode step's
    assert torch.equal(eight, torch.cat([products(x[i : i + 1]) for i in range(8)]))
    assert not torch.equal(eight, full[:8])  # (the two orders do differ)


@needs_c
@pytest.mark.parametrize("flag", ["1", "0"])
def test_switch_builds_the_layer_with_or_without_its_torch_copy(flag, monkeypatch, level):
    from tallow.kernels.cpu.linear import make_linear

    monkeypatch.setenv("TALLOW_CPU_GEMM", flag)
    k, n = 512, 64
    raw = random_rows(QT.Q4_K, n, k, seed=5)
    layer = make_linear(TensorInfo("w", QT.Q4_K, (k, n), 0, raw.nbytes, raw))
    assert layer.kind == "ggml_dot" and bool(layer.fallback) == (flag == "0")
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(6))
    y = layer(x)
    if flag == "1":
        assert torch.equal(y, torch.from_numpy(_tiled(raw, QT.Q4_K, k, ggml_dot.quantize(x, QT.Q4_K))))
    else:
        assert torch.equal(y, layer.fallback[0](x))


@needs_c
@pytest.mark.parametrize("qt", VEC_DOT_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("n, k", [(8, 32), (37, 576), (100, 640), (3, 64)])
@pytest.mark.parametrize("m", [8, 9, 13, 64, 131])
def test_gemm_of_32_value_blocks_is_vec_dots_order(qt, n, k, m, level):
    """Q4_1/Q5_0/Q8_0 rows: the one-row kernel's bits at any number of rows (decode steps and prompts alike);
    panels with a short last one (n % 8, and under 4 rows: the AVX2 tile's halves), tiles with a short last
    one (m % 4, m % 2)."""
    raw = random_rows(qt, n, k, seed=int(qt) * 1000 + n + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)) * 4
    x[0, :40] = 0.0
    xq = ggml_dot.quantize(x, qt)
    assert ggml_dot.gemm_takes(qt)
    ours = ggml_dot.gemv_quantized(raw, qt, k, xq)
    rows = np.concatenate([ggml_dot.gemv_quantized(raw, qt, k, xq[i : i + 1]) for i in range(m)])
    assert (_bits(ours) == _bits(rows)).all() and (_bits(ours) == _bits(_tiled(raw, qt, k, xq))).all()


@needs_c
@pytest.mark.parametrize("qt", VEC_DOT_TYPES, ids=lambda q: q.name)
def test_32_value_blocks_at_their_extreme_codes_stay_exact(qt, level):
    """The largest codes against activations at +-127: AVX2's int16 pair sums (maddubs) must not saturate
    (Q5_0's codes 31, Q4_1's 15, Q8_0's -128 and 127 through the sign trick)."""
    k, n, m = 640, 12, 10
    raw = random_rows(qt, n, k, seed=11).copy()
    blocks = raw.reshape(n, k // 32, -1)
    if qt == QT.Q8_0:
        blocks[0::2, :, 2:] = 0x80  # -128
        blocks[1::2, :, 2:] = 0x7F  # 127
    elif qt == QT.Q5_0:
        blocks[:, :, 2:] = 0xFF  # the high bits and nibbles: codes 31
    else:
        blocks[:, :, 4:] = 0xFF  # codes 15
    for sign in (1.0, -1.0):
        x = torch.full((m, k), sign * 3.0)
        x[1::2] *= -1
        xq = ggml_dot.quantize(x, qt)
        rows = np.concatenate([ggml_dot.gemv_quantized(raw, qt, k, xq[i : i + 1]) for i in range(m)])
        assert (_bits(ggml_dot.gemv_quantized(raw, qt, k, xq)) == _bits(rows)).all()


@needs_c
def test_the_declared_types_are_the_c_ones(level):
    """ggml_dot.GEMM_TYPES (in the weight cache's key) names exactly the types the product takes."""
    assert {qt for qt in QT if ggml_dot.gemm_takes(qt)} == set(ggml_dot.GEMM_TYPES)
    lib = ggml_dot._load()
    assert {qt for qt in QT if lib.tg_gemm_takes(int(qt))} == set(ggml_dot.GEMM_TYPES)
