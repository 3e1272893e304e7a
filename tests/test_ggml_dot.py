"""The C kernel (tallow/kernels/cpu/ggml_dot.c): bit-identical to libggml-cpu b11434 on the fixture
scripts/cpudot_vs_ggml.py recorded (its from_float bytes and its vec_dot outputs: the products
llama.cpp runs with weight repacking off, and its ggml_mul_mat of 8 rows, the tiled K-quant
product for prompts), its AVX-512 and portable code identical to each other, its quantization identical to the torch
reference (q8_activations.py), and the layers it backs equal to their torch counterparts."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

from tallow.gguf_file import TensorInfo
from tallow.kernels.cpu import ggml_dot, q8_activations
from test_quant_reference import random_rows

FIXTURE = Path(__file__).parent / "fixtures" / "ggml_dot.json"
needs_c = pytest.mark.skipif(not ggml_dot.available(), reason=f"C kernel: {ggml_dot.unavailable_reason()}")
# The layers take the C kernel only with its SIMD code, AVX-512 VNNI or AVX2 (ggml_dot.usable: the portable
# code is slower than the torch paths); tests of what the layers choose need such a CPU.
needs_c_layers = pytest.mark.skipif(not ggml_dot.usable(), reason=f"C kernel in the layers: {ggml_dot.status()}")


def _row_bytes(qt: QT, k: int) -> int:
    block, nbytes = GGML_QUANT_SIZES[qt]
    return k // block * nbytes


def _b64(s: str, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=dtype)


@pytest.fixture(params=[ggml_dot.AVX512, ggml_dot.AVX2, ggml_dot.PORTABLE], ids=["avx512", "avx2", "portable"])
def simd(request):
    level = ggml_dot.set_simd(request.param)
    if level != request.param:
        pytest.skip(f"this CPU runs {ggml_dot.status()}")
    yield request.param
    ggml_dot.set_simd(True)


@needs_c
@pytest.mark.parametrize("case", json.loads(FIXTURE.read_text())["cases"], ids=lambda c: c["weight_type"])
def test_bit_identical_to_libggml(case, simd):
    k = json.loads(FIXTURE.read_text())["K"]
    qt = QT[case["weight_type"]]
    x = _b64(case["x"], np.float32)
    xq = _b64(case["x_quantized"], np.uint8)
    assert (ggml_dot.quantize(x[None], qt).reshape(-1) == xq).all()  # ggml's from_float bytes
    w = _b64(case["weight"], np.uint8).reshape(-1, _row_bytes(qt, k))
    ref = _b64(case["dots"], np.float32)
    ours = ggml_dot.gemv_quantized(w, qt, k, xq[None]).reshape(-1)
    assert (ours.view(np.uint32) == ref.view(np.uint32)).all()




@needs_c
@pytest.mark.parametrize("case", json.loads(FIXTURE.read_text())["prompt_cases"], ids=lambda c: c["weight_type"])
def test_prompt_products_bit_identical_to_ggml_mul_mat(case, simd):
    """Products of 8 activation rows, as libggml-cpu's ggml_mul_mat computed them in a graph: for Q4_K, Q5_K
    and Q6_K that is llama.cpp's tiled K-quant product (another float order than vec_dot's), for Q5_0/Q8_0
    llamafile's tinyBLAS; fewer rows than that stay in vec_dot's order."""
    qt, k, m = QT[case["weight_type"]], case["K"], case["rows"]
    w = _b64(case["weight"], np.uint8).reshape(-1, _row_bytes(qt, k))
    xq = _b64(case["x_quantized"], np.uint8).reshape(m, -1)
    ref = _b64(case["products"], np.float32).reshape(m, -1)
    ours = ggml_dot.gemv_quantized(w, qt, k, xq)
    assert (ours.view(np.uint32) == ref.view(np.uint32)).all()
    one_by_one = np.concatenate([ggml_dot.gemv_quantized(w, qt, k, xq[i : i + 1]) for i in range(m)])
    if qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K):  # the fixture does tell the two orders apart
        assert (one_by_one.view(np.uint32) != ref.view(np.uint32)).any()
    else:
        assert (one_by_one.view(np.uint32) == ref.view(np.uint32)).all()


@needs_c
@pytest.mark.parametrize("rows", [1, 8])
def test_prefetch_distance_changes_no_bit(rows):
    """The weight-row prefetch only touches memory earlier: any distance, the same outputs."""
    k = 512
    for qt in sorted(ggml_dot.TYPES, key=int):
        raw = random_rows(qt, 96, k, seed=int(qt) + rows)
        xq = ggml_dot.quantize(torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)), qt)
        old = ggml_dot.prefetch_bytes()
        try:
            outs = []
            for distance in (0, 64, 2048, 1 << 20):
                ggml_dot.prefetch_bytes(distance)
                outs.append(ggml_dot.gemv_quantized(raw, qt, k, xq))
        finally:
            ggml_dot.prefetch_bytes(old)
        assert all((o.view(np.uint32) == outs[0].view(np.uint32)).all() for o in outs[1:])


@needs_c
@pytest.mark.parametrize("qt", sorted(ggml_dot.TYPES, key=int), ids=lambda q: q.name)
def test_quantization_matches_the_torch_reference(qt, simd):
    g = torch.Generator().manual_seed(int(qt))
    x = torch.randn(3, 512, generator=g) * torch.randn(3, 512, generator=g) ** 2
    x[1, 32:64] = 0
    x[2, 7], x[2, 9] = -30.0, 30.0  # a largest magnitude held by both signs, the negative first
    x[0, 100], x[0, 101] = 25.0, -25.0  # and the positive first
    x[0, 320:351], x[0, 351] = torch.arange(31) - 15.5, 127.0  # scale 1 (and -1 for Q8_K): every code a tie, k + 0.5
    act = q8_activations.VEC_DOT_TYPE[qt]
    raw = ggml_dot.quantize(x, qt)
    if act == QT.Q8_K:
        blocks = raw.reshape(3, 2, 292)
        codes, d = q8_activations.quantize_q8_k(x)
        assert (blocks[..., 4:260].view(np.int8) == codes.numpy().astype(np.int8)).all()
        assert (blocks[..., 0:4].copy().view(np.float32)[..., 0] == d.numpy()).all()
        bsums = codes.reshape(3, 2, 16, 16).sum(-1).numpy().astype(np.int16)
        assert (blocks[..., 260:292].copy().view(np.int16) == bsums).all()
    else:
        size = 36 if act == QT.Q8_1 else 34
        blocks = raw.reshape(3, 16, size)
        off = 4 if act == QT.Q8_1 else 2
        if act == QT.Q8_1:
            codes, d, s = q8_activations.quantize_q8_1(x)
            assert (blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) == s.numpy()).all()
        else:
            codes, d = q8_activations.quantize_q8_0(x)
        assert (blocks[..., off:].view(np.int8) == codes.numpy().astype(np.int8)).all()
        assert (blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32) == d.numpy()).all()


@needs_c
@pytest.mark.parametrize("qt", sorted(ggml_dot.TYPES, key=int), ids=lambda q: q.name)
def test_simd_and_portable_agree_and_match_the_dequantized_product(qt):
    """Same bits from every code level this CPU runs (several rows per thread; 2 activation rows in vec_dot's
    order, 9 in the tiled order); and the value is the product of the dequantized weight with the rounded
    activations, up to float order."""
    best = ggml_dot.set_simd(True)
    if best == ggml_dot.PORTABLE:
        pytest.skip(f"this CPU runs {ggml_dot.status()}")
    n, k = 72, 512
    raw = random_rows(qt, n, k, seed=int(qt))
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(5))
    for rows in (2, 9):
        xq = ggml_dot.quantize(x[:rows], qt)
        ys = []
        for level in range(best, ggml_dot.PORTABLE - 1, -1):
            ggml_dot.set_simd(level)
            ys.append(ggml_dot.gemv_quantized(raw, qt, k, xq))
        ggml_dot.set_simd(True)
        for y in ys[1:]:
            assert (ys[0].view(np.uint32) == y.view(np.uint32)).all()
    from tallow.kernels.cpu.ggml_linear import GgmlLinear

    ref = GgmlLinear(TensorInfo("w", qt, (k, n), 0, raw.nbytes, raw))(x[:rows]).numpy()
    scale = np.abs(ref).max()
    assert np.abs(ys[0] - ref).max() <= 2e-6 * scale  # float summation order only


@needs_c
def test_q8_k_quantization_of_non_finite_blocks_is_the_scalar_loops():
    """A Q8_K block holding a NaN or an infinity (a broken model's activations) gets the scalar loop's bytes at
    every code level, and never a read past its block (the vector code looks for the largest value's first
    occurrence, which a NaN hides)."""
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(8))
    x[0, 5], x[1, 300], x[2, 40] = float("nan"), float("inf"), -float("inf")
    x[2, 256:512] = float("nan")
    best = ggml_dot.set_simd(True)
    try:
        outs = []
        for level in range(best, ggml_dot.PORTABLE - 1, -1):
            ggml_dot.set_simd(level)
            outs.append(ggml_dot.quantize(x, QT.Q4_K))
    finally:
        ggml_dot.set_simd(True)
    assert all((o == outs[-1]).all() for o in outs)


@needs_c
@pytest.mark.parametrize("qt", [QT.Q4_1, QT.Q5_1], ids=lambda q: q.name)
@pytest.mark.parametrize("threads", [1, 2])
def test_row_pairs_change_no_bit(threads, qt, monkeypatch):
    """TALLOW_CPU_ROW_PAIRS: one-row Q4_1/Q5_1 products reading two weight rows per call (an odd row count, so
    a thread's share can end on a single row) give the one-row-per-call bits, and the portable code's."""
    monkeypatch.setattr(ggml_dot, "_threads", lambda: threads)
    n, k = 37, 512
    raw = random_rows(qt, n, k, seed=3)
    xq = ggml_dot.quantize(torch.randn(1, k, generator=torch.Generator().manual_seed(6)), qt)
    before = ggml_dot.row_pairs(True)
    try:
        paired = ggml_dot.gemv_quantized(raw, qt, k, xq)
        ggml_dot.row_pairs(False)
        single = ggml_dot.gemv_quantized(raw, qt, k, xq)
    finally:
        ggml_dot.row_pairs(before)
    level = ggml_dot.set_simd(ggml_dot.PORTABLE)
    try:
        portable = ggml_dot.gemv_quantized(raw, qt, k, xq)
    finally:
        ggml_dot.set_simd(True)
    assert level >= ggml_dot.PORTABLE
    assert (paired.view(np.uint32) == single.view(np.uint32)).all() and (paired.view(np.uint32) == portable.view(np.uint32)).all()


@needs_c_layers
def test_linear_layer_and_fallback(monkeypatch):
    """TALLOW_CPU_GGML_DOT (on unless =0): make_linear wraps the torch layer, up to 8 rows in C (each
    its one-row product: decode and verification agree), more rows on the torch layer; the output
    projection is C alone at any row count; =0 or with the library missing, the torch layer alone."""
    from tallow import switches
    from tallow.families.tensors import OUTPUT
    from tallow.kernels.cpu.linear import make_linear

    raw = random_rows(QT.Q8_0, 64, 256, seed=3)
    t = TensorInfo("w", QT.Q8_0, (256, 64), 0, raw.nbytes, raw)
    monkeypatch.delenv("TALLOW_CPU_GGML_DOT", raising=False)
    switches.refresh()
    assert make_linear(t).kind == "ggml_dot"  # on by default where the library is built
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "1")
    switches.refresh()
    assert make_linear(t).kind == "ggml_dot"
    out = make_linear(t, role=OUTPUT)
    assert out.kind == "ggml_dot" and not out.fallback and out.nbytes == raw.nbytes  # the file's bytes only
    x6 = torch.randn(6, 256)
    assert torch.equal(out(x6), torch.from_numpy(ggml_dot.gemv_quantized(raw, QT.Q8_0, 256, ggml_dot.quantize(x6, QT.Q8_0))))
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "0")
    switches.refresh()
    assert make_linear(t).kind != "ggml_dot" and make_linear(t, role=OUTPUT).kind != "ggml_dot"
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "1")
    monkeypatch.setenv("TALLOW_CPU_GEMM", "0")  # prefill on the torch layer (the default: test_ggml_gemm.py)
    switches.refresh()
    layer = make_linear(t)
    assert layer.kind == "ggml_dot" and layer.fallback
    x1 = torch.randn(1, 256)
    xq = ggml_dot.quantize(x1, QT.Q8_0)
    assert torch.equal(layer(x1), torch.from_numpy(ggml_dot.gemv_quantized(raw, QT.Q8_0, 256, xq)))
    x8 = torch.randn(8, 256)
    assert torch.equal(layer(x8), torch.cat([layer(x8[i : i + 1]) for i in range(8)]))  # row-invariant
    x9 = torch.randn(9, 256)
    assert torch.equal(layer(x9), layer.fallback[0](x9))
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "0")
    monkeypatch.setenv("TALLOW_NUMERICS", "ggml")
    switches.refresh()
    assert make_linear(t).kind == "ggml"  # =0 also under ggml numerics: the fp32 GgmlLinear
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "1")
    monkeypatch.delenv("TALLOW_NUMERICS")
    switches.refresh()
    monkeypatch.setattr(ggml_dot, "_lib", None)
    monkeypatch.setattr(ggml_dot, "_reason", "missing (test)")
    assert not ggml_dot.available() and "missing" in ggml_dot.status()
    assert make_linear(t).kind != "ggml_dot"
    assert torch.equal(layer(x1), layer.fallback[0](x1))  # a restored layer without its library


def _tiny_logits(path, ids):
    from tallow.gguf_file import GGUFFile
    from tallow.memory.kv_pool import KVPool
    from tallow.models import build_model
    from tallow.spec import spec_from_gguf

    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    kv = KVPool(spec, 64)
    batch = model.forward(ids[:6], 0, kv, all_logits=True)
    steps = torch.cat([model.forward([t], 6 + i, kv) for i, t in enumerate(ids[6:])])
    return batch, steps


@needs_c_layers
@pytest.mark.parametrize("qtype", [QT.Q8_0])
def test_tiny_model_decode_through_the_kernel(qtype, tmp_path, monkeypatch):
    """A tiny random llama: under TALLOW_NUMERICS=ggml the C kernel (over the file's bytes) and the
    fp32 GgmlLinear compute the same arithmetic up to float order: same greedy tokens, logits within
    1e-4 (measured ~1e-6). In the default mode decode goes through C (counted) and stays within the
    bf16 path's own distance of the fp32 reference."""
    from tallow import switches
    from tiny_models import write_tiny_model

    path = write_tiny_model("llama", tmp_path / "tiny.gguf", qtype=qtype)
    ids = [3, 70, 101, 256, 257, 9, 44, 200, 17, 5, 88, 120]
    calls = []
    real = ggml_dot._Products.__call__
    monkeypatch.setattr(ggml_dot._Products, "__call__", lambda self, x: calls.append(x.shape) or real(self, x))

    def run(**env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        switches.refresh()
        calls.clear()
        out = _tiny_logits(path, ids)
        return out, len(calls)

    (c_batch, c_steps), n_c = run(TALLOW_NUMERICS="ggml", TALLOW_CPU_GGML_DOT="1")
    (f_batch, f_steps), n_f = run(TALLOW_CPU_GGML_DOT="0")
    assert n_c > 0 and n_f == 0
    torch.testing.assert_close(c_steps, f_steps, rtol=0, atol=1e-4)
    torch.testing.assert_close(c_batch, f_batch, rtol=0, atol=1e-4)
    assert torch.equal(c_steps.argmax(-1), f_steps.argmax(-1))

    monkeypatch.delenv("TALLOW_NUMERICS")
    (d_batch, d_steps), n_d = run(TALLOW_CPU_GGML_DOT="1")
    (t_batch, t_steps), _ = run(TALLOW_CPU_GGML_DOT="0")
    (r_batch, r_steps), _ = run(TALLOW_CPU_GGML_DOT="0", TALLOW_REFERENCE="1")
    assert n_d > 0
    # prefill: the torch layers either way, but the output projection (C alone, every row count)
    for c, t, r in ((d_batch, t_batch, r_batch), (d_steps, t_steps, r_steps)):
        assert (c - r).abs().max() <= max(2 * (t - r).abs().max(), 1e-3 * r.abs().max())


@needs_c_layers
def test_weight_cache_restores_the_c_layer(tmp_path, monkeypatch):
    """TALLOW_CPU_GGML_DOT=1 with the weight cache: a warm load maps GgmlDotLinear (its bytes and the
    torch layer it wraps) and decodes the same logits as the cold load."""
    monkeypatch.setenv("TALLOW_NUMERICS", "default")  # the torch paths: this test's subject
    import tallow
    from tallow import switches
    from tiny_models import write_tiny_model

    monkeypatch.setenv("TALLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "1")
    switches.refresh()
    path = write_tiny_model("llama", tmp_path / "m.gguf", qtype=QT.Q4_1)
    logits = []
    for expect in ("written", "hit"):
        llm = tallow.LLM(str(path), ctx=64, device="cpu")
        assert llm.stats.load.weight_cache == expect
        assert llm.model.layers[0].attn_output.kind == "ggml_dot"
        llm.engine.reset()
        logits.append(llm.engine.decode_step(5).clone())
    assert torch.equal(logits[0], logits[1])


@needs_c_layers
@pytest.mark.parametrize("types", [(QT.Q4_K, QT.Q4_K, QT.Q6_K), (QT.Q5_0, QT.Q5_0, QT.Q8_0), (QT.Q4_1, QT.Q4_1),
                                   (QT.Q8_0, QT.Q4_1, QT.Q6_K, QT.Q4_K), (QT.Q5_K, QT.Q5_K, QT.Q6_K), (QT.Q5_1, QT.Q5_1, QT.Q4_1)], ids=lambda t: "+".join(q.name for q in t))
def test_group_equals_its_parts(types, monkeypatch):
    """GgmlDotGroup (FusedLinear of C layers: one call, the input quantized once per activation type,
    one parallel region over all rows, the four-row code) gives each part's bits exactly as the part
    alone and as gemv_quantized row by row, for 1-3 input rows, odd row counts, one or two threads,
    threaded or not; more rows go to the stacked torch layers, biases included."""
    from tallow import switches
    from tallow.kernels.cpu.fused_linear import FusedLinear
    from tallow.kernels.cpu.linear import make_linear

    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "1")
    monkeypatch.setenv("TALLOW_CPU_GEMM", "0")  # every part with its torch layer (test_ggml_gemm.py: without)
    switches.refresh()
    k = 512
    parts, raws = [], []
    for i, (qt, n) in enumerate(zip(types, (67, 130, 33, 64))):
        raw = random_rows(qt, n, k, seed=10 + i)
        raws.append(raw)
        bias = np.linspace(-1, 1, n).astype(np.float32) if i == 1 else None
        parts.append(make_linear(TensorInfo(f"w{i}", qt, (k, n), 0, raw.nbytes, raw), bias))
    group = FusedLinear(parts)
    assert len(group.runs) == 1 and isinstance(group.runs[0], ggml_dot.GgmlDotGroup) and group.kind == "ggml_dot"
    old_threads, old_min = torch.get_num_threads(), ggml_dot.parallel_min_bytes()
    try:
        for threads, par_min in ((1, 1 << 20), (2, 0), (2, 1 << 30)):
            torch.set_num_threads(threads)
            ggml_dot.parallel_min_bytes(par_min)
            for m in (1, 2, 3):
                x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
                y = group(x)
                alone = torch.cat([p(x) for p in parts], dim=-1)
                assert torch.equal(y, alone)
                rows = torch.cat([torch.from_numpy(ggml_dot.gemv_quantized(r, qt, k, ggml_dot.quantize(x, qt)))
                                  + (p.bias if p.bias is not None else 0) for r, qt, p in zip(raws, types, parts)], dim=-1)
                assert torch.equal(y, rows)
    finally:
        torch.set_num_threads(old_threads)
        ggml_dot.parallel_min_bytes(old_min)
    x8 = torch.randn(8, k)  # verification's most rows: each row its one-row product
    assert torch.equal(group(x8), torch.cat([group(x8[i : i + 1]) for i in range(8)]))
    x9 = torch.randn(9, k)  # prefill: the torch layers
    assert torch.equal(group(x9), FusedLinear([p.fallback[0] for p in parts])(x9))


@needs_c_layers
def test_prefill_plan_keeps_short_chunks_off_the_c_rows(tmp_path, monkeypatch):
    """Without the dequantized prefill tiles, prefill chunks must be longer than the C kernel's rows
    (its Q/K/V and gate/up groups included), or a row's bits would depend on the chunk's length."""
    monkeypatch.setenv("TALLOW_NUMERICS", "default")  # the torch paths: this test's subject
    from tallow.engine.prefill_plan import plan_for
    from tallow.gguf_file import GGUFFile
    from tallow.models import build_model
    from tallow.spec import spec_from_gguf
    from tiny_models import write_tiny_model

    monkeypatch.setenv("TALLOW_PREFILL_DEQUANT", "0")
    gf = GGUFFile(write_tiny_model("llama", tmp_path / "t.gguf", qtype=QT.Q8_0))
    model = build_model(gf, spec_from_gguf(gf))
    assert any(t.kind == "ggml_dot" and not hasattr(t, "MAX_ROWS") for t in model.layers[0].tensors.values()
               if hasattr(t, "kind"))  # a group of C parts
    assert plan_for(model, 512).min_rows == ggml_dot.GgmlDotLinear.MAX_ROWS + 1
