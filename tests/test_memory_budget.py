"""The memory account: computed from the header alone, refuses before loading, matches what a
loaded process really holds (VmRSS) within 10%."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from model_paths import require_model
from proc_memory import STATUS_SOURCE
from tiny_models import write_tiny_model

from tallow.errors import MemoryBudgetError, UsageError
from tallow.memory import budget
from tallow.memory.budget import GiB, MiB, parse_size, plan_memory

ROOT = Path(__file__).resolve().parents[1]
REAL_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct")




def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tallow.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, **(env or {})})


def test_parse_size_units_and_errors():
    assert parse_size("3GiB")[0] == 3 * GiB
    assert parse_size("3gi")[0] == 3 * GiB
    assert parse_size("1.5G")[0] == 1_500_000_000
    assert parse_size("800MB")[0] == 800_000_000
    assert parse_size("512MiB")[0] == 512 * MiB
    assert parse_size(12345)[0] == 12345
    assert parse_size(None) == (None, "")
    half, text = parse_size("50%")
    assert 0 < half <= budget.mem_available() and "50%" in text
    for bad in ("lots", "3XB", "-1G", "0%", "150%"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_type_sets_agree_with_the_kernels():
    """budget.py repeats the repack rules to stay torch-free; they must not drift."""
    from tallow.kernels.cpu import linear
    from tallow.quant import pack

    assert budget.INT4_TYPES == pack.INT4_TYPES
    assert budget.INT8_TYPES == pack.INT8_TYPES
    assert budget.INT4X2_TYPES == pack.INT4X2_TYPES
    assert budget.FLOAT_TYPES == linear.FLOAT_TYPES
    from tallow.kernels.cpu import dequant_matmul, ggml_dot

    assert budget._C_KERNEL_TYPES == ggml_dot.TYPES  # the types the plan counts at the file's bytes

    # bf16 tile (2 bytes per element) plus its nibbles (1 byte per element) at the cap
    assert budget.PREFILL_DEQUANT_SCRATCH == dequant_matmul.SCRATCH_ELEMENTS * 3


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma4", "gemma4-31b"])
def test_plan_weights_and_kv_equal_what_the_model_allocates(arch, tmp_path):
    from gguf import GGMLQuantizationType as QT

    import tallow

    path = write_tiny_model(arch, tmp_path / f"tiny-{arch}.gguf", qtype=QT.Q4_0)
    llm = tallow.LLM(path, ctx=64)
    plan = plan_memory(path, 64)
    # Within 2%, not exact: model files may fuse projections (one row padding instead of three)
    # or expand per-head norm weights, which moves a few KB.
    assert abs(plan.weights - llm.model.nbytes) <= 0.02 * llm.model.nbytes
    assert plan.kv == llm.engine.kv.nbytes
    assert llm.memory.weights == plan.weights


@pytest.mark.parametrize("arch", ["gemma4", "gemma4-31b"])
def test_kv_plan_equals_the_pool_per_layer_kind(arch, tmp_path):
    """Gemma 4: per-layer head sizes, sliding rings and shared-KV layers (which own nothing):
    the plan's KV bytes are what KVPool allocates, for every dtype, with and without rings."""
    import torch

    from tallow.gguf_file import GGUFFile
    from tallow.memory.kv_pool import KVPool
    from tallow.spec import spec_from_gguf

    with GGUFFile(write_tiny_model(arch, tmp_path / f"{arch}.gguf")) as gf:
        spec = spec_from_gguf(gf)
    for kv_dtype in ("f16", "int8", "fp8", "f32"):
        for ring, chunk in ((True, 16), (False, 16), (True, 256)):
            pool = KVPool(spec, 200, kv_dtype, ring=ring, max_chunk=chunk)
            assert budget.kv_bytes(spec, 200, kv_dtype, chunk, ring) == pool.nbytes, (kv_dtype, ring, chunk)
    shared = budget.kv_bytes_per_token(spec, "f16")
    unshared = budget.kv_bytes_per_token(spec, "f16", shared=False)
    assert shared == spec.kv_bytes_per_token_f16
    assert (shared < unshared) == (arch == "gemma4")


@pytest.mark.parametrize("name", REAL_MODELS)
def test_plan_answers_fast_without_loading(name):
    path = require_model(name)
    t0, c0 = time.perf_counter(), time.process_time()
    plan = plan_memory(path, 4096, "100GiB")
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert plan.fits and plan.weights > 0
    if any(layer.sliding_window for layer in plan.spec.layers):  # gemma3: 15 of 18 layers are rings of 1023 slots
        assert plan.kv < 4096 * plan.kv_bytes_per_token / 2
    else:
        assert plan.kv == 4096 * plan.kv_bytes_per_token
    # The bound is one second; CPU time (0.08 s measured) is what a shared machine
    # cannot inflate, wall time is what the user waits.
    assert cpu < 0.5 and elapsed < 1.0, f"planning {name} took {elapsed:.2f} s ({cpu:.2f} s CPU)"


def test_refusal_names_each_part_and_the_largest_context():
    path = require_model("smollm2-135m")
    plan = plan_memory(path, 8192, "300MiB", "50MiB")
    assert not plan.fits
    best = plan.largest_fitting_ctx()
    assert 16 <= best < 8192
    assert plan.with_ctx(best).fits and not plan.with_ctx(best + 1).fits
    msg = plan.refusal()
    for part in ("weights", "KV for 8192 tokens", "scratch", "prefix cache", "runtime", "reserve", f"--ctx {best}"):
        assert part in msg
    assert msg.count(". ") == 0 and msg.endswith(".")  # one sentence
    with pytest.raises(MemoryBudgetError):
        plan.check()


def test_cli_refuses_before_loading_with_exit_code_3():
    path = require_model("smollm2-135m")
    t0 = time.perf_counter()
    r = _cli("run", "-m", str(path), "-p", "hi", "--ctx", "8192", "--mem-budget", "300MiB", "--reserve", "50MiB")
    elapsed = time.perf_counter() - t0
    assert r.returncode == 3, r.stderr
    assert r.stdout == ""
    line = r.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("tallow: error: smollm2-135m.gguf needs")
    for part in ("weights", "KV for 8192 tokens", "scratch", "runtime", "reserve", "largest context that would fit is"):
        assert part in line
    assert elapsed < 30  # refused from the header, no weights were repacked

    r = _cli("run", "-m", str(path), "-p", "hi", "--mem-budget", "1MB")
    assert r.returncode == 3 and "no context fits" in r.stderr


def test_cli_plan_prints_the_account():
    path = require_model("smollm2-135m")
    r = _cli("plan", "-m", str(path), "--ctx", "2048", "--mem-budget", "2GiB")
    assert r.returncode == 0, r.stderr
    for part in ("weights", "KV for 2048 tokens", "scratch", "prefix cache", "runtime", "total", "fits"):
        assert part in r.stdout
    r = _cli("plan", "-m", str(path), "--mem-budget", "100MiB")
    assert r.returncode == 3 and "does NOT fit" in r.stdout and "needs" in r.stderr
    r = _cli("plan", "-m", str(path), "--mem-budget", "lots")
    assert r.returncode == 2 and "--mem-budget" in r.stderr


MEASURE = STATUS_SOURCE + r"""
import json, sys
import torch
import tallow.api
base = status('VmRSS')
import tallow
path, ctx, n_prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = tallow.LLM(path, ctx=ctx)
llm.generate([500], max_tokens=1)  # a mapped weight is resident once a token has read it (llama.cpp's numerics)
loaded = status('VmRSS')
peak = None
if n_prompt:
    try:
        open('/proc/self/clear_refs', 'w').write('5')  # restart VmHWM from the current RSS
    except OSError:
        pass
    else:
        ids = [(i * 7919) % (llm.spec.vocab_size - 1000) + 500 for i in range(n_prompt)]
        llm.generate(ids, max_tokens=2)
        peak = status('VmHWM')
p = llm.memory
print(json.dumps({"base": base, "loaded": loaded, "peak": peak, "resident": p.resident, "total": p.total}))
"""


def _measure(name: str, ctx: int, n_prompt: int) -> None:
    path = require_model(name)
    # The cold load, then one token: a warm one maps its packed weights (memory/weight_cache.py), and
    # llama.cpp's numerics map the file's, which become resident only as the first token reads them
    # (test_weight_cache checks that the plan counts the mapped bytes).
    r = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(ctx), str(n_prompt)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT, env={**os.environ, "TALLOW_WEIGHT_CACHE": "0"})
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    after_load = m["loaded"] - m["base"]
    print(f"\n{name} ctx {ctx}: planned resident {m['resident'] / MiB:.1f} MiB, measured {after_load / MiB:.1f} MiB", end="")
    assert abs(after_load - m["resident"]) <= 0.10 * m["resident"]
    if m["peak"] is not None:  # informational: glibc keeps freed prefill temporaries (see budget.scratch_bytes)
        peak = m["peak"] - m["base"]
        print(f"; planned total {m['total'] / MiB:.1f} MiB, measured peak over a {n_prompt}-token prefill {peak / MiB:.1f} MiB")


def test_plan_matches_measured_memory_smollm2():
    _measure("smollm2-135m", 2048, 0)


def test_plan_matches_measured_memory_gemma3():
    _measure("gemma3-270m", 1024, 0)


@pytest.mark.slow
def test_plan_matches_measured_memory_qwen():
    _measure("qwen2.5-coder-1.5b-instruct", 4096, 0)
