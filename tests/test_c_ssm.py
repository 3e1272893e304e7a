"""The Mamba mixer's conv1d and scan in C (kernels/cpu/ssm_step.c, TALLOW_CPU_C_SSM) against
(1) an op-by-op torch emulation of the arithmetic ssm_step.c's header states (ggml_v_expf SiLU and
Mamba-1 decays, the softplus by ggml_v_expf and a log1p series, libm's Mamba-2 decay, ggml's sum
orders): bit for bit, AVX-512, AVX2 and
portable C alike; (2) the torch reference (kernels/cpu/ssm.py) within float rounding; (3) itself:
a chunk of rows leaves the state token-by-token steps do, bit for bit. Model-level conformance
with llama.cpp's fixtures runs through the default path in tests/test_ssm.py."""

from __future__ import annotations

import math

import pytest
import torch

from tallow.kernels import ssm_ops
from tallow.kernels.cpu import c_ssm, ggml_dot, ggml_ops
from tallow.kernels.cpu.ssm import causal_conv
from tallow.kernels.ssm_ops import CMixerOps, TorchMixerOps
from tallow.numerics import _reduce16, fma, ggml_silu, ggml_v_expf, libm_map

pytestmark = pytest.mark.skipif(c_ssm._lib() is None, reason="the optional C library is not built")

_SP_Q = [torch.tensor(1.0 / k, dtype=torch.float32) for k in (15, 13, 11, 9, 7, 5, 3)]


def softplus_c(x: torch.Tensor) -> torch.Tensor:
    """ssm_step.c's softplus_lane: max(x, 0) + 2 atanh(s) with s = t / (2 + t), t = ggml_v_expf(-|x|);
    x itself above 20."""
    t = ggml_v_expf(-x.abs())
    s = t / (2.0 + t)
    s2, two_s = s * s, s + s
    q = _SP_Q[0].expand_as(x)
    for c in _SP_Q[1:]:
        q = fma(q, s2, c.expand_as(x))
    y = torch.clamp(x, min=0.0) + fma(two_s * s2, q, two_s)
    return torch.where(x > 20.0, x, y)


def emulate_scan(state, x, dt, A, B, C, dt_bias, D, z):
    """ssm_step.c's ss_scan op by op in torch: x (n, nh*hd), dt (n, nh), B/C (n, ng*ds)."""
    nh, hd, ds = state.shape
    n = x.shape[0]
    per_group = nh // (B.shape[1] // ds)
    y = torch.empty(n, nh, hd)
    for t in range(n):
        d = dt[t] + dt_bias if dt_bias is not None else dt[t]
        sp = softplus_c(d)  # (nh,)
        Bh = B[t].view(-1, ds).repeat_interleave(per_group, 0).unsqueeze(1)  # (nh, 1, ds)
        Ch = C[t].view(-1, ds).repeat_interleave(per_group, 0).unsqueeze(1)
        xv = x[t].view(nh, hd)
        x_dt = (xv * sp.unsqueeze(1)).unsqueeze(-1)
        if A.dim() == 2:  # Mamba-1: ggml_v_expf per state; products summed 16 at a time by the lane tree
            dA = ggml_v_expf(sp.unsqueeze(1) * A).unsqueeze(1)
            state.copy_(state * dA + Bh * x_dt)
            p = state * Ch
            sums = torch.zeros(nh, hd)
            whole = ds - ds % 16
            for i in range(0, whole, 16):
                sums = sums + _reduce16(p[..., i : i + 16])
            for i in range(whole, ds):
                sums = sums + p[..., i]
        else:  # Mamba-2: libm expf per head; 4 x 16 FMA accumulators over steps of 64, the tail one by one
            dA = libm_map("expf", sp * A).view(nh, 1, 1)
            state.copy_(state * dA + Bh * x_dt)
            np_ = ds - ds % 64
            acc = torch.zeros(nh, hd, 64)
            for i in range(0, np_, 64):
                acc = fma(state[..., i : i + 64], Ch[..., i : i + 64].expand(nh, hd, 64), acc)
            sums = _reduce16((acc[..., :16] + acc[..., 32:48]) + (acc[..., 16:32] + acc[..., 48:])) if np_ else torch.zeros(nh, hd)
            for i in range(np_, ds):
                sums = sums + state[..., i] * Ch[..., i]
        y[t] = sums + xv * D.view(nh, 1) if D is not None else sums
    y = y.reshape(n, nh * hd)
    return ggml_silu(z) * y if z is not None else y


def _case(version, ds, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    nh, hd, ng = (24, 1, 1) if version == 1 else (6, 8, 2)
    d = nh * hd
    proj = torch.randn(n, 3 * d + 2 * ng * ds + nh, generator=g)  # column slices of one in-projection, as the mixer passes them
    x, z = proj[:, :d], proj[:, d : 2 * d]
    B, C = proj[:, 2 * d : 2 * d + ng * ds], proj[:, 2 * d + ng * ds : 2 * d + 2 * ng * ds]
    dt = proj[:, 2 * d + 2 * ng * ds : 2 * d + 2 * ng * ds + nh] * 3.0
    dt[0, 0] = 25.0  # softplus' x > 20 branch
    A = -torch.rand(nh, ds, generator=g) if version == 1 else -torch.rand(nh, generator=g)
    D, dt_bias = torch.randn(nh, generator=g), torch.randn(nh, generator=g)
    state = torch.randn(nh, hd, ds, generator=g)
    return state, x, dt, A, B, C, dt_bias, D, z


@pytest.fixture(params=(2, 1, 0), ids=("avx512", "avx2", "portable"))  # ggml_dot.AVX512, AVX2, PORTABLE
def simd(request):
    ggml_ops._lib()  # the switch lives in ggml_ops.c, shared with ssm_step.c
    if ggml_ops.set_simd(request.param) != request.param:
        ggml_ops.set_simd(True)
        pytest.skip("this CPU lacks that code's instructions")
    yield request.param
    ggml_ops.set_simd(True)


@pytest.mark.parametrize("version,ds", ((1, 16), (1, 20), (2, 128), (2, 80), (2, 24)))
@pytest.mark.parametrize("n", (1, 4))
def test_scan_is_its_emulation_bit_for_bit(version, ds, n, simd):
    """Every d_state path: whole 16-lane blocks and a tail (Mamba-1), steps of 64 and a tail, or no step (Mamba-2)."""
    state, x, dt, A, B, C, dt_bias, D, z = _case(version, ds, n)
    s_c, s_e = state.clone(), state.clone()
    y_c = c_ssm.scan(s_c, x, dt, A, B, C, dt_bias if version == 2 else None, D, z)
    y_e = emulate_scan(s_e, x, dt, A, B, C, dt_bias if version == 2 else None, D, z)
    assert torch.equal(s_c, s_e)
    assert torch.equal(y_c, y_e)


@pytest.mark.parametrize("n", (1, 6))
def test_conv_is_the_reference_conv_with_ggml_silu(n, simd):
    """The taps, bias and state shift are the reference's bits; SiLU is ggml's (numerics.ggml_silu)."""
    g = torch.Generator().manual_seed(n)
    rows = torch.randn(n, 70, generator=g)  # 37 channels: two blocks of 16 and a tail, at a row stride of 70
    x = rows[:, 3:40]
    state, weight, bias = torch.randn(3, 37, generator=g), torch.randn(37, 4, generator=g), torch.randn(37, generator=g)
    s_c, s_r = state.clone(), state.clone()
    out = c_ssm.conv(x, s_c, weight.t().contiguous(), bias)
    assert torch.equal(s_c, torch.cat([state, x])[n:])  # the last d_conv - 1 rows
    assert torch.equal(out, ggml_silu(causal_conv(x, s_r, weight, bias)))
    assert torch.equal(s_c, s_r)
    s_o = state.clone()
    assert torch.equal(CMixerOps().conv(x, s_o, weight, bias), out) and torch.equal(s_o, s_c)  # the mixer op transposes the kernel


@pytest.mark.parametrize("version,ds", ((1, 16), (2, 128), (2, 64)))
def test_rows_in_one_call_leave_the_state_steps_do(version, ds):
    state, x, dt, A, B, C, dt_bias, D, z = _case(version, ds, 7, seed=3)
    whole, steps = state.clone(), state.clone()
    y = c_ssm.scan(whole, x, dt, A, B, C, dt_bias, D, z)
    y_steps = torch.cat([c_ssm.scan(steps, x[t : t + 1], dt[t : t + 1], A, B[t : t + 1], C[t : t + 1], dt_bias, D, z[t : t + 1])
                         for t in range(7)])
    assert torch.equal(whole, steps) and torch.equal(y, y_steps)


@pytest.mark.parametrize("version,ds", ((1, 16), (2, 128)))
def test_the_mixer_ops_agree_with_the_torch_reference(version, ds):
    """Against kernels/cpu/ssm.py over 8 tokens: softplus, exp and SiLU differ from torch's by an ulp
    or two and the state sums are added in another order, so outputs and states differ by float
    rounding: measured under 3e-7 of the largest value; a wrong tap, decay or gate is > 1e-2."""
    state, x, dt, A, B, C, dt_bias, D, z = _case(version, ds, 8, seed=5)
    s_c, s_r = state.clone(), state.clone()
    y_c = CMixerOps().scan(s_c, x, dt, A, B, C, dt_bias=dt_bias, D=D, z=z)
    y_r = TorchMixerOps().scan(s_r, x, dt, A, B, C, dt_bias=dt_bias, D=D, z=z)
    assert ((s_c - s_r).abs().max() / s_r.abs().max()).item() < 2e-6
    assert ((y_c - y_r).abs().max() / y_r.abs().max()).item() < 2e-6


def test_softplus_is_within_a_few_ulp_of_the_exact_one():
    """The series softplus (the C one bit for bit: the scan tests) against log1p(exp(x)) in double, over -30..20."""
    x = torch.linspace(-30.0, 20.0, 20001)
    ref = torch.tensor([math.log1p(math.exp(v)) for v in x.tolist()], dtype=torch.float64)
    err = ((softplus_c(x).double() - ref).abs() / ref).max().item()
    assert err < 4e-7, err  # measured 3.0e-7 (near x = -2.7): ~3 ulp; libm's log1pf(expf) ~1


def test_a_padded_chunk_and_the_switch_take_the_torch_reference(monkeypatch):
    """n_valid short of the rows (a padded chunk) is the reference's; TALLOW_CPU_C_SSM=0 picks the torch ops."""
    state, x, dt, A, B, C, dt_bias, D, z = _case(2, 64, 5, seed=7)
    s_c, s_r = state.clone(), state.clone()
    y_c = CMixerOps().scan(s_c, x, dt, A, B, C, 3, dt_bias, D, z)
    y_r = TorchMixerOps().scan(s_r, x, dt, A, B, C, 3, dt_bias, D, z)
    assert torch.equal(s_c, s_r) and torch.equal(y_c, y_r)
    assert isinstance(ssm_ops.mixer_ops(torch.device("cpu")), CMixerOps)
    monkeypatch.setenv("TALLOW_CPU_C_SSM", "0")
    assert type(ssm_ops.mixer_ops(torch.device("cpu"))) is TorchMixerOps


def _q8_engine(arch, path, monkeypatch, on: str):
    """A Q8_0 tiny model of arch (its products in the C kernel) loaded with TALLOW_CPU_C_MIXER=on."""
    from gguf import GGMLQuantizationType as QT
    from tiny_models import write_tiny_ssm

    from tallow import switches
    from tallow.engine.engine import Engine
    from tallow.gguf_file import GGUFFile
    from tallow.models import build_model
    from tallow.spec import spec_from_gguf

    monkeypatch.setenv("TALLOW_CPU_C_MIXER", on)
    monkeypatch.setenv("TALLOW_CPU_C_LAYER", "0")  # falcon-h1: the composed block, whose mixer this tests (tests/test_decode_falcon.py: the whole step)
    switches.refresh()
    if not path.exists():
        # mamba's dt_rank 32, not 4: a Q8_0 row (the twins' ssm_dt is Q5_0; an F32 one keeps the composed mixer)
        write_tiny_ssm(arch, path, qtype=QT.Q8_0, shape={"dt_rank": 32} if arch == "mamba" else None)
    gf = GGUFFile(path)
    return Engine(build_model(gf, spec_from_gguf(gf)), 128, prefill_chunk=8, kv_dtype="f16")


@pytest.mark.skipif(not ggml_dot.usable(), reason="the one-call mixer runs the C kernel's layers (AVX-512 VNNI or AVX2)")
@pytest.mark.parametrize("simd", (True, False))
@pytest.mark.parametrize("arch", ("mamba", "mamba2", "falcon-h1"))
def test_the_one_call_mixer_step_is_the_composed_mixer_bit_for_bit(arch, simd, tmp_path, monkeypatch):
    """TALLOW_CPU_C_MIXER (ss_mixer_step: a layer's whole mixer in one C call at decode; falcon-h1's
    in-projection in one product with Q/K/V) against the composed mixer (=0): after a prompt longer
    than the conv kernel and the chunk, 12 decode steps' logits and every layer's conv and scan states
    are the same bits, with AVX-512 and in portable C."""
    from tiny_models import tiny_prompt

    path, runs = tmp_path / "q8.gguf", {}
    ggml_ops.set_simd(simd)
    try:
        for on in ("1", "0"):
            engine = _q8_engine(arch, path, monkeypatch, on)
            ids = tiny_prompt(20)
            engine.reset()
            engine.prefill_chunk_at(ids, 0)
            token, logits = ids[-1], []
            for _ in range(12):
                out = engine.decode_step(token)
                logits.append(out.clone())
                token = int(out.argmax())
            used = engine.model.c_mixers
            state = engine.kv.state
            runs[on] = (torch.stack(logits), [t.clone() for t in state.tensors()], used)
    finally:
        ggml_ops.set_simd(True)
    (l1, s1, used), (l0, s0, unused) = runs["1"], runs["0"]
    assert used and all(isinstance(step, c_ssm.MixerStep) for step in used.values())  # the C step ran in every layer
    assert not unused  # never built: the switch is asked per step
    assert torch.equal(l1.view(torch.int32), l0.view(torch.int32))
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(s1, s0))
