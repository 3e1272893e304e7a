"""Loading keeps weights quantized: resident memory after load stays within 1.3x the file.

Measured in a fresh process as VmRSS after load minus VmRSS after loading and running a
tiny random model (what every process pays for torch's lazily loaded kernels and tallow's
code, whatever the model), minus the KV pool we allocate for the context.
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
llm.generate("hello", max_tokens=2)
print(json.dumps({"base": base, "after": rss(), "kv": llm.stats.load.kv_bytes, "weights": llm.stats.load.weights_bytes}))
"""


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-1.5b-instruct"])
def test_resident_memory_after_load(name):
    path = model_path(name)
    if path is None:
        if os.environ.get("TALLOW_REQUIRE_MODELS") == "1":
            pytest.fail(f"{name} is required but missing")
        pytest.skip(f"{name} not found")
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(path), tests_dir], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout.strip().splitlines()[-1])
    size = os.path.getsize(path)
    model_rss = m["after"] - m["base"] - m["kv"]
    print(f"\n{name}: file {size / 2**20:.0f} MiB, resident for the model {model_rss / 2**20:.0f} MiB ({model_rss / size:.2f}x), weights {m['weights'] / 2**20:.0f} MiB")
    assert model_rss <= 1.3 * size
