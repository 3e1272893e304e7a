"""Top CUDA kernels of one prefill or decode call (torch.profiler), on a GPU.

    python scripts/gpu_profile.py MODEL [--prefill 512] [--decode 16] [--sequence] [--ctx N]

--sequence also prints the last decode step's kernels in launch order with their times (the
kernels of one CUDA-graph replay share the launch's correlation id), which says which GEMV is
which matrix.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=0)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--sequence", action="store_true")
    ap.add_argument("--ctx", type=int, default=0, help="the cache's slots (default: the prefill and decode's tokens + 16)")
    args = ap.parse_args()
    import tallow

    llm = tallow.LLM(args.model, ctx=args.ctx or max(args.prefill, 1) + args.decode + 16, device="cuda")
    ids = torch.randint(0, llm.spec.vocab_size, (args.prefill,), generator=torch.Generator().manual_seed(0)).tolist()
    for _ in range(2):  # warm-up: JIT, cuBLAS heuristics, graph capture
        llm.engine.reset()
        llm.model.forward(ids, 0, llm.engine.kv)
        for i in range(args.decode):
            llm.engine.decode_step(ids[i % len(ids)])
    torch.cuda.synchronize()
    llm.engine.reset()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        llm.model.forward(ids, 0, llm.engine.kv)
        for i in range(args.decode):
            llm.engine.decode_step(ids[i % len(ids)])
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12))
    if args.sequence:
        print_last_replay(prof)


def print_last_replay(prof) -> None:
    import json
    import tempfile
    from collections import defaultdict

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    replays = defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel":
            replays[e.get("args", {}).get("correlation")].append(e)
    last = max(replays.values(), key=lambda ks: (len(ks) > 50, ks[0]["ts"]))
    last.sort(key=lambda e: e["ts"])
    span = last[-1]["ts"] + last[-1]["dur"] - last[0]["ts"]
    busy = sum(e["dur"] for e in last)
    print(f"last replay: {len(last)} kernels, {span:.1f} us from first start to last end, {busy:.1f} us busy")
    by_name = defaultdict(list)  # the step's kernels by name: where its time goes
    for e in last:
        by_name[e["name"][:70]].append(e["dur"])
    print(f"{'launches':>8} {'total us':>9} {'mean us':>8}  kernel (last replay, by total)")
    for name, durs in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"{len(durs):8d} {sum(durs):9.1f} {sum(durs) / len(durs):8.2f}  {name}")
    for i, e in enumerate(last):
        print(f"{i:5d} {e['dur']:8.2f} {e['name'][:90]}")


if __name__ == "__main__":
    main()
