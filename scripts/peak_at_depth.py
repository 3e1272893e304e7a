"""The process's peak resident memory through a long prompt on the CPU, against the memory plan:

    python scripts/peak_at_depth.py MODEL CTX [DECODE]      # e.g. /tmp/twins/falcon-h1-1.5b.gguf 32768

A fresh process resets the kernel's high-water mark after importing torch and tallow, loads MODEL at
context CTX, prefills CTX - DECODE - 1 tokens (the bench's depth context: bench._context) and decodes
DECODE tokens (default 16) with the default switches (speculation on; conversations not saved to disk),
then prints one JSON line: the plan's parts and total, and VmHWM above the post-import baseline (what the
OOM killer sees; tests/test_peak_memory.py does the same at 2k on smollm2)."""
import json
import os
import sys
import time

os.environ.setdefault("TALLOW_PERSIST_KV", "0")


def status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


import torch  # noqa: E402

import tallow  # noqa: E402
from tallow import bench  # noqa: E402

path, ctx = sys.argv[1], int(sys.argv[2])
decode = int(sys.argv[3]) if len(sys.argv) > 3 else 16
base = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS now
t0 = time.time()
llm = tallow.LLM(path, ctx=ctx, device="cpu")
load_peak = status("VmHWM:") - base
ids = bench._context(llm, ctx - decode - 1)
out = llm.generate(ids, max_tokens=decode, temperature=0)
plan = llm.memory
MiB = 1 << 20
print(json.dumps({"model": os.path.basename(path), "ctx": ctx, "prompt": len(ids), "decoded": len(out.tokens) if hasattr(out, "tokens") else decode,
                  "plan": {name: round(b / MiB, 1) for name, b in plan.parts()}, "plan_total_mib": round(plan.total / MiB, 1),
                  "load_peak_mib": round(load_peak / MiB, 1), "peak_mib": round((status("VmHWM:") - base) / MiB, 1),
                  "end_mib": round((status("VmRSS:") - base) / MiB, 1), "peak_over_plan": round((status("VmHWM:") - base) / plan.total, 3),
                  "wall_s": round(time.time() - t0, 1), "threads": torch.get_num_threads()}), flush=True)
