"""A model's decode at a deep KV on the CPU, the fill apart from the timing (beside scripts/deep_pair_llama.py):

    DEPTH=32768 DIR=/tmp/deep MODEL=/tmp/twins/gemma4-e2b.gguf python scripts/deep_pair_tallow.py fill
    DEPTH=32768 DIR=/tmp/deep flock -x /tmp/cpu.lock python scripts/deep_pair_tallow.py time 3

`fill` prefills the bench's depth context once (bench._context) and saves the pool with the KV store, and writes
the token ids to DIR/tokens.json for the llama.cpp side; `time` hydrates the pool and runs the bench's decode
(its rewind is then a truncation): tg64, a warm-up of 8 and N repetitions."""
import json
import os
import sys
import time

import torch

import tallow
from tallow import bench

MODEL, DEPTH, N = os.environ.get("MODEL", "/tmp/twins/gemma4-e2b.gguf"), int(os.environ.get("DEPTH", 32768)), 64
CTX = DEPTH + 256
D = os.environ.get("DIR", "/tmp/s13deep")
mode = sys.argv[1]
t0 = time.time()
llm = tallow.load(MODEL, ctx=CTX, device="cpu")
eng = llm.engine
eng.kv_store_dir = D + "/kv"
ctx = bench._context(llm, DEPTH)
if mode == "fill":
    bench.fill(llm, ctx, 0)
    print(f"filled {len(eng.kv.tokens)} in {time.time() - t0:.0f} s", flush=True)
    print("saved", eng.kv_store.save("deep32k", eng.kv), flush=True)
    json.dump(ctx, open(D + "/tokens.json", "w"))
else:
    n = eng.kv_store.load("deep32k", eng.kv)
    assert n == DEPTH and eng.kv.tokens == ctx, n
    print(f"hydrated {n} in {time.time() - t0:.1f} s", flush=True)
    g = torch.Generator().manual_seed(0)
    bench.bench_decode(llm, 8, DEPTH, g)  # warm-up
    speeds = [bench.bench_decode(llm, N, DEPTH, g) for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3)]
    print(json.dumps({"tallow_tg64_d32768": speeds, "threads": torch.get_num_threads(),
                      "kernel": bench._cpu_kernel(llm)}), flush=True)
