"""The integer-dot GEMV (tallow/kernels/triton/mmvq.py) under Triton's interpreter, small shapes.

Bounds, and why:
- Q8_1 quantization: bit-identical to the torch transcription of ggml-cuda's quantize_q8_1, and
  roundf's ties (half away from zero) checked against written-out codes.
- The GEMV with unit weight scales and integer x (d8 = 1): every partial sum is an integer below
  2^24, so the kernel's fp32 result equals the float64 reference exactly -- the integer dot
  products, the code sums and the scale/min decoding are exact, not just close.
- With random scales: the fp32 combination of exact integers in another order: 1e-6 of the
  float64 reference (measured ~1e-7).
- Against the fp32 dequantized product (quant_gemv's reference): x's 8-bit rounding, |error| <=
  amax/254 per element, ~0.7% norm-wise on Gaussian x (measured): 2e-2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

import tallow.kernels.triton  # noqa: E402,F401  (the interpreter shim)
from tallow.kernels.triton.mmvq import (  # noqa: E402
    mmvq,
    mmvq_q8,
    mmvq_reference,
    quantize_q8_1,
    quantize_q8_1_reference,
)
from tallow.kernels.triton.planes import dequantize_planes, pack_planes, random_raw  # noqa: E402

# (BLOCK_N, BLOCKS, warps, stages, K splits, DP4A): DP4A runs as the portable int32 dot here
SPLIT2 = (8, 2, 1, 1, 2, True)
ONE = (8, 2, 1, 1, 1, True)


def _weight(qtype: str, n: int, k: int, seed: int, unit_scales: bool = False):
    w = pack_planes(random_raw(qtype, n, k, torch.Generator().manual_seed(seed)), qtype, k)
    if unit_scales:
        for name in ("dm", "d", "m"):
            if name in w.planes:
                w.planes[name].fill_(1.0)
    return w


def test_q8_1_is_the_reference_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 512, generator=g) * torch.tensor([1.0, 1e-3, 30.0])[:, None]
    x[1, 32:64] = 0.0  # amax 0: codes 0, d 0
    x[2, 64:96] = torch.arange(32) - 15.5
    x[2, 64] = 127.0  # d = 1: the halves are exact ties
    a, r = quantize_q8_1(x), quantize_q8_1_reference(x)
    for field in ("qs", "d", "s", "isum"):
        assert torch.equal(getattr(a, field), getattr(r, field)), field
    assert torch.equal(a.isum, a.qs.int().reshape(3, -1, 16).sum(-1).int())


def test_q8_1_with_a_glu_prologue_is_the_glu_then_q8_1() -> None:
    """SwiGLU/GeGLU folded into the quantization: the GLU kernel's values (same _act), then
    Q8_1, bit for bit; each row its one-row quantization."""
    from tallow.kernels.triton.glu import glu
    from tallow.kernels.triton.quant_gemv import Prologue

    g = torch.Generator().manual_seed(2)
    gu = torch.randn(3, 2 * 320, generator=g) * 2.0
    for kind in ("swiglu", "geglu"):
        a = quantize_q8_1(gu, prologue=Prologue(kind))
        r = quantize_q8_1(glu(gu[:, :320], gu[:, 320:], kind))
        for field in ("qs", "d", "s", "isum"):
            assert torch.equal(getattr(a, field), getattr(r, field)), (kind, field)
        one = quantize_q8_1(gu[1:2], prologue=Prologue(kind))
        assert torch.equal(one.qs[0], a.qs[1]) and torch.equal(one.d[0], a.d[1])


@pytest.mark.parametrize("one_pass", ["1", "0"])
@pytest.mark.parametrize("k", [1536, 576])
def test_q8_1_with_a_norm_prologue(monkeypatch, one_pass: str, k: int) -> None:
    """RMSNorm(x + residual) * w folded into the quantization: the residual sum written once,
    exactly; the codes those of the torch norm's values (the 1/RMS may round differently in
    its last bit, moving a code by one at a tie: none at this seed); rows independent. Both
    kernels: one pass (TALLOW_Q8_NORM_ONE_PASS; rows up to 1024 keep the chunked one), and the
    chunked one; K not a power of two of blocks (48 and 18: the one-pass row tile's padding masked)."""
    from tallow.kernels.triton.quant_gemv import Prologue
    from tallow.kernels.triton.rmsnorm import rmsnorm_reference

    monkeypatch.setenv("TALLOW_Q8_NORM_ONE_PASS", one_pass)
    g = torch.Generator().manual_seed(3)
    x, res = torch.randn(2, k, generator=g), torch.randn(2, k, generator=g)
    w = torch.rand(k, generator=g) + 0.5
    total = torch.full_like(x, float("nan"))
    a = quantize_q8_1(x, prologue=Prologue("norm", w, 1e-6, res, total))
    y, s = rmsnorm_reference(x, w, 1e-6, res)
    assert torch.equal(total, s)
    r = quantize_q8_1_reference(y)
    assert (a.qs.int() - r.qs.int()).abs().max() <= 1
    assert torch.allclose(a.d.float(), r.d.float(), rtol=1e-3)
    plain = quantize_q8_1(x, prologue=Prologue("norm", w, 1e-6))  # no residual: RMSNorm(x) * w
    assert (plain.qs.int() - quantize_q8_1_reference(rmsnorm_reference(x, w, 1e-6)[0]).qs.int()).abs().max() <= 1
    one = quantize_q8_1(x[1:2], prologue=Prologue("norm", w, 1e-6, res[1:2], torch.empty_like(x[1:2])))
    assert torch.equal(one.qs[0], a.qs[1]) and torch.equal(one.d[0], a.d[1])


def test_q8_1_norm_in_one_pass_is_the_chunked_kernel(monkeypatch) -> None:
    """The one-pass norm quantization against the chunked one it replaces, on rows as wide as a
    decode step's (2560: qwen3-4b) and 8 rows (a verification pass): the residual sum bit for
    bit, every field of the Q8_1 blocks equal but where the two 1/RMS round apart (a code by one
    at a tie), each row its one-row quantization bit for bit (speculation's rows = decode steps),
    the NVFP4 order the natural codes permuted, and no element of any output left unwritten."""
    from tallow.kernels.triton.mmvq import Q8Act, nv_order_reference
    from tallow.kernels.triton.quant_gemv import Prologue

    g = torch.Generator().manual_seed(4)
    k = 2560
    x, res = torch.randn(8, k, generator=g) * 3.0, torch.randn(8, k, generator=g)
    w = torch.rand(k, generator=g) + 0.5

    def run(rows: slice, **kw) -> tuple[Q8Act, torch.Tensor]:
        n = rows.stop - rows.start
        total = torch.full((n, k), float("nan"))
        poisoned = Q8Act(torch.full((n, k), -128, dtype=torch.int8), torch.full((n, k // 32), float("nan")).half(),
                         torch.full((n, k // 32), float("nan")).half(), torch.full((n, k // 16), -(2**31), dtype=torch.int32))
        return quantize_q8_1(x[rows], out=poisoned, prologue=Prologue("norm", w, 1e-6, res[rows], total), **kw), total

    monkeypatch.setenv("TALLOW_Q8_NORM_ONE_PASS", "1")
    a, total = run(slice(0, 8))
    assert not total.isnan().any() and not a.d.isnan().any() and not a.s.isnan().any()
    assert (a.isum != -(2**31)).all() and torch.equal(a.isum, a.qs.int().reshape(8, -1, 16).sum(-1).int())
    for r in range(8):
        one, _ = run(slice(r, r + 1))
        for field in ("qs", "d", "s", "isum"):
            assert torch.equal(getattr(one, field)[0], getattr(a, field)[r]), (r, field)
    nv, _ = run(slice(0, 8), nv_order=True)
    assert torch.equal(nv.qs, nv_order_reference(a.qs)) and torch.equal(nv.d, a.d)
    for cfg in ((0, 16), (16, 4)):  # the whole row in one program; 16 blocks a program (the sweep's)
        c, total_c = run(slice(0, 8), norm_config=cfg)
        assert torch.equal(total_c, total) and (c.qs.int() - a.qs.int()).abs().max() <= 1
        assert torch.allclose(c.d.float(), a.d.float(), rtol=1e-3)
    monkeypatch.setenv("TALLOW_Q8_NORM_ONE_PASS", "0")
    b, total_b = run(slice(0, 8))
    assert torch.equal(total, total_b)
    assert (a.qs.int() - b.qs.int()).abs().max() <= 1
    assert float((a.qs.int() != b.qs.int()).float().mean()) < 1e-3
    assert torch.allclose(a.d.float(), b.d.float(), rtol=1e-3) and torch.allclose(a.s.float(), b.s.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("reload", [False, True])
@pytest.mark.parametrize("m,k,scaled", [(1, 64, False), (3, 1536, True), (8, 96, True)])
def test_rmsnorm_add_writing_q8_1_is_the_two_launches(m: int, k: int, scaled: bool, reload: bool) -> None:
    """TALLOW_NORM_ADD_Q8: the norm after a residual join writing its normed output's Q8_1 blocks
    gives the stream, the normed row and every byte of the blocks that rmsnorm_add then
    quantize_q8_1 give (1536: E2B's width, 48 blocks in a 64-block row tile; 96: 3 in 4); rows
    independent (a verification pass's rows = decode steps); the row too wide for one pass left
    to the caller (None). Both ways to the blocks: h reshaped in registers, and h re-read."""
    from tallow.kernels.triton.mmvq import rmsnorm_add_q8
    from tallow.kernels.triton.rmsnorm import ONE_PASS_MAX, rmsnorm_add

    g = torch.Generator().manual_seed(k + m)
    x, res = torch.randn(m, k, generator=g) * 2.0, torch.randn(m, k, generator=g)
    w, w2 = torch.randn(k, generator=g), torch.rand(k, generator=g) + 0.5
    scale = torch.rand(1, generator=g) + 0.5 if scaled else None
    out, h = rmsnorm_add(x, w, 1e-6, res, scale, next_weight=w2)
    want = quantize_q8_1(h)
    got_out, got_h, got = rmsnorm_add_q8(x, w, 1e-6, res, w2, scale, reload=reload)
    assert torch.equal(got_out, out) and torch.equal(got_h, h)
    for field in ("qs", "d", "s", "isum"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    one = rmsnorm_add_q8(x[-1:], w, 1e-6, res[-1:], w2, scale, reload=reload)[2]
    assert all(torch.equal(getattr(one, f)[0], getattr(got, f)[-1]) for f in ("qs", "d", "s", "isum"))
    wide = ONE_PASS_MAX + 32
    z = torch.zeros(1, wide)
    assert rmsnorm_add_q8(z, torch.ones(wide), 1e-6, z, torch.ones(wide)) is None


def test_q8_1_rounds_half_away_from_zero() -> None:
    x = torch.zeros(1, 32)
    x[0, :8] = torch.tensor([127.0, 0.5, -0.5, 1.5, -2.5, 2.4999998, -0.49999997, 126.5])  # d = 1
    codes = quantize_q8_1(x).qs[0, :8].tolist()
    assert codes == [127, 1, -1, 2, -3, 2, 0, 127]
    assert quantize_q8_1_reference(x).qs[0, :8].tolist() == codes


TYPES = ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0"]


@pytest.mark.parametrize("qtype", TYPES)
def test_integer_arithmetic_is_exact(qtype: str) -> None:
    # unit scales (and Q4_1's min) and integer x with one 127 per 32 (so d8 = 1, and s8 an integer
    # fp16 holds): all partials are integers < 2^24
    w = _weight(qtype, 12, 256, seed=2, unit_scales=True)
    x = torch.randint(-3, 4, (2, 256), generator=torch.Generator().manual_seed(3)).float()
    x[:, ::32] = 127.0
    ref = mmvq_reference(x, w)
    assert torch.equal(mmvq(x, w, config=ONE).double(), ref)
    assert ref.abs().max() > 1e3  # not a trivially small product


@pytest.mark.parametrize("qtype", TYPES)
def test_random_scales_within_bounds(qtype: str) -> None:
    # N 12: a ragged row tile. K 768 in two splits, the second a ragged K step: K-quants 3 blocks in
    # steps of 2 ([0, 2), [2, 3)), 32-element types 24 blocks in steps of 16 ([0, 16), [16, 24))
    x = torch.randn(3, 768, generator=torch.Generator().manual_seed(5))
    cfg = (8, 16, 1, 1, 2, True) if qtype in ("Q8_0", "Q4_0", "Q4_1", "Q5_0") else SPLIT2
    w = _weight(qtype, 12, 768, seed=4)
    y = mmvq(x, w, out=torch.full((3, 12), float("nan")), config=cfg)
    ref = mmvq_reference(x, w)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-6
    fp = x @ dequantize_planes(w).T
    assert float((y - fp).norm() / fp.norm()) < 2e-2
    # row r of the 3-row product is its one-row product, bit for bit
    for r in range(3):
        assert torch.equal(y[r], mmvq(x[r], w, config=cfg))


def test_errors_are_one_sentence() -> None:
    w = pack_planes(random_raw("Q4_K", 8, 256, torch.Generator().manual_seed(6)), "Q4_K", 256)
    w.qtype = "Q2_K"  # a type the kernel does not take
    with pytest.raises(ValueError, match="No MMVQ kernel for Q2_K"):
        mmvq_q8(quantize_q8_1(torch.randn(1, 256)), w)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_1(torch.randn(1, 40))
    with pytest.raises(ValueError, match="1 to 8 rows"):
        mmvq(torch.randn(9, 256), _weight("Q4_K", 8, 256, seed=7))



def test_no_sum_left_to_contraction() -> None:
    """Compiled for sm_90 (no GPU needed; a subprocess, since this file runs the interpreter): no
    fp32 sum of two products in the kernel, whose fma contraction the compiler may resolve either
    way -- for Q4_K it did so differently for different ROWS on the H200, and row r of an M-row
    product missed its one-row product (the interpreter cannot see it)."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, str(root / "scripts" / "gemv_sass_count.py"), "--check"], env=env,
                         capture_output=True, text=True, timeout=300)
    if run.returncode not in (0, 1):
        pytest.skip(f"no offline sm_90 compile here: {run.stderr.strip().splitlines()[-1:]}")
    assert run.returncode == 0, run.stdout
