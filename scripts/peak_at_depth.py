"""The process's peak memory through a long prompt, against the memory plan:

    python scripts/peak_at_depth.py MODEL CTX [DECODE]      # e.g. /tmp/twins/falcon-h1-1.5b.gguf 32768
    python scripts/peak_at_depth.py MODEL CTX [DECODE] --device cuda

A fresh process resets the kernel's high-water mark after importing torch and tallow, loads MODEL at
context CTX, prefills CTX - DECODE - 1 tokens (the bench's depth context: bench._context) and decodes
DECODE tokens (default 16) with the default switches (speculation on; conversations not saved to disk),
then prints one JSON line: the plan's parts and total, and VmHWM above the post-import baseline (what the
OOM killer sees; tests/test_peak_memory.py does the same at 2k on smollm2).

On a GPU (--device cuda) the same run reports, against the plan's GPU account: the caching allocator's peak
of allocated and of reserved bytes (weights, KV, state, scratch, the decode graphs' pools), and the device's
used memory above what it was after the CUDA context was made (mem_get_info: also cuBLAS's workspaces and
Triton's loaded kernels, which the plan's "runtime" allowance stands for)."""
import argparse
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

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("ctx", type=int)
ap.add_argument("decode", type=int, nargs="?", default=16)
ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
args = ap.parse_args()
path, ctx, decode, on_gpu = args.model, args.ctx, args.decode, args.device == "cuda"
MiB = 1 << 20
if on_gpu:
    free0, whole = torch.cuda.mem_get_info()  # makes the CUDA context
    t0 = time.time()
    llm = tallow.LLM(path, ctx=ctx, device="cuda")
    torch.cuda.synchronize()
    after_load = torch.cuda.memory_allocated()
    ids = bench._context(llm, ctx - decode - 1)
    llm.generate(ids, max_tokens=decode, temperature=0)
    torch.cuda.synchronize()
    plan = llm.memory
    used = free0 - torch.cuda.mem_get_info()[0]
    print(json.dumps({"model": os.path.basename(path), "ctx": ctx, "prompt": len(ids), "device": torch.cuda.get_device_name(),
                      "plan": {name: round(b / MiB, 1) for name, b in plan.parts()}, "plan_total_mib": round(plan.total / MiB, 1),
                      "plan_without_runtime_mib": round((plan.total - plan.runtime) / MiB, 1),
                      "allocated_after_load_mib": round(after_load / MiB, 1),
                      "peak_allocated_mib": round(torch.cuda.max_memory_allocated() / MiB, 1),
                      "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / MiB, 1),
                      "device_used_mib": round(used / MiB, 1), "device_used_over_plan": round(used / plan.total, 3),
                      "wall_s": round(time.time() - t0, 1)}), flush=True)
    sys.exit(0)
base = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS now
t0 = time.time()
llm = tallow.LLM(path, ctx=ctx, device="cpu")
load_peak = status("VmHWM:") - base
ids = bench._context(llm, ctx - decode - 1)
out = llm.generate(ids, max_tokens=decode, temperature=0)
plan = llm.memory
print(json.dumps({"model": os.path.basename(path), "ctx": ctx, "prompt": len(ids), "decoded": len(out.tokens) if hasattr(out, "tokens") else decode,
                  "plan": {name: round(b / MiB, 1) for name, b in plan.parts()}, "plan_total_mib": round(plan.total / MiB, 1),
                  "load_peak_mib": round(load_peak / MiB, 1), "peak_mib": round((status("VmHWM:") - base) / MiB, 1),
                  "end_mib": round((status("VmRSS:") - base) / MiB, 1), "peak_over_plan": round((status("VmHWM:") - base) / plan.total, 3),
                  "wall_s": round(time.time() - t0, 1), "threads": torch.get_num_threads()}), flush=True)
