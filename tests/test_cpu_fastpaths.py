"""CPU fast paths against their references: fused linears (Q/K/V, gate/up) against the separate
layers and the fp32 ReferenceLinear, and the one-call elementwise forms in layers.py (RMSNorm,
table RoPE, fp16 GELU, single-query attention) against the step-by-step forms, on random
inputs of several shapes. Each fast path's switch (TALLOW_FUSE, TALLOW_FAST_LAYERS) is checked
to select the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from tallow.kernels.cpu import dequant_matmul
from tallow.kernels.cpu.fused_linear import FusedLinear
from tallow.families.tensors import OUTPUT
from tallow.kernels.cpu.linear import make_linear
from tallow.layers import (RotaryTables, attention, attention_mask, decode_attention, geglu, rms_norm,
                           rms_norm_reference)
from tallow.quant import pack

from test_cpu_linear import BF16_TOL, fake_tensor, rel_err, tolerance

SHAPES_M = (1, 3, 64)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TALLOW_INT4", "TALLOW_INT8", "TALLOW_REFERENCE", "TALLOW_INT4X2", "TALLOW_FUSE", "TALLOW_FAST_LAYERS",
                "TALLOW_PREFILL_DEQUANT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "0")  # the torch layers' fast paths (the C kernel's groups: test_ggml_dot.py)


# --- fused linears -------------------------------------------------------------------------

# (types of the parts, their N, K, expected runs after fusion)
FUSE_CASES = [
    ((QT.Q4_1, QT.Q4_1, QT.Q4_1), (192, 64, 64), 256, ["int4"]),                 # smollm2-like Q/K/V
    ((QT.Q4_K, QT.Q4_K, QT.Q6_K), (256, 64, 64), 256, ["int4", "int8"]),         # qwen2.5 with a Q6_K V
    ((QT.Q5_0, QT.Q5_0, QT.Q8_0), (128, 32, 32), 256, ["int8"]),                 # gemma3: int8 across types
    ((QT.Q4_0, QT.Q4_K), (64, 128), 256, ["int4"]),                              # int4 across types
    ((QT.Q4_0, QT.Q4_0, QT.Q4_0), (40, 64, 64), 256, ["int4", "int4"]),          # 40 rows: padded, can't lead
    ((QT.Q4_0, QT.Q4_0), (64, 40), 256, ["int4"]),                               # a padded last part can
    ((QT.F32, QT.F16), (24, 8), 64, ["dense_f32"]),
]


def _parts(types, sizes, k, bias: bool, mode=None):
    tensors = [fake_tensor(qt, n, k, seed=10 + i, name=f"w{i}") for i, (qt, n) in enumerate(zip(types, sizes))]
    rng = np.random.default_rng(5)
    biases = [rng.standard_normal(n).astype(np.float32) if bias and i != 1 else None for i, n in enumerate(sizes)]
    return tensors, biases, [make_linear(t, b, mode=mode) for t, b in zip(tensors, biases)]


@pytest.mark.skipif(not (pack.HAS_INT4_OPS and pack.HAS_INT8_OPS), reason="no int4/int8 pack ops in this torch")
@pytest.mark.parametrize("types,sizes,k,runs", FUSE_CASES, ids=lambda v: "-".join(getattr(t, "name", str(t)) for t in v)
                         if isinstance(v, tuple) else str(v))
@pytest.mark.parametrize("bias", [False, True])
def test_fused_linear_equals_separate_layers(types, sizes, k, runs, bias, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stacking weights changes no number: each output row runs the same kernel over the same K.
    (The prefill dequant path is off here: a dense GEMM may block a taller matrix differently.)"""
    monkeypatch.setenv("TALLOW_PREFILL_DEQUANT", "0")
    tensors, biases, separate = _parts(types, sizes, k, bias)
    fused = FusedLinear(_parts(types, sizes, k, bias)[2])
    assert [r.kind for r in fused.runs] == runs
    assert (fused.in_features, fused.out_features) == (k, sum(sizes)) and fused.part_sizes == list(sizes)
    g = torch.Generator().manual_seed(1)
    for m in SHAPES_M:
        x = torch.randn(m, k, generator=g)
        want = torch.cat([lin(x) for lin in separate], dim=-1)
        got = fused(x)
        assert got.dtype == torch.float32 and got.shape == (m, sum(sizes))
        if runs == ["dense_f32"]:  # BLAS sgemm blocks over N, so a taller weight may round differently
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(got, want), (m, float((got - want).abs().max()))
    x3 = torch.randn(2, 5, k, generator=g)  # leading dims pass through
    torch.testing.assert_close(fused(x3), torch.cat([lin(x3) for lin in separate], dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not (pack.HAS_INT4_OPS and pack.HAS_INT8_OPS), reason="no int4/int8 pack ops in this torch")
@pytest.mark.parametrize("types,sizes,k,runs", FUSE_CASES[:4], ids=["llama", "qwen2", "gemma3", "int4-mixed"])
def test_fused_linear_matches_fp32_reference(types, sizes, k, runs) -> None:
    tensors, biases, _ = _parts(types, sizes, k, bias=True)
    fused = FusedLinear([make_linear(t, b) for t, b in zip(tensors, biases)])
    ref = FusedLinear([make_linear(t, b, mode="reference") for t, b in zip(tensors, biases)])
    assert ref.kind == "reference"
    g = torch.Generator().manual_seed(3)
    for m in SHAPES_M:
        x = torch.randn(m, k, generator=g)
        y, y_ref = fused(x), ref(x)
        col = 0
        for t, n in zip(tensors, sizes):  # each part within its own kind's tolerance
            kind = "int4" if t.qtype in pack.INT4_TYPES else "int8"
            assert rel_err(y[:, col:col + n], y_ref[:, col:col + n]) < tolerance(t, kind), (t.qtype.name, m)
            col += n


# --- the prefill path: dequantized tiles + dense GEMM ----------------------------------------

def test_tinygemm_packed_layout_dequantizes_exactly() -> None:
    """int4_weight_t reads the packer's layout: row 64b+d in the low nibble, 64b+32+d in the high."""
    g = torch.Generator().manual_seed(0)
    n, k = 192, 128
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    sz = (torch.randn(k // 32, n, 2, generator=g)).to(torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    s = sz[..., 0].float().T.repeat_interleave(32, dim=1)
    z = sz[..., 1].float().T.repeat_interleave(32, dim=1)
    want = ((q.float() - 8) * s + z).to(torch.bfloat16)  # fp32 math, one rounding
    assert torch.equal(dequant_matmul.int4_weight_t(packed, sz).T, want)
    assert torch.equal(dequant_matmul.int4_weight_t(packed, sz, rows=(64, 192)).T, want[64:])


@pytest.mark.skipif(not (pack.HAS_INT4_OPS and pack.HAS_INT8_OPS), reason="no int4/int8 pack ops in this torch")
@pytest.mark.parametrize("qtype,mode,n", [(QT.Q4_K, None, 192), (QT.Q4_0, None, 64), (QT.Q8_0, "int4x2", 128),
                                          (QT.Q6_K, None, 200), (QT.Q6_K, "int8g", 128), (QT.Q5_0, None, 64)])
def test_prefill_dequant_path_matches_kernel_and_reference(qtype, mode, n, monkeypatch: pytest.MonkeyPatch) -> None:
    t = fake_tensor(qtype, n, 512, seed=7)
    lin, ref = make_linear(t, mode=mode), make_linear(t, mode="reference")
    g = torch.Generator().manual_seed(4)
    for m in (dequant_matmul.MIN_ROWS, 100):
        x = torch.randn(m, 512, generator=g)
        monkeypatch.setenv("TALLOW_PREFILL_DEQUANT", "0")
        kernel = lin(x)
        monkeypatch.delenv("TALLOW_PREFILL_DEQUANT")
        y = lin(x)
        assert not torch.equal(y, kernel) or lin.kind == "int8", lin.kind  # the dense path did run
        # weights rounded to bf16 once more: within the bf16 tolerance of the kernel and of the reference
        assert rel_err(y, kernel) < BF16_TOL and rel_err(y, ref(x)) < tolerance(t, lin.kind)


def test_prefill_dequant_tiles_large_matrices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight larger than the scratch budget runs in row tiles, with the same result."""
    t = fake_tensor(QT.Q4_K, 320, 256, seed=8)
    lin = make_linear(t)
    x = torch.randn(70, 256, generator=torch.Generator().manual_seed(0))
    whole = lin(x)
    monkeypatch.setattr(dequant_matmul, "SCRATCH_ELEMENTS", 128 * 256)
    tiled = lin(x)
    assert torch.equal(tiled, whole)
    q6 = make_linear(fake_tensor(QT.Q6_K, 320, 256, seed=9))
    monkeypatch.setattr(dequant_matmul, "SCRATCH_ELEMENTS", 1 << 23)
    whole = q6(x)
    monkeypatch.setattr(dequant_matmul, "SCRATCH_ELEMENTS", 128 * 256)
    torch.testing.assert_close(q6(x), whole, rtol=0, atol=0)


@pytest.mark.parametrize("qtype,mode", [(QT.Q4_K, None), (QT.Q6_K, "int8g"), (QT.BF16, None)])
def test_bf16_products_widened_to_fp32(qtype, mode, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the CPU has no native bf16 GEMM the bf16 operands are widened to fp32 (TALLOW_BF16_WIDEN):
    exact products summed in fp32, so within one bf16 rounding of the fp64 product of the same bf16
    operands, like torch's bf16 fallback; tiled (a weight larger than the scratch) with the same bits."""
    monkeypatch.setattr(dequant_matmul, "_NATIVE_BF16_GEMM", False)
    a = torch.randn(70, 96, generator=torch.Generator().manual_seed(1)).bfloat16()
    b = torch.randn(96, 130, generator=torch.Generator().manual_seed(2)).bfloat16()
    exact = (a.double() @ b.double())
    for widen in ("1", "0"):
        monkeypatch.setenv("TALLOW_BF16_WIDEN", widen)
        for got in (dequant_matmul.bf16_mm(a, b), dequant_matmul.bf16_linear(a, b.t().contiguous())):
            assert got.dtype == torch.bfloat16
            assert ((got.double() - exact).abs() <= exact.abs() * 2.0 ** -8 + 1e-6).all(), widen
    monkeypatch.delenv("TALLOW_BF16_WIDEN")
    assert dequant_matmul.widens_bf16()
    lin = make_linear(fake_tensor(qtype, 320, 256, seed=8), mode=mode)
    x = torch.randn(70, 256, generator=torch.Generator().manual_seed(0))
    whole = lin(x)
    monkeypatch.setattr(dequant_matmul, "SCRATCH_ELEMENTS", 3 * 128 * 256)  # widened: tiles of 128 rows
    assert torch.equal(lin(x), whole), lin.kind
    monkeypatch.setenv("TALLOW_BF16_WIDEN", "0")
    assert rel_err(lin(x), whole) < BF16_TOL, lin.kind


def test_fuse_switch_keeps_parts_separate(monkeypatch: pytest.MonkeyPatch) -> None:
    types, sizes, k = (QT.Q4_1, QT.Q4_1, QT.Q4_1), (192, 64, 64), 256
    monkeypatch.setenv("TALLOW_FUSE", "0")
    fused = FusedLinear(_parts(types, sizes, k, bias=True)[2])
    assert len(fused.runs) == 3
    monkeypatch.delenv("TALLOW_FUSE")
    on = FusedLinear(_parts(types, sizes, k, bias=True)[2])
    assert len(on.runs) == 1
    # The same weights; the stacked bias fills the bias-less part with 0, and the unfused runs also
    # hold their biases stacked once more for a single add (_bias_all).
    assert on.nbytes + fused._bias_all.nbytes == fused.nbytes + 64 * 4
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(0))
    assert torch.equal(on(x), fused(x))


def test_fused_linear_rejects_mismatched_inputs() -> None:
    a = make_linear(fake_tensor(QT.F32, 8, 64))
    b = make_linear(fake_tensor(QT.F32, 8, 32))
    with pytest.raises(ValueError, match="input size"):
        FusedLinear([a, b])


# --- elementwise fast paths ----------------------------------------------------------------

@pytest.mark.parametrize("shape,wshape", [((1, 576), (576,)), ((33, 1536), (1536,)), ((4, 14, 128), (14, 128)),
                                          ((1, 5, 256), (256,))])
def test_rms_norm_is_bit_identical(shape, wshape, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's fused form (the C norm, in ggml's arithmetic, is tests/test_c_norm.py's)."""
    monkeypatch.setenv("TALLOW_CPU_C_NORM", "0")
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(shape, generator=g) * 5, torch.randn(wshape, generator=g)
    want = rms_norm_reference(x, w, 1e-6)
    assert torch.equal(rms_norm(x, w, 1e-6), want)
    monkeypatch.setenv("TALLOW_FAST_LAYERS", "0")
    assert torch.equal(rms_norm(x, w, 1e-6), want)


@pytest.mark.parametrize("style", ["neox", "norm"])
@pytest.mark.parametrize("rope_dim,head_dim", [(64, 64), (128, 128), (32, 64)])
@pytest.mark.parametrize("n,start", [(1, 0), (1, 300), (7, 13), (64, 100)])
def test_rope_tables_are_bit_identical(style, rope_dim, head_dim, n, start) -> None:
    rope = RotaryTables(rope_dim, 10000.0, style)
    rope.ensure(start + n)
    g = torch.Generator().manual_seed(n + start)
    # a strided view, as the model passes Q and K heads out of the fused Q/K/V output
    qkv = torch.randn(n, 7 * head_dim + 40, generator=g)
    x = qkv[:, : 6 * head_dim].view(n, 6, head_dim)
    want = rope.apply(x, torch.arange(start, start + n))
    got = rope.apply_at(x, start)
    assert got.shape == want.shape and torch.equal(got, want)


def test_rope_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    rope = RotaryTables(64, 10000.0, "neox")
    rope.ensure(10)
    x = torch.randn(3, 4, 64)
    monkeypatch.setenv("TALLOW_FAST_LAYERS", "0")
    assert torch.equal(rope.apply_at(x, 5), rope.apply(x, torch.arange(5, 8)))


def test_geglu_fp16_gelu_is_bit_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every finite fp16 input: torch's fp16 GELU equals fp32 GELU rounded to fp16."""
    h = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    gate = h[torch.isfinite(h)].float()
    up = torch.randn(gate.shape, generator=torch.Generator().manual_seed(0))
    fast = geglu(gate, up)
    monkeypatch.setenv("TALLOW_FAST_LAYERS", "0")
    assert torch.equal(fast, geglu(gate, up))


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("n_heads,n_kv,head_dim,end,window,softcap", [
    (9, 3, 64, 1, None, None),
    (9, 3, 64, 200, None, None),
    (12, 2, 128, 77, None, None),
    (4, 1, 256, 600, 512, None),    # gemma3 sliding window, past the window edge
    (4, 1, 256, 300, 512, None),    # inside the window
    (4, 2, 32, 50, 8, 50.0),        # window and softcap together
])
def test_decode_attention_matches_masked_attention(kv_dtype, n_heads, n_kv, head_dim, end, window, softcap) -> None:
    g = torch.Generator().manual_seed(end)
    n_ctx = end + 16
    k_cache = torch.randn(n_kv, n_ctx, head_dim, generator=g).to(kv_dtype)
    v_cache = torch.randn(n_kv, n_ctx, head_dim, generator=g).to(kv_dtype)
    q = torch.randn(1, n_heads, head_dim, generator=g)
    scale = head_dim ** -0.5
    mask = attention_mask(torch.tensor([end - 1]), end, window)
    want = attention(q.transpose(0, 1), k_cache[:, :end].float(), v_cache[:, :end].float(), mask, scale, softcap)
    got = decode_attention(q, k_cache, v_cache, end, scale, window, softcap)
    assert got.shape == want.shape == (1, n_heads * head_dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# --- whole models --------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_tiny_model_fast_paths_match_reference_paths(arch, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny random Q4_0 model: logits bit-identical with and without the fused products and the
    elementwise fast paths, prefill and decode (gemma3's sliding window: within float rounding)."""
    from tiny_models import write_tiny_model

    from tallow.gguf_file import GGUFFile
    from tallow.memory.kv_pool import KVPool
    from tallow.models import build_model
    from tallow.spec import spec_from_gguf

    path = write_tiny_model(arch, tmp_path / f"tiny-{arch}.gguf", qtype=QT.Q4_0)
    ids = [3, 70, 101, 256, 257, 9, 44, 200, 17, 5, 88, 120]
    monkeypatch.setenv("TALLOW_CPU_C_NORM", "0")  # the C forms sum in other orders: test_c_norm.py,
    monkeypatch.setenv("TALLOW_CPU_C_ATTENTION", "0")  # test_c_attention.py hold them to their references

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        gf = GGUFFile(path)
        spec = spec_from_gguf(gf)
        model = build_model(gf, spec)
        kv = KVPool(spec, 64)
        batch = model.forward(ids[:8], 0, kv, all_logits=True)
        steps = torch.cat([model.forward([t], 8 + i, kv) for i, t in enumerate(ids[8:])])
        return batch, steps

    fast_batch, fast_steps = run()
    monkeypatch.setenv("TALLOW_FUSE", "0")
    monkeypatch.setenv("TALLOW_FAST_LAYERS", "0")
    ref_batch, ref_steps = run()
    assert torch.equal(fast_batch, ref_batch)
    if arch == "gemma3":  # past its 8-key window the fast path reads only the window, not a mask
        torch.testing.assert_close(fast_steps, ref_steps, rtol=0, atol=1e-4)
    else:
        assert torch.equal(fast_steps, ref_steps)


# --- the output projection's group-32 forms ---------------------------------------------------

@pytest.mark.skipif(not pack.HAS_INT4_OPS, reason="no int4pack ops in this torch")
@pytest.mark.parametrize("qtype,k,want", [(QT.Q6_K, 1024, "int8g"), (QT.Q8_0, 1024, "int4x2"), (QT.Q6_K, 512, "int8"),
                                          (QT.Q4_K, 1024, "int4")])
def test_output_projection_kind(qtype, k, want, monkeypatch: pytest.MonkeyPatch) -> None:
    t = fake_tensor(qtype, 48, k, seed=2, name="output.weight")
    lin, ref = make_linear(t, role=OUTPUT), make_linear(t, mode="reference")
    assert lin.kind == want
    # The role decides, not the name: the same tensor as any other matrix keeps per-row forms.
    assert make_linear(t).kind in ("int8", "int4")
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(0))
    assert rel_err(lin(x), ref(x)) < tolerance(t, lin.kind)
    monkeypatch.setenv("TALLOW_OUTPUT_INT8G", "0")
    assert make_linear(t, role=OUTPUT).kind == ("int4" if qtype == QT.Q4_K else "int8")


@pytest.mark.skipif(not pack.HAS_INT4_OPS, reason="no int4pack ops in this torch")
@pytest.mark.parametrize("qtype", [QT.Q6_K, QT.Q3_K, QT.Q2_K], ids=lambda t: t.name)
def test_group_int8_is_more_exact_than_per_row_int8(qtype) -> None:
    """Group-32 scales follow the data: less weight error than one scale per row, and the kernel
    adds no rounding beyond the int8 codes (bf16 scale fitted before the codes)."""
    from tallow.kernels.cpu.linear import group_int8_codes
    from tallow.quant.pack import _requant_int8
    from tallow.quant.reference import dequantize

    t = fake_tensor(qtype, 64, 512, seed=4)
    w = dequantize(t.data, qtype, 512)
    q, scale, zero = group_int8_codes(w)
    s, z = scale.repeat_interleave(32, dim=1), zero.repeat_interleave(32, dim=1)
    wg = ((q.float() - 8) * s + z)
    wg = wg[:, :512] + wg[:, 512:]
    assert torch.equal(scale.to(torch.bfloat16).float(), scale) and torch.equal(zero.to(torch.bfloat16).float(), zero)
    assert bool(((wg - w).abs() <= scale[:, :16].repeat_interleave(32, dim=1) / 2 * (1 + 1e-6)).all())
    q8, s8 = _requant_int8(w)
    err_row = float((q8.float() * s8.float()[:, None] - w).norm() / w.norm())
    err_group = float((wg - w).norm() / w.norm())
    assert err_group < err_row
