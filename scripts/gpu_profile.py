"""Top CUDA kernels of one prefill or decode call (torch.profiler), on a GPU.

    python scripts/gpu_profile.py MODEL [--prefill 512] [--decode 16]
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
    args = ap.parse_args()
    import tallow

    llm = tallow.LLM(args.model, ctx=max(args.prefill, 1) + args.decode + 16, device="cuda")
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


if __name__ == "__main__":
    main()
