"""Small fused decode kernels (rmsnorm.py, rope.py, glu.py, argmax.py) through Triton's
interpreter against torch references.

Tolerances: rmsnorm, RoPE and SwiGLU are a few fp32 operations per element in the reference's
order (1e-6 relative; a wrong index or a missed residual gives > 1e-2); GeGLU rounds to fp16
twice as ggml does, and our exp-based tanh may cross an fp16 rounding boundary where torch's
does not, so we allow one fp16 ulp (1e-3 relative) per element; argmax must be exact.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

import tallow.kernels.triton  # noqa: E402,F401
from tallow.kernels.triton.argmax import argmax, argmax_reference  # noqa: E402
from tallow.kernels.triton.glu import glu, glu_reference  # noqa: E402
from tallow.kernels.triton.rmsnorm import rmsnorm, rmsnorm_reference  # noqa: E402
from tallow.kernels.triton.rope import rope, rope_reference  # noqa: E402


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


# Against the reference on three shapes: tests/kernel_cases.py. Here: the residual sum, buffers, 1-D rows,
# with rows held in registers and (TALLOW_NORM_ONE_PASS=0) looped over in chunks.
@pytest.mark.parametrize("one_pass", ["1", "0"])
@pytest.mark.parametrize("m,d,res", [(1, 576, False), (2, 1536, True)])
def test_rmsnorm_with_residual_and_sum_out(m: int, d: int, res: bool, one_pass: str, monkeypatch) -> None:
    monkeypatch.setenv("TALLOW_NORM_ONE_PASS", one_pass)
    g = torch.Generator().manual_seed(d)
    x, r, w = torch.randn(m, d, generator=g), torch.randn(m, d, generator=g), torch.randn(d, generator=g)
    s_out = torch.full((m, d), float("nan"))
    y = rmsnorm(x, w, 1e-6, residual=r if res else None, sum_out=s_out if res else None)
    y_ref, s_ref = rmsnorm_reference(x, w, 1e-6, r if res else None)
    assert y.shape == (m, d) and y.dtype == torch.float32
    assert _rel(y, y_ref) < 1e-6
    if res:
        assert _rel(s_out, s_ref) < 1e-7
    else:
        assert s_out.isnan().all()  # untouched without a residual
    # a single row given as 1-D, into a caller's buffers (the graph-safe path: no allocation)
    out, s1 = torch.full((1, d), float("nan")), torch.full((1, d), float("nan"))
    y1 = rmsnorm(x[0], w, 1e-6, out=out, residual=r[0] if res else None, sum_out=s1 if res else None)
    assert y1 is out and _rel(out[0], y_ref[0]) < 1e-6
    if res:
        assert _rel(s1[0], s_ref[0]) < 1e-7


@pytest.mark.parametrize("style", ["neox", "norm"])
@pytest.mark.parametrize("rot,norm", [(None, False), (32, True)])
def test_rope_at_device_position_into_cache(style: str, rot, norm: bool) -> None:
    g = torch.Generator().manual_seed(11)
    nq, nk, d, n_ctx = 4, 2, 64, 16
    r = d if rot is None else rot
    q, k, v = torch.randn(nq, d, generator=g), torch.randn(nk, d, generator=g), torch.randn(nk, d, generator=g)
    ang = torch.rand(n_ctx, r // 2, generator=g) * 6
    cos, sin = ang.cos(), ang.sin()
    qn, kn = (torch.randn(d, generator=g), torch.randn(d, generator=g)) if norm else (None, None)
    k_cache = torch.zeros(nk, n_ctx, d, dtype=torch.float16)
    v_cache = torch.zeros(nk, n_ctx, d, dtype=torch.float16)
    pos = torch.tensor([5], dtype=torch.int32)
    qo, _ = rope(q, k, cos, sin, pos, style, rot_dim=rot, k_cache=k_cache, v=v, v_cache=v_cache, q_norm=qn,
                 k_norm=kn, eps=1e-6)
    assert _rel(qo, rope_reference(q, cos[5], sin[5], style, rot, qn)) < 1e-6
    assert _rel(k_cache[:, 5], rope_reference(k, cos[5], sin[5], style, rot, kn)) < 1e-3  # fp16 cache
    assert torch.equal(v_cache[:, 5], v.half())
    assert k_cache[:, 4].abs().sum() == 0 and k_cache[:, 6].abs().sum() == 0


def test_rope_token_rows_equal_one_token_calls() -> None:
    """R consecutive tokens in one launch (speculative verification), rows of one qkv buffer as
    the decode step has them: bit for bit R one-token calls, keys and values in their slots."""
    g = torch.Generator().manual_seed(12)
    nq, nk, d, n_ctx, rows = 4, 2, 64, 16, 3
    qkv = torch.randn(rows, (nq + 2 * nk) * d, generator=g)
    q = qkv[:, : nq * d].view(rows, nq, d)
    k = qkv[:, nq * d : (nq + nk) * d].view(rows, nk, d)
    v = qkv[:, (nq + nk) * d :].view(rows, nk, d)
    ang = torch.rand(n_ctx, d // 2, generator=g) * 6
    cos, sin = ang.cos(), ang.sin()
    qn, kn = torch.randn(d, generator=g), torch.randn(d, generator=g)
    caches = [torch.zeros(nk, n_ctx, d, dtype=torch.float16) for _ in range(4)]
    pos = torch.tensor([7, 8, 9], dtype=torch.int32)
    slot = pos % 8  # a ring of 8 slots
    qo, _ = rope(q, k, cos, sin, pos, "neox", k_cache=caches[0], v=v, v_cache=caches[1], q_norm=qn, k_norm=kn, slot=slot)
    singles = [rope(q[r], k[r], cos, sin, pos[r : r + 1], "neox", k_cache=caches[2], v=v[r], v_cache=caches[3],
                    q_norm=qn, k_norm=kn, slot=slot[r : r + 1])[0] for r in range(rows)]
    assert qo.shape == (rows, nq, d) and torch.equal(qo, torch.stack(singles))
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert torch.equal(caches[1][:, 1], v[2].half())  # position 9 in slot 1


# Both kinds against the reference on (2, 1536) and (1, 1000): tests/kernel_cases.py. Here: out=, layers.geglu.
@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
@pytest.mark.parametrize("m,f", [(1, 1000)])
def test_glu_from_concatenated_gate_up(kind: str, m: int, f: int) -> None:
    g = torch.Generator().manual_seed(3)
    gu = torch.randn(m, 2 * f, generator=g) * 3
    gate, up = gu[:, :f], gu[:, f:]  # strided views of one gate_up output (row stride 2F)
    assert gate.stride(0) == 2 * f
    y = glu(gate, up, kind)
    ref = glu_reference(gate, up, kind)
    assert y.shape == (m, f) and y.dtype == torch.float32
    if kind == "swiglu":
        assert _rel(y, ref) < 1e-6
    else:
        assert ((y - ref).abs() <= 1e-3 * ref.abs() + 1e-6).all()
        from tallow.layers import geglu as layers_geglu
        assert ((y - layers_geglu(gate, up)).abs() <= 1e-3 * ref.abs() + 1e-6).all()
    out = torch.full((m, f), float("nan"))
    assert glu(gate, up, kind, out=out) is out and torch.equal(out, y)


def test_argmax_two_stage_ties_and_rows() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 151936, generator=g)
    x[0, 100_000] = 50.0
    x[0, 7] = 50.0  # a tie: the lower index wins
    x[1, 151935] = 60.0  # the very last element
    x[1, 3] = float("nan")
    out = argmax(x, parts=64)
    assert out.tolist() == [7, 151935] == argmax_reference(x).tolist()
    y = torch.randn(1000, generator=g)
    assert argmax(y, parts=8).item() == int(argmax_reference(y)[0])


def test_programmatic_dependent_launch_only_where_it_applies(monkeypatch):
    """PDL options are given to compiled launches on a capable CUDA device with the switch on, and
    nowhere else (the interpreter and the CPU take no launch_pdl; the kernels then skip the wait)."""
    from tallow import switches
    from tallow.kernels.triton import pdl

    cuda = torch.device("cuda", 0)
    monkeypatch.setitem(pdl._CAPABLE, 0, True)
    monkeypatch.setattr(pdl, "INTERPRETED", False)
    monkeypatch.setenv("TALLOW_PDL", "1")
    switches.refresh()
    assert pdl.launch(cuda) == {"PDL": True, "launch_pdl": True}
    assert pdl.launch(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setitem(pdl._CAPABLE, 0, False)  # an Ampere card
    assert pdl.launch(cuda) == {"PDL": False}
    monkeypatch.setitem(pdl._CAPABLE, 0, True)
    monkeypatch.setattr(pdl, "INTERPRETED", True)
    assert pdl.launch(cuda) == {"PDL": False}
    monkeypatch.setattr(pdl, "INTERPRETED", False)
    monkeypatch.setenv("TALLOW_PDL", "0")
    switches.refresh()
    assert pdl.launch(cuda) == {"PDL": False}
    monkeypatch.delenv("TALLOW_PDL")
    switches.refresh()


@pytest.mark.parametrize("one_pass", ["1", "0"])
def test_rmsnorm_add_both_geometries(one_pass: str, monkeypatch) -> None:
    """rmsnorm_add with a scale and the next norm, the row in registers or in 1024-element chunks
    (1536 wide: two chunks), against the reference; `out` may be the residual itself."""
    from tallow.kernels.triton.rmsnorm import rmsnorm_add, rmsnorm_add_reference

    monkeypatch.setenv("TALLOW_NORM_ONE_PASS", one_pass)
    g = torch.Generator().manual_seed(3)
    x, r, w, w2 = (torch.randn(2, 1536, generator=g), torch.randn(2, 1536, generator=g),
                   torch.randn(1536, generator=g), torch.randn(1536, generator=g))
    scale = torch.tensor([0.5])
    want, want_h = rmsnorm_add_reference(x, w, 1e-6, r, scale, next_weight=w2)
    got, h = rmsnorm_add(x, w, 1e-6, r.clone(), scale, next_weight=w2)
    assert _rel(got, want) < 1e-6 and _rel(h, want_h) < 1e-6
    inplace = r.clone()
    assert torch.equal(rmsnorm_add(x, w, 1e-6, inplace, scale, out=inplace), rmsnorm_add(x, w, 1e-6, r, scale))
