"""CPU linear kernels against the fp32 reference.

Tolerances. All fast kinds feed the kernel bf16 activations and get bf16 outputs back: two bf16
roundings (bf16 keeps 8 significant bits, so each is at most 2^-8 relative, ~1.6e-3 RMS over a
spread of magnitudes). int4 adds the bf16 rounding of scale/zero (measured ~1.8e-3 RMS on the
weights), dense bf16 the rounding of every weight (~1.7e-3). In quadrature that is ~3e-3 of
norm-wise relative output error ||y - y_ref|| / ||y_ref||; we allow 1e-2 (observed: 2-4e-3).
int8 also requantizes each weight row; for random inputs the output error tracks the weight's
relative Frobenius error e_w (output ~ sqrt(3e-3^2 + e_w^2), observed); we add 1.5 e_w.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from tallow.errors import ModelFileError
from tallow.gguf_file import GGUFFile, TensorInfo
from tallow.kernels.cpu import linear as L
from tallow.kernels.cpu.linear import make_embedding, make_linear
from tallow.quant import pack
from tallow.quant.pack import (INT4_TYPES, INT4X2_TYPES, INT8_TYPES, int4_codes, int4x2_codes, pack_int4, repack_error,
                               unpack_int4_weight)
from tallow.quant.reference import dequantize

from test_quant_reference import random_rows

BF16_TOL = 1e-2
QUANT_TYPES = sorted(INT4_TYPES | INT8_TYPES)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TALLOW_INT4", "TALLOW_INT8", "TALLOW_REFERENCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "0")  # these are the torch layers' tests (the C kernel's: test_ggml_dot.py)


def fake_tensor(qtype: QT, n_out: int, n_in: int, seed: int = 0, name: str = "w") -> TensorInfo:
    raw = random_rows(qtype, n_out, n_in, seed)
    return TensorInfo(name, qtype, (n_in, n_out), 0, raw.nbytes, raw)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def tolerance(t: TensorInfo, kind: str) -> float:
    if kind == "int8":
        return BF16_TOL + 1.5 * repack_error(t.data, t.qtype, t.n_cols, "int8").rel_fro
    return BF16_TOL


# --- the tinygemm convention --------------------------------------------------------------

@pytest.mark.skipif(not pack.HAS_INT4_OPS, reason="no int4pack ops in this torch")
def test_tinygemm_dequant_convention() -> None:
    """w = (q - 8) * scale + zero, one (scale, zero) per 32 K-elements; checked in fp32, where the
    kernel is exact to float rounding (bf16 would hide small convention errors)."""
    g = torch.Generator().manual_seed(0)
    n, k = 32, 128
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    sz = torch.randn(k // 32, n, 2, generator=g)
    x = torch.randn(3, k, generator=g)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, sz)
    s = sz[..., 0].T.repeat_interleave(32, dim=1)  # (n, k)
    z = sz[..., 1].T.repeat_interleave(32, dim=1)
    w = (q.float() - 8) * s + z
    torch.testing.assert_close(y, x @ w.T, rtol=1e-5, atol=1e-5)


def _fold(t: torch.Tensor, k: int) -> torch.Tensor:
    """(N, K*parts) -> (N, K): add the int4x2 halves."""
    return t[:, :k] + t[:, k:] if t.shape[1] > k else t


@pytest.mark.parametrize("qtype", sorted(INT4_TYPES | INT4X2_TYPES), ids=lambda t: t.name)
def test_int4_codes_are_exact_and_only_scales_round(qtype: QT) -> None:
    raw = random_rows(qtype, 8, 512, seed=3)
    w_ref = dequantize(raw, qtype, 512)
    q, scale, zero = (int4_codes if qtype in INT4_TYPES else int4x2_codes)(raw, qtype, 512)
    assert int(q.min()) >= 0 and int(q.max()) <= 15
    s = scale.repeat_interleave(32, dim=1)
    z = zero.repeat_interleave(32, dim=1)
    # fp32 affine form reproduces the reference up to fp32 rounding of zero
    w_affine = _fold((q.float() - 8) * s + z, 512)
    torch.testing.assert_close(w_affine, w_ref, rtol=1e-6, atol=1e-6 * float(w_ref.abs().max()))
    # with bf16 scale/zero, each element moves by at most 2^-8 (|q-8| |scale| + |zero|) per part
    w4 = unpack_int4_weight(raw, qtype, 512)
    bound = _fold(2.0 ** -8 * ((q.float() - 8).abs() * s.abs() + z.abs()), 512) * (1 + 1e-6) + 1e-30
    assert bool(((w4 - w_ref).abs() <= bound).all())


@pytest.mark.parametrize("qtype", sorted(INT4X2_TYPES), ids=lambda t: t.name)
def test_int4x2_linear_matches_reference(qtype: QT, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opt-in exact-code path for 5- and 8-bit group-32 types: bf16-level error, not int8's."""
    t = fake_tensor(qtype, 40, 512, seed=int(qtype))
    monkeypatch.setenv("TALLOW_INT4X2", "1")
    fast, ref = make_linear(t), make_linear(t, mode="reference")
    assert fast.kind == "int4x2" and make_linear(t, mode="int4x2").kind == "int4x2"
    assert fast.nbytes == 48 * 512 + (2 * 512 // 32) * 48 * 2 * 2  # 1 byte/weight, rows padded to 48
    g = torch.Generator().manual_seed(2)
    for m in (1, 7, 64):
        x = torch.randn(m, 512, generator=g)
        assert rel_err(fast(x), ref(x)) < BF16_TOL, (qtype.name, m)


@pytest.mark.skipif(not pack.HAS_INT4_OPS, reason="no int4pack ops in this torch")
def test_int4_pack_chunked_and_padded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row-chunked packing (chunk = multiple of 64 rows) equals one-shot packing, and N that is
    not a multiple of 16 is padded with zero-weight rows."""
    raw = random_rows(QT.Q4_K, 64 * 3 + 20, 256, seed=5)  # N = 212: a partial tail, padded to 224
    whole = pack_int4(raw, QT.Q4_K, 256)
    monkeypatch.setattr(pack, "_PACK_ROWS", 64)
    monkeypatch.setattr(pack, "_CHUNK_ELEMENTS", 64 * 256)
    chunked = pack_int4(raw, QT.Q4_K, 256)
    assert whole.packed.shape == (224, 128) and whole.out_features == 212
    assert torch.equal(whole.packed, chunked.packed)
    assert torch.equal(whole.scales_and_zeros, chunked.scales_and_zeros)
    assert bool((whole.scales_and_zeros[:, 212:] == 0).all())


# --- every kind against the reference ------------------------------------------------------

@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_quantized_linear_matches_reference(qtype: QT) -> None:
    t = fake_tensor(qtype, 40, 512, seed=int(qtype))  # N = 40 also exercises int4 row padding
    bias = np.random.default_rng(1).standard_normal(40).astype(np.float32)
    fast = make_linear(t, bias)
    ref = make_linear(t, bias, mode="reference")
    want_kind = "int4" if qtype in INT4_TYPES else "int8"
    assert fast.kind == want_kind and ref.kind == "reference"
    assert (fast.in_features, fast.out_features) == (512, 40)
    tol = tolerance(t, fast.kind)
    g = torch.Generator().manual_seed(2)
    for m in (1, 7, 64):
        x = torch.randn(m, 512, generator=g)
        y = fast(x)
        assert y.dtype == torch.float32 and y.shape == (m, 40)
        assert rel_err(y, ref(x)) < tol, (qtype.name, m)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q5_1, QT.Q3_K, QT.Q8_0], ids=lambda t: t.name)
def test_dense_bf16_kind_matches_reference(qtype: QT) -> None:
    t = fake_tensor(qtype, 48, 256, seed=9)
    dense = make_linear(t, mode="dense")
    ref = make_linear(t, mode="reference")
    assert dense.kind == "dense_bf16"
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(0))
    assert rel_err(dense(x), ref(x)) < BF16_TOL


@pytest.mark.parametrize("qtype,kind", [(QT.F32, "dense_f32"), (QT.F16, "dense_f32"), (QT.BF16, "dense_bf16")],
                         ids=lambda v: getattr(v, "name", v))
def test_float_weights(qtype: QT, kind: str) -> None:
    t = fake_tensor(qtype, 24, 64, seed=4)
    lin, ref = make_linear(t), make_linear(t, mode="reference")
    assert lin.kind == kind
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))  # extra leading dims
    y = lin(x)
    assert y.shape == (2, 5, 24) and y.dtype == torch.float32
    if kind == "dense_f32":
        assert torch.equal(y, ref(x))  # same fp32 weights, same op
    else:
        assert rel_err(y, ref(x)) < BF16_TOL


def test_nbytes_reflect_the_packed_sizes() -> None:
    n, k = 64, 512
    assert make_linear(fake_tensor(QT.Q4_K, n, k)).nbytes == n * k // 2 + (k // 32) * n * 2 * 2
    assert make_linear(fake_tensor(QT.Q6_K, n, k)).nbytes == n * k + n * 2
    assert make_linear(fake_tensor(QT.Q6_K, n, k), mode="dense").nbytes == n * k * 2
    assert make_linear(fake_tensor(QT.Q6_K, n, k), mode="reference").nbytes == n * k * 4


# --- switches and fallbacks ----------------------------------------------------------------

def test_env_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    q4, q6, f32 = fake_tensor(QT.Q4_K, 32, 256), fake_tensor(QT.Q6_K, 32, 256), fake_tensor(QT.F32, 32, 256)
    monkeypatch.setenv("TALLOW_INT4", "0")
    assert (make_linear(q4).kind, make_linear(q6).kind) == ("dense_bf16", "int8")
    monkeypatch.setenv("TALLOW_INT8", "0")
    assert (make_linear(q4).kind, make_linear(q6).kind) == ("dense_bf16", "dense_bf16")
    monkeypatch.delenv("TALLOW_INT4")
    assert (make_linear(q4).kind, make_linear(q6).kind) == ("int4", "dense_bf16")
    monkeypatch.setenv("TALLOW_REFERENCE", "1")
    assert {make_linear(t).kind for t in (q4, q6, f32)} == {"reference"}
    monkeypatch.delenv("TALLOW_REFERENCE")
    assert make_linear(q4, mode="reference").kind == "reference"


def test_fallback_when_aten_ops_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(L, "HAS_INT4_OPS", False)
    monkeypatch.setattr(L, "HAS_INT8_OPS", False)
    q4, q8 = fake_tensor(QT.Q4_0, 32, 256), fake_tensor(QT.Q8_0, 32, 256)
    assert (make_linear(q4).kind, make_linear(q8).kind) == ("dense_bf16", "dense_bf16")


def test_bad_inputs_raise_clear_errors() -> None:
    t = fake_tensor(QT.Q4_0, 32, 64)
    with pytest.raises(ModelFileError, match="Bias"):
        make_linear(t, np.zeros(31, np.float32))
    one_d = TensorInfo("v", QT.F32, (64,), 0, 256, np.zeros((1, 256), np.uint8))
    with pytest.raises(ModelFileError, match="2-D"):
        make_linear(one_d)
    with pytest.raises(ValueError, match="mode"):
        make_linear(t, mode="fast")


# --- embeddings ----------------------------------------------------------------------------

def test_embedding_dequantizes_only_requested_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    t = fake_tensor(QT.Q6_K, 1000, 256, seed=11)
    emb = make_embedding(t)
    assert emb.nbytes == 0 and emb.embedding_dim == 256 and emb.num_embeddings == 1000
    seen: list[int] = []
    real = L.dequantize

    def spy(raw, qtype, n_cols):  # type: ignore[no-untyped-def]
        seen.append(raw.shape[0])
        return real(raw, qtype, n_cols)

    monkeypatch.setattr(L, "dequantize", spy)
    ids = torch.tensor([5, 999, 0, 5])
    out = emb(ids)
    assert seen == [4]
    assert torch.equal(out, dequantize(t.data, t.qtype, 256)[ids])
    with pytest.raises(IndexError, match="1000"):
        emb(torch.tensor([1000]))


# --- real model tensors --------------------------------------------------------------------

REAL = [
    ("smollm2-135m", "blk.0.attn_q.weight"),          # Q4_1
    ("gemma3-270m", "blk.0.attn_k.weight"),           # Q5_0
    ("gemma3-270m", "blk.0.attn_v.weight"),           # Q8_0
    ("gemma3-270m", "blk.0.ffn_down.weight"),         # Q6_K
    ("qwen2.5-coder-1.5b-instruct", "blk.0.attn_q.weight"),  # Q4_K
]


@pytest.mark.parametrize("model,name", REAL, ids=[f"{m.split('-')[0]}:{n}" for m, n in REAL])
def test_real_tensors(model: str, name: str) -> None:
    from model_paths import require_model  # wherever `tallow pull` put it; fails under TALLOW_REQUIRE_MODELS=1

    with GGUFFile(str(require_model(model))) as gf:
        t = gf.tensors[name]
        fast, ref = make_linear(t), make_linear(t, mode="reference")
        x = torch.randn(7, t.n_cols, generator=torch.Generator().manual_seed(0))
        assert rel_err(fast(x), ref(x)) < tolerance(t, fast.kind), fast.kind
        ids = torch.tensor([0, 17, t.n_rows - 1])
        assert torch.equal(make_embedding(t)(ids), ref.weight[ids])
