"""TALLOW_NUMERICS=ggml against ggml itself, op by op.

tests/fixtures/ggml_ops.json holds libggml-cpu's (b11434, this machine class) own outputs on
random blocks (scripts/make_ggml_op_fixtures.py): its activation quantization (bytes) and its
vec_dot per weight row. Activation quantization must be bit-identical; the dot products
equal up to float32 addition order (ggml sums in SIMD lanes, we in a GEMM). The elementwise
ops are checked against plain numpy transcriptions of the ggml loops and, bit for bit, against
llama.cpp b11434's own tensors of one layer of smollm2 and gemma3 (tests/fixtures/ggml_layer_ops.json,
scripts/numerics_op_fixtures.py).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from tallow.kernels.cpu.ggml_linear import GgmlLinear, block_mins
from tallow.kernels.cpu.q8_activations import (VEC_DOT_TYPE, quantize_q8_0, quantize_q8_1, quantize_q8_k,
                                               round_activations)
from tallow.numerics import ggml_attention, ggml_rms_norm, ggml_rope_angles
from tallow.quant.reference import dequantize

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "ggml_ops.json").read_text())
K, N = FIXTURE["K"], FIXTURE["N"]
X = np.frombuffer(base64.b64decode(FIXTURE["x"]), np.float32)
CASES = {c["weight_type"]: c for c in FIXTURE["cases"]}
# ggml's lane-wise float sums against one GEMM: measured max 4e-7 of the largest |dot|.
DOT_REL_TOL = 2e-6


def _bytes(case: dict, key: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(case[key]), np.uint8)


@pytest.mark.parametrize("name", sorted(CASES))
def test_vec_dot_type_table_is_ggmls(name):
    assert VEC_DOT_TYPE[QT[name]].name == CASES[name]["vec_dot_type"]


@pytest.mark.parametrize("vt", ["Q8_0", "Q8_1", "Q8_K"])
def test_activation_quantization_is_bit_identical(vt):
    case = next(c for c in FIXTURE["cases"] if c["vec_dot_type"] == vt)
    blocks = _bytes(case, "x_quantized").reshape(-1, {"Q8_0": 34, "Q8_1": 36, "Q8_K": 292}[vt])  # ggml's block sizes
    x = torch.from_numpy(X.copy())
    if vt == "Q8_K":
        codes, d = quantize_q8_k(x)
        ref_d = blocks[:, :4].copy().view(np.float32).ravel()
        ref_codes = blocks[:, 4:260].copy().view(np.int8)
        bsums = blocks[:, 260:292].copy().view(np.int16)
        assert np.array_equal(codes.reshape(-1, 16, 16).sum(-1).numpy(), bsums)
    else:
        if vt == "Q8_0":
            codes, d = quantize_q8_0(x)
            qs = blocks[:, 2:34]
        else:
            codes, d, s = quantize_q8_1(x)
            qs = blocks[:, 4:36]
            assert np.array_equal(s.numpy(), blocks[:, 2:4].copy().view(np.float16).astype(np.float32).ravel())
        ref_d = blocks[:, :2].copy().view(np.float16).astype(np.float32).ravel()
        ref_codes = qs.copy().view(np.int8)
    assert np.array_equal(d.numpy(), ref_d)
    assert np.array_equal(codes.numpy().astype(np.int8), ref_codes)


def _ours(case: dict, with_sum_correction: bool = True) -> np.ndarray:
    qt = QT[case["weight_type"]]
    raw = _bytes(case, "weight").reshape(N, -1)
    x_hat, corr = round_activations(torch.from_numpy(X.copy())[None], qt)
    y = F.linear(x_hat, dequantize(raw, qt, K))
    if corr is not None and with_sum_correction:
        y = y + F.linear(corr, block_mins(raw, qt, K))
    return y[0].numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_block_dot_products_match_ggml(name):
    case = CASES[name]
    ref = np.array(case["dots"], np.float32)
    err = np.abs(_ours(case) - ref).max() / np.abs(ref).max()
    assert err < DOT_REL_TOL, f"{name}: max error {err:.2e} of the largest |dot|"


@pytest.mark.parametrize("name", ["Q4_1", "Q5_1"])
def test_q8_1_block_sums_matter(name):
    """Without the fp16 block sum s (only d * sum(codes)) the Q8_1 pairs miss ggml's value:
    the correction is what makes them match (and this test shows the comparison can fail)."""
    case = CASES[name]
    ref = np.array(case["dots"], np.float32)
    # measured: 1.9e-5 (Q4_1) and 2.7e-5 (Q5_1) without it, 4e-7 and 1e-6 with it
    assert np.abs(_ours(case, with_sum_correction=False) - ref).max() / np.abs(ref).max() > 5 * DOT_REL_TOL


def test_ggml_linear_is_the_op(monkeypatch):
    """GgmlLinear (what make_linear builds under TALLOW_NUMERICS=ggml) computes the checked op."""
    from tallow.gguf_file import TensorInfo
    from tallow.kernels.cpu.linear import make_linear

    case = CASES["Q4_1"]
    raw = _bytes(case, "weight").reshape(N, -1)
    info = TensorInfo("blk.0.ffn_up.weight", QT.Q4_1, (K, N), 0, raw.size, raw)
    monkeypatch.setenv("TALLOW_NUMERICS", "ggml")
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "0")  # the fp32 layer; the C kernel's own checks: test_ggml_dot.py
    layer = make_linear(info)
    assert isinstance(layer, GgmlLinear)
    y = layer(torch.from_numpy(X.copy())[None])[0].numpy()
    assert np.array_equal(y, _ours(case))


def test_rms_norm_is_ggmls_loop():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 576)) * 5).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    eps = np.float32(1e-5)
    ref = np.empty_like(x)
    for r in range(3):  # ggml_compute_forward_rms_norm_f32, then ggml_mul by the weight
        total = 0.0  # ggml_float (double)
        for v in x[r]:
            total += float(np.float32(v * v))
        mean = np.float32(total / x.shape[1])
        scale = np.float32(1.0) / np.sqrt(np.float32(mean + eps))
        ref[r] = (x[r] * scale) * w
    assert np.array_equal(ggml_rms_norm(torch.from_numpy(x), torch.from_numpy(w), 1e-5).numpy(), ref)


def test_rope_angles_are_ggmls_recurrence():
    base, dims = 100000.0, 64
    theta_scale = np.float32(base) ** (np.float32(-2.0) / np.float32(dims))
    ours = ggml_rope_angles(300, dims, base).numpy()
    for p in (0, 1, 17, 299):
        theta, ref = np.float32(p), []
        for _ in range(dims // 2):  # ggml_rope_cache_init
            ref.append(theta)
            theta = np.float32(theta * theta_scale)
        assert np.array_equal(ours[p], np.array(ref, np.float32))
    exact = np.outer(np.arange(300), base ** (-np.arange(0, dims, 2) / dims))
    assert np.abs(ours - exact).max() > 1e-5  # the recurrence's own error, which llama.cpp has too


def test_attention_rounds_where_ggml_does():
    """Flash attention off: Q, K, V and the softmax weights in f16, sums in float."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((4, 3, 16)).astype(np.float32) * 3
    k = rng.standard_normal((2, 7, 16)).astype(np.float32)
    v = rng.standard_normal((2, 7, 16)).astype(np.float32)
    mask = np.tril(np.ones((3, 7), bool), k=4)
    out = ggml_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(mask), 0.25)
    ref = np.zeros((3, 4 * 16), np.float32)
    f16 = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    for h in range(4):
        kv = h // 2
        for i in range(3):
            s = (f16(k[kv]).astype(np.float64) @ f16(q[h, i]).astype(np.float64)).astype(np.float32) * np.float32(0.25)
            s = np.where(mask[i], s, -np.inf)
            e = np.exp(s - s.max()).astype(np.float32)
            p = f16(e * np.float32(1.0 / e.astype(np.float64).sum()))
            ref[i, h * 16 : (h + 1) * 16] = p.astype(np.float64) @ f16(v[kv]).astype(np.float64)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=2e-6)


# The whole ggml path on the real smollm2, teacher-forced over the first 64 tokens of the
# conformance text. Every elementwise op is llama.cpp's bit for bit (the tests below), the
# quantized products are not (ggml sums their blocks in another order), and the forward pass is
# chaotic at one ulp, so the logits differ by llama.cpp's own noise: measured floors, not zero.
GGML_PATH_TOKENS = 64
GGML_PATH_TOP1_MIN = 0.95  # measured 0.968 (61 of 63), max |Δ| 0.574 (AMD EPYC of sessions 1-9, 2 threads)
# 0.65 until session 10, whose Intel Xeon (Sapphire Rapids) gave 0.736-0.869 with the same code (its fp32
# GEMMs sum in another order; top-1 1.0 there): the bound covers both CPUs. The exact path is the test below.
GGML_PATH_MAX_DELTA = 0.9


def test_smollm2_ggml_path_against_llama_cpp(monkeypatch):
    from model_paths import require_model

    import tallow

    path = require_model("smollm2-135m")
    monkeypatch.setenv("TALLOW_NUMERICS", "ggml")
    # The fp32 GgmlLinear, where this was measured. With the C kernel (bit-identical products, the
    # default under TALLOW_NUMERICS=ggml) this prompt parts from llama.cpp at step 14, gap 0.190,
    # at the same teacher-forced top-1 (0.955): the chaos docs/performance.md measures.
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "0")
    llm = tallow.LLM(path, ctx=256)
    assert {p.kind for layer in llm.model.layers for p in [layer.attn_output, layer.ffn_down]} == {"ggml"}
    tf = json.loads((Path(__file__).parent / "fixtures" / "conformance_smollm2-135m.json").read_text())["teacher_forced"]
    ids = tf["ids"][:GGML_PATH_TOKENS]
    llm.engine.reset()
    ours = llm.model.forward(ids, 0, llm.engine.kv, all_logits=True)[1:]
    top_ids = torch.tensor(tf["top_ids"][1:GGML_PATH_TOKENS])
    ref = torch.tensor(tf["top_logits"][1:GGML_PATH_TOKENS])
    agree = (ours.argmax(-1) == top_ids[:, 0]).float().mean().item()
    delta = (ours.gather(1, top_ids) - ref).abs().max().item()
    print(f"\nsmollm2 TALLOW_NUMERICS=ggml, {len(ids) - 1} positions: top-1 {agree:.4f}, max |Δlogit| {delta:.3f}")
    assert agree >= GGML_PATH_TOP1_MIN and delta <= GGML_PATH_MAX_DELTA


EXACT_TOKENS = 64


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_ggml_path_with_the_c_kernel_equals_llama_cpp(model, monkeypatch):
    """The CPU default for these files, llama.cpp's numerics with the C kernel (numerics_choice.py):
    teacher-forced logits equal to llama.cpp b11434's in the fixtures' configuration (repacking off), bit for bit, over 64 tokens of
    the conformance text: every product in vec_dot's or, for 8+ prompt rows, the tiled K-quant order.
    (The fixtures of smollm2 and gemma3 come from that configuration; qwen2.5's does not, so it is
    checked against llama.cpp itself by scripts/numerics_conformance.py --live.)"""
    from model_paths import require_model

    import tallow
    from tallow.kernels.cpu import ggml_dot

    if not ggml_dot.usable():
        pytest.skip(f"C kernel: {ggml_dot.status()}")
    path = require_model(model)
    monkeypatch.delenv("TALLOW_NUMERICS", raising=False)
    monkeypatch.delenv("TALLOW_CPU_GGML_DOT", raising=False)
    llm = tallow.LLM(path, ctx=256)
    assert llm.model.numerics == "ggml"
    assert {p.kind for layer in llm.model.layers for p in [layer.attn_output, layer.ffn_down]} == {"ggml_dot"}
    tf = json.loads((Path(__file__).parent / "fixtures" / f"conformance_{model}.json").read_text())["teacher_forced"]
    ids = tf["ids"][:EXACT_TOKENS]
    llm.engine.reset()
    ours = llm.model.forward(ids, 0, llm.engine.kv, all_logits=True)
    top_ids = torch.tensor(tf["top_ids"][:EXACT_TOKENS])
    ref = torch.tensor(tf["top_logits"][:EXACT_TOKENS])
    got = ours.gather(1, top_ids)
    assert torch.equal(ours.argmax(-1), top_ids[:, 0])
    # the fixture holds llama.cpp's float32 logits rounded as make_fixtures.py rounds them (float32 .round(5))
    assert got.numpy().astype(np.float32).round(5).tolist() == tf["top_logits"][:EXACT_TOKENS], \
        f"max |Δ| {(got - ref).abs().max():.3e}"


# llama.cpp b11434's own tensors of layer 0 (scripts/numerics_op_fixtures.py: smollm2 and gemma3,
# 6 tokens, cropped); each TALLOW_NUMERICS=ggml op fed llama.cpp's input must give its output
# bit for bit.
LAYER_OPS = json.loads((Path(__file__).parent / "fixtures" / "ggml_layer_ops.json").read_text())
LAYER_CASES = {c["model"]: c for c in LAYER_OPS["cases"]}


def _t(packed: dict) -> torch.Tensor:
    a = np.frombuffer(base64.b64decode(packed["f32"]), np.float32).reshape(packed["shape"])
    return torch.from_numpy(a.copy())


def _bits_equal(ours: torch.Tensor, ref: torch.Tensor) -> None:
    same = ours == ref
    assert bool(same.all()), f"{int((~same).sum())} of {same.numel()} differ, max |d| {(ours - ref).abs().max():.3e}"


@pytest.fixture
def ggml_mode(monkeypatch):
    monkeypatch.setenv("TALLOW_NUMERICS", "ggml")


@pytest.mark.parametrize("model", sorted(LAYER_CASES))
def test_layer_norms_are_llama_cpps_bits(model, ggml_mode):
    from tallow.layers import rms_norm

    c = LAYER_CASES[model]
    op = c["rms_norm"]
    _bits_equal(rms_norm(_t(op["x"]), _t(op["weight"]), c["eps"]), _t(op["out"]))
    if "qk_norm" in c:  # gemma3's per-head Q norm
        op = c["qk_norm"]
        _bits_equal(rms_norm(_t(op["x"]), _t(op["weight"]), c["eps"]), _t(op["out"]))


@pytest.mark.parametrize("model", sorted(LAYER_CASES))
def test_rope_is_llama_cpps_bits(model, ggml_mode):
    from tallow.layers import RotaryTables

    c = LAYER_CASES[model]
    table = RotaryTables(c["head_dim"], c["rope_base"], c["rope_style"])
    table.ensure(8)
    x = _t(c["rope"]["x"])
    _bits_equal(table.apply_at(x, 0), _t(c["rope"]["out"]))


@pytest.mark.parametrize("step", ["attention", "attention_decode"])
@pytest.mark.parametrize("model", sorted(LAYER_CASES))
def test_attention_is_llama_cpps_bits(model, step):
    """KQ, softmax (ggml_v_expf, block sums in double) and KQV, each from llama.cpp's own input,
    then the whole of ggml_attention from Q, K, V: over the prompt (llamafile's F16 lane order)
    and in a one-token decode step after it (ggml_vec_dot_f16's order)."""
    from tallow.numerics import ggml_attention, ggml_dot_f16, ggml_softmax

    c = LAYER_CASES[model]
    a = c[step]
    start = a.get("start", 0)
    q, k, v = _t(a["q"]), _t(a["k"]), _t(a["v"])  # (group, n, hd), (1, keys, hd), (1, hd, keys)
    group, n = q.shape[0], q.shape[1]
    _bits_equal(ggml_dot_f16(q, k.expand(group, -1, -1)), _t(a["kq"]))
    mask = torch.arange(k.shape[1])[None, :] <= torch.arange(start, start + n)[:, None]
    scale = 1.0 if c["prescaled_q"] else c["attn_scale"]
    _bits_equal(ggml_softmax((_t(a["kq"]) * scale).masked_fill(~mask, float("-inf"))), _t(a["kq_soft_max"]))
    _bits_equal(ggml_dot_f16(_t(a["kq_soft_max"]), v.expand(group, -1, -1)), _t(a["kqv"]))
    end = start + n
    whole = ggml_attention(q, k[:, :end], v[:, :, :end].transpose(1, 2), mask[:, :end], scale)
    _bits_equal(whole, _t(a["kqv"]).transpose(0, 1).reshape(n, -1))


@pytest.mark.parametrize("model", sorted(LAYER_CASES))
def test_glu_is_llama_cpps_bits(model, ggml_mode):
    from tallow.layers import geglu, swiglu

    c = LAYER_CASES[model]
    op = c["glu_op"]
    _bits_equal((geglu if c["glu"] == "geglu" else swiglu)(_t(op["gate"]), _t(op["up"])), _t(op["out"]))


def test_gelu_table_is_libggml_cpus():
    """tallow's copy of ggml_table_gelu_f16 equals libggml-cpu b11434's, entry for entry (finite inputs)."""
    import hashlib

    from tallow.numerics import ggml_gelu_table

    finite = torch.isfinite(torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16))
    ours = ggml_gelu_table().half()[finite].view(torch.int16).numpy().astype(np.uint16)
    assert hashlib.sha256(ours.tobytes()).hexdigest() == LAYER_OPS["gelu_table_sha256_finite"]


def test_v_expf_differs_from_torch_exp():
    """ggml's SIMD exponential is not torch's: the emulation is not a renamed torch.exp (and the
    bit-for-bit softmax above depends on it)."""
    from tallow.numerics import ggml_v_expf

    x = torch.linspace(-20, 0, 4001)
    ours = ggml_v_expf(x)
    assert (ours != torch.exp(x)).any()
    assert ((ours - torch.exp(x.double()).float()).abs() / torch.exp(x)).max() < 3e-7  # within ~2 ulp


# TALLOW_NUMERICS=ggml's elementwise ops in C (kernels/cpu/ggml_ops.c): the AVX-512 code, the AVX2 code and
# the portable C, each bit for bit against the torch emulation above (tests/kernel_cases.py holds the same cases for
# the default code; here both codes run).
@pytest.fixture(params=[2, 1, 0], ids=["avx512", "avx2", "portable"])  # ggml_dot.AVX512, AVX2, PORTABLE
def c_ops(request):
    from tallow.kernels.cpu import ggml_dot, ggml_ops

    if not ggml_dot.available():
        pytest.skip(f"C kernel: {ggml_dot.status()}")
    if ggml_ops.set_simd(request.param) != request.param:
        ggml_ops.set_simd(True)
        pytest.skip("this CPU lacks that code's instructions")
    yield ggml_ops
    ggml_ops.set_simd(True)


def _same_bits(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    same = ours.float().view(torch.int32) == ref.float().view(torch.int32)
    assert bool(same.all()), f"{int((~same).sum())} of {same.numel()} differ, max |d| {(ours - ref).abs().max():.3e}"


def test_c_ops_elementwise_are_the_emulations_bits(c_ops):
    from kernel_cases import CASES

    g = torch.Generator().manual_seed(14)
    for case in CASES:
        if case.impl.startswith("tallow.kernels.cpu.ggml_ops:"):
            for shape in case.shapes:
                args = case.inputs(shape, torch.float32, g)
                _same_bits(case.run(args), case.reference(args))


def test_c_attention_is_the_emulations_bits_at_many_lengths(c_ops):
    """Attention of one token over 1..300 keys (every lane of the 64-lane sums and of the 16-value
    softmax blocks filled and not), grouped heads, a window, a ring that wraps; and of 1..20 prompt
    rows after some cached keys (tinyBLAS's 16 lanes), causal."""
    from tallow.layers import attention_mask
    from tallow.numerics import ggml_attention

    g = torch.Generator().manual_seed(11)
    k = (torch.randn(2, 320, 64, generator=g) * 3).half()
    v = torch.randn(2, 320, 64, generator=g).half()
    cases = [(n, 1) for n in list(range(1, 70)) + [127, 128, 129, 255, 256, 257, 300]] + [(40 + r, r) for r in range(2, 21)]
    for n, rows in cases:
        q = torch.randn(rows, 6, 64, generator=g) * 2
        lo = 17 if n > 200 else 0
        start, window = lo + n - rows, (n // 3 + 1 if n % 2 else None)
        slots = torch.arange(lo, lo + n) % 300  # the first 300 slots as a ring
        mask = attention_mask(torch.arange(start, lo + n), n, window, lo)
        ref = ggml_attention(q.transpose(0, 1), k[:, slots], v[:, slots], mask, 0.125)
        for threads in (1, 2):
            _same_bits(c_ops.attend(q, k[:, :300], v[:, :300], lo, start, window, 0.125, threads=threads), ref)


def test_c_exp_handles_ggmls_edges(c_ops):
    """SiLU at the exponential's edges: |n| > 192 (0 or inf), -inf, large and tiny values."""
    from tallow.numerics import ggml_swiglu

    x = torch.tensor([-1e30, -200.0, -133.0, -88.7, -87.3, -1e-30, 0.0, -0.0, 1e-30, 80.0, 88.7, 89.0, 140.0, 1e30,
                      float("inf"), float("-inf")] * 2)
    up = torch.linspace(-2, 2, x.numel())
    ours, ref = c_ops.swiglu(x[None], up[None]), ggml_swiglu(x[None], up[None])
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    _same_bits(torch.nan_to_num(ours), torch.nan_to_num(ref))


def test_c_geglu_at_the_tables_edges(c_ops):
    """GeGLU by ggml's table at its edges (the AVX2 code's eight-wide gather and F16C rounding, and its scalar
    tail): exactly -10 and 10, next to them, f16 rounding ties and halfway values, subnormals, signed zeros,
    values past f16's range, infinities."""
    from tallow.numerics import ggml_geglu

    tiny = torch.finfo(torch.float32).tiny
    x = torch.tensor([-10.0, 10.0, -9.999999, 9.999999, -10.000001, 10.000001, 0.0, -0.0, tiny, -tiny, 1e-40, -1e-40,
                      1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 2.0 ** -24, 2.0 ** -25, 5e-8, -6e-8, 0.5, -3.25, 7.0001,
                      1e5, -1e5, 65520.0, float("inf"), float("-inf")] * 3 + [0.75])  # 79 values: a tail of 7
    up = torch.linspace(-3, 3, x.numel())
    _same_bits(c_ops.geglu(x[None], up[None]), ggml_geglu(x[None], up[None]))


def test_c_ops_switch_picks_the_path(monkeypatch):
    """Under TALLOW_NUMERICS=ggml the layers call the C ops by default and the emulations with
    TALLOW_GGML_C_OPS=0; the same bits either way."""
    from tallow import layers, numerics
    from tallow.kernels.cpu import ggml_dot, ggml_ops

    if not ggml_dot.available():
        pytest.skip(f"C kernel: {ggml_dot.status()}")
    monkeypatch.setenv("TALLOW_NUMERICS", "ggml")
    calls = []
    monkeypatch.setattr(ggml_ops, "swiglu", lambda g, u: calls.append("c") or numerics.ggml_swiglu(g, u))
    gate, up = torch.randn(2, 64), torch.randn(2, 64)
    layers.swiglu(gate, up)
    assert calls == ["c"]
    monkeypatch.setenv("TALLOW_GGML_C_OPS", "0")
    layers.swiglu(gate, up)
    assert calls == ["c"]


def test_without_the_library_the_emulations_run(monkeypatch):
    """No C library (no compiler at install, or one from an older tallow without ggml_ops.c): the
    layers fall back to the torch emulations."""
    from tallow import layers, numerics
    from tallow.kernels.cpu import ggml_ops

    monkeypatch.setenv("TALLOW_NUMERICS", "ggml")
    monkeypatch.setattr(ggml_ops, "_lib", lambda: None)
    assert not ggml_ops.usable() and layers.ggml_c_ops(torch.zeros(1)) is None
    gate, up = torch.randn(2, 64), torch.randn(2, 64)
    _same_bits(layers.swiglu(gate, up), numerics.ggml_swiglu(gate, up))


def test_decode_steps_with_c_ops_equal_the_emulations(monkeypatch):
    """smollm2-135m under TALLOW_NUMERICS=ggml: a prompt and 12 decode steps give the same logits,
    bit for bit, with the C ops and with the torch emulations."""
    from model_paths import require_model

    import tallow
    from tallow.kernels.cpu import ggml_dot

    if not ggml_dot.usable():
        pytest.skip(f"C kernel: {ggml_dot.status()}")
    path = require_model("smollm2-135m")
    monkeypatch.setenv("TALLOW_NUMERICS", "ggml")
    runs = []
    for on in ("1", "0"):
        monkeypatch.setenv("TALLOW_GGML_C_OPS", on)
        llm = tallow.LLM(path, ctx=128)
        llm.engine.reset()
        rows = [llm.engine.prefill_chunk_at(list(range(300, 320)), 0)[-1]]
        tok = 5
        for _ in range(12):
            rows.append(llm.engine.decode_step(tok))
            tok = int(rows[-1].argmax())
        runs.append(torch.stack(rows))
    _same_bits(runs[0], runs[1])
