"""Loading keeps weights quantized, and the memory plan accounts for what they hold.

Measured in a fresh process as VmRSS after load and a prompt long enough to prefill through
every layer (so every weight copy the model holds is paged in, mapped or not) minus VmRSS after
loading and running a tiny random model (what every process pays for torch's lazily loaded
kernels and tallow's code, whatever the model), minus the KV pool allocated for the context.

- Every model: resident within the plan's weights and scratch (memory/budget.py; the prompt's
  activations and the torch prefill's dequantization tiles are scratch).
- A model whose types the C kernel both decodes and prefills (qwen2.5: Q4_K/Q6_K) holds one
  copy: within 1.3x the file. A Q4_1 model (smollm2) holds two by design — the file's bytes for
  the C decode and a torch int4 copy for prefill (TALLOW_CPU_GGML_DOT in tallow/switches.py) —
  so its one-copy check is made with the C kernel off, where only the torch layers remain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from model_paths import model_path

SCRIPT = r"""
import ctypes, gc, json, sys, tempfile
sys.path.insert(0, sys.argv[2])
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) * 1024
import tallow
from gguf import GGMLQuantizationType
from tiny_models import write_tiny_model
# The runtime's own fixed cost (torch's lazily loaded kernels, tallow's code) is paid by
# loading and running a tiny model first; what the real model adds on top is its own.
with tempfile.TemporaryDirectory() as tmp:
    for qtype in (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0):
        tiny = tallow.LLM(write_tiny_model("llama", tmp + "/tiny.gguf", qtype=qtype), ctx=64, device="cpu")
        tiny.generate([1, 2, 3], max_tokens=2)
        del tiny
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)
base = rss()
llm = tallow.LLM(sys.argv[1], ctx=512, device="cpu")
llm.generate("Write a short poem about the sea, the wind and the boats that sail on it at night.", max_tokens=2)
print(json.dumps({"base": base, "after": rss(), "kv": llm.stats.load.kv_bytes, "weights": llm.stats.load.weights_bytes, "scratch": llm.memory.scratch}))
"""


def _resident(path, env_extra=None):
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, **(env_extra or {}))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(path), tests_dir], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    return m["after"] - m["base"] - m["kv"], m["weights"], m["scratch"]


@pytest.mark.parametrize("name,env,one_copy", [
    ("smollm2-135m", {}, False),
    ("smollm2-135m", {"TALLOW_CPU_GGML_DOT": "0"}, True),
    ("qwen2.5-coder-1.5b-instruct", {}, True),
])
def test_resident_memory_after_load(name, env, one_copy):
    path = model_path(name)
    if path is None:
        if os.environ.get("TALLOW_REQUIRE_MODELS") == "1":
            pytest.fail(f"{name} is required but missing")
        pytest.skip(f"{name} not found")
    model_rss, planned, scratch = _resident(path, env)
    size = os.path.getsize(path)
    print(f"\n{name} {env}: file {size / 2**20:.0f} MiB, resident for the model {model_rss / 2**20:.0f} MiB"
          f" ({model_rss / size:.2f}x), planned weights {planned / 2**20:.0f} MiB"
          f" and scratch {scratch / 2**20:.0f} MiB")
    assert model_rss <= planned + scratch
    if one_copy:
        assert model_rss <= 1.3 * size
