"""tests/fast_interpreter.py: a launch patches triton.language once, its helpers' calls do not
patch it again, and kernels with nested helpers compute what they computed before."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import fast_interpreter  # noqa: E402


@triton.jit
def _square_sum(x_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)  # tl.zeros: a @jit helper of triton.language itself
    for off in range(0, n, BLOCK):
        e = off + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + e, mask=e < n, other=0.0)
        acc += v * v
    return tl.sum(acc, axis=0)


@triton.jit
def _rms_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    ms = _square_sum(x_ptr + row * n, n, BLOCK) / n  # a helper calling a helper
    e = tl.arange(0, BLOCK)
    for off in range(0, n, BLOCK):
        v = tl.load(x_ptr + row * n + off + e, mask=off + e < n)
        tl.store(y_ptr + row * n + off + e, v / tl.sqrt(ms), mask=off + e < n)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" or not hasattr(interpreter, "_LangPatchScope"),
                    reason="needs Triton's interpreter with patch scopes (Triton >= 3.7)")
def test_one_patching_per_launch_and_the_same_result(monkeypatch):
    fast_interpreter.apply()
    assert interpreter._patch_lang.__module__ == "fast_interpreter"
    x = torch.randn(3, 37, generator=torch.Generator().manual_seed(0))
    y = torch.empty_like(x)
    real = []
    counted = fast_interpreter.real_patch_lang

    def counting(fn):
        real.append(fn.__name__)
        return counted(fn)

    monkeypatch.setattr(fast_interpreter, "real_patch_lang", counting)
    _rms_kernel[(3,)](x, y, 37, BLOCK=16)
    assert torch.allclose(y, x / x.pow(2).mean(-1, keepdim=True).sqrt(), rtol=1e-5, atol=1e-6)
    # The launch patched triton.language; its three rows' helper calls (each also calling tl.zeros,
    # which sees triton.language.core) patched only what the launch had not: tl.core, once.
    assert real[0] == "_rms_kernel" and len(real) <= 2, real


def test_dtype_table_gives_the_interpreters_answers():
    fast_interpreter.apply()
    if interpreter._get_np_dtype.__module__ != "fast_interpreter":
        pytest.skip("this Triton's interpreter has no _get_np_dtype")
    kinds = [tl.int1, tl.float16, tl.float32, tl.bfloat16, tl.int8, tl.uint8, tl.int32, tl.uint32, tl.int64,
             tl.float8e4nv, tl.float8e5]
    for t in kinds:
        for ty in (t, tl.block_type(t, [4]), tl.pointer_type(t), tl.block_type(tl.pointer_type(t), [2, 8])):
            assert fast_interpreter.real_np_dtype(ty) == interpreter._get_np_dtype(ty), ty
