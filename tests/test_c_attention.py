"""CPU decode attention over an f16 cache in C (tallow/kernels/cpu/decode_attention.c): the portable
code, the AVX2 and the AVX-512 code against torch's path, and layers.decode_attention's routing and switch.
(The kernel case in tests/kernel_cases.py holds the default code to 2e-5 on four shapes.)"""

from __future__ import annotations

import pytest
import torch

from tallow.kernels.cpu import c_attention, ggml_dot
from tallow.layers import attend_keys, decode_attention

pytestmark = pytest.mark.skipif(not ggml_dot.available(), reason="the optional C library is not built")


def _cache(n_kv=2, heads=8, dim=64, n_ctx=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, dim, generator=g), torch.randn(n_kv, n_ctx, dim, generator=g).half(),
            torch.randn(n_kv, n_ctx, dim, generator=g).half())


LEVELS = pytest.mark.parametrize("simd", [ggml_dot.AVX512, ggml_dot.AVX2, ggml_dot.PORTABLE], ids=["avx512", "avx2", "portable"])


def _level(simd):
    if c_attention.set_simd(simd) != simd:
        c_attention.set_simd(True)
        pytest.skip("this CPU lacks that code's instructions")


@LEVELS
@pytest.mark.parametrize("threads", [1, 4])  # 4: each KV head's keys in chunks, merged
@pytest.mark.parametrize("heads", [8, 5])  # 5: a register block of heads short of full
def test_portable_and_simd_code_match_torch(simd, threads, heads):
    q, k, v = _cache(n_kv=1, heads=heads, n_ctx=1500)
    want = attend_keys(q, k[:, 10:1490].float(), v[:, 10:1490].float(), 0.2, 20.0)
    _level(simd)
    try:
        got = c_attention.attend_f16(q, k, v, 10, 1490, 0.2, 20.0, threads=threads)
    finally:
        c_attention.set_simd(True)
    assert float((got - want).norm() / want.norm()) < 2e-6


def test_decode_attention_routes_f16_caches_to_c_unless_switched_off(monkeypatch):
    q, k, v = _cache(seed=1)
    want = attend_keys(q, k[:, 44:].float(), v[:, 44:].float(), 0.125)
    fast = decode_attention(q, k, v, 300, 0.125, window=256)  # default: the C kernel
    assert float((fast - want).norm() / want.norm()) < 2e-6
    assert not torch.equal(fast, want)  # another summation order: the C kernel ran
    monkeypatch.setenv("TALLOW_CPU_C_ATTENTION", "0")
    assert torch.equal(decode_attention(q, k, v, 300, 0.125, window=256), want)  # torch's SDPA


def test_speculation_stays_exact_with_it(tmp_path, monkeypatch):
    """Verification asks the C attention query by query (models/step.EagerRowsAttention), so
    speculation keeps running: rows of a verification pass equal decode steps bit for bit."""
    monkeypatch.setenv("TALLOW_NUMERICS", "default")  # the torch paths: this test's subject
    from gguf import GGMLQuantizationType as QT
    from tiny_models import write_tiny_model

    from tallow.engine.engine import Engine, GenerationStats
    from tallow.engine.speculate import rows_are_exact
    from tallow.gguf_file import GGUFFile
    from tallow.models import build_model
    from tallow.models.step import VERIFY
    from tallow.spec import spec_from_gguf

    gf = GGUFFile(write_tiny_model("llama", tmp_path / "t.gguf", qtype=QT.Q8_0))  # row-exact int8 kernels
    engine = Engine(build_model(gf, spec_from_gguf(gf)), n_ctx=128)
    assert rows_are_exact(engine.model) and engine.kv.k[0].dtype == torch.float16
    prompt, seq = list(range(40, 70)), [7, 200, 13, 99, 5]
    engine.prefill(prompt, GenerationStats())
    steps = torch.stack([engine.decode_step(t) for t in seq])
    engine.kv.truncate(len(prompt))
    rows = engine.model.forward(seq, len(prompt), engine.kv, all_logits=True, phase=VERIFY)
    assert torch.equal(rows, steps)


@LEVELS
@pytest.mark.parametrize("threads", [1, 4])
def test_a_ring_is_read_in_position_order_as_the_whole_cache_is(simd, threads):
    """A sliding-window layer's ring (position p in row p % ring) gives the bits the full-context
    layout gives for the same positions, so the layout never changes an answer."""
    q, k, v = _cache(n_kv=2, n_ctx=1000, seed=3)
    ring = 300
    rk, rv = torch.empty_like(k[:, :ring]), torch.empty_like(v[:, :ring])
    begin, end = 700 - 277, 700  # wraps: rows 123..299, then 0..99
    for p in range(begin, end):
        rk[:, p % ring], rv[:, p % ring] = k[:, p], v[:, p]
    _level(simd)
    try:
        want = c_attention.attend_f16(q, k, v, begin, end, 0.2, threads=threads)
        got = c_attention.attend_f16(q, rk, rv, begin, end, 0.2, threads=threads, ring=True)
    finally:
        c_attention.set_simd(True)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="do not fit a ring"):
        c_attention.attend_f16(q, rk, rv, 0, ring + 1, 0.2, ring=True)
