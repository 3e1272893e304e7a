"""The peak of a 2k prompt against the memory plan, with the plan's parts (tests/test_peak_memory.py's measurement):

    TALLOW_SPECULATE=0 TALLOW_PERSIST_KV=0 python scripts/peak_probe.py MODEL [CTX]
    TALLOW_WEIGHT_CACHE=0 ... (a cold load: every weight built, none mapped from the weight cache)

A fresh process resets the kernel's high-water mark after importing torch and tallow, loads MODEL at CTX (default
2048), prefills CTX - 48 token ids drawn from 100..20000 (seeded) and decodes 16; prints one JSON line in MiB: the
load's peak, the resident size after it, the whole peak (VmHWM above the post-import baseline) and the plan's parts."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from proc_memory import STATUS_SOURCE  # noqa: E402

exec(STATUS_SOURCE)  # status(key): a /proc/self/status field in bytes, as the tests read it
import torch  # noqa: E402

import tallow  # noqa: E402

ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
base = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")
t0 = time.time()
llm = tallow.LLM(sys.argv[1], ctx=ctx, device="cpu", kv_dtype="f16")
load_peak = status("VmHWM:") - base
after_load = status("VmRSS:") - base
ids = torch.randint(100, 20000, (ctx - 48,), generator=torch.Generator().manual_seed(0)).tolist()
llm.generate(ids, max_tokens=16, temperature=0)
p = llm.memory
M = 1 << 20
peak = status("VmHWM:") - base
print(json.dumps({"model": os.path.basename(sys.argv[1]), "ctx": ctx, "wall": round(time.time() - t0, 1),
    "load_peak": round(load_peak / M, 1), "after_load": round(after_load / M, 1), "peak": round(peak / M, 1),
    "plan_total": round(p.total / M, 1), "weights": round(p.weights / M, 1), "kv": round(p.kv / M, 1),
    "scratch": round(p.scratch / M, 1), "runtime": round(p.runtime / M, 1), "state": round(p.state / M, 1),
    "prefix": round(p.prefix_cache / M, 1), "ratio": round(peak / p.total, 3)}))
