"""CPU decode attention over an f16 cache: the C kernel (TALLOW_CPU_C_ATTENTION) against torch's path, one
Gemma-4-E2B global layer (1 KV head x 512, 8 query heads) at a given depth (docs/performance.md, session 10 CPU).

    python scripts/c_attention_bench.py [--positions 32768] [--reps 5]
"""

import argparse
import time

import torch

from tallow.kernels.cpu import c_attention
from tallow.layers import attend_keys

ap = argparse.ArgumentParser()
ap.add_argument("--positions", type=int, default=32768)
ap.add_argument("--reps", type=int, default=5)
args = ap.parse_args()
n = args.positions
k, v, q = torch.randn(1, n, 512).half(), torch.randn(1, n, 512).half(), torch.randn(1, 8, 512)
ref = attend_keys(q, k.float(), v.float(), 0.1)
print(f"relative error {float((c_attention.attend_f16(q, k, v, 0, n, 0.1) - ref).norm() / ref.norm()):.1e}")
for name, f in (("C", lambda: c_attention.attend_f16(q, k, v, 0, n, 0.1)), ("torch", lambda: attend_keys(q, k.float(), v.float(), 0.1))):
    f()
    t = time.perf_counter()
    for _ in range(args.reps):
        f()
    print(f"{name}: {(time.perf_counter() - t) / args.reps * 1e3:.1f} ms at {n} positions, {torch.get_num_threads()} threads")
