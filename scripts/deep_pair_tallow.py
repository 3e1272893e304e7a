"""A model's decode at deep contexts on the CPU, the fill apart from the timing (beside scripts/deep_pair_llama.py):

    DEPTHS=1024,4096,16384,32768 DIR=/tmp/deep MODEL=/tmp/twins/falcon-h1-1.5b.gguf OMP_NUM_THREADS=1 \\
        python scripts/deep_pair_tallow.py fill
    DEPTHS=32768 DIR=/tmp/deep OMP_NUM_THREADS=2 flock -x /tmp/cpu.lock python scripts/deep_pair_tallow.py time 3

`fill` writes the deepest depth's token ids (bench._context) to DIR/tokens.json first, for the llama.cpp side,
then prefills them in the bench's chunks and, on reaching each depth, keeps the recurrent state there
(a checkpoint) and saves the pool with the KV store (one file per depth, `d<depth>`; DIR/filled.json lists the
depths saved). `time` hydrates each depth's file and runs the bench's decode (its rewind is then a truncation, or
for a recurrent state the checkpoint restored): tg64, a warm-up of 8 and N repetitions. Depth 0 needs no file.
`rounds N` interleaves the depths instead: per round one tg64 at each (hydrated again), after a warm-up round.
Every depth shares the deepest context's first tokens, so one fill serves them all. (DEPTH= is DEPTHS= of one.)"""
import json
import os
import sys
import time

import torch

os.environ.setdefault("TALLOW_KV_STORE_BYTES", str(64 << 30))  # a deep hybrid's pool is over the default 2 GiB (read at import)
import tallow
from tallow import bench, bench_depths

MODEL = os.environ.get("MODEL", "/tmp/twins/gemma4-e2b.gguf")
DEPTHS = sorted(int(d) for d in os.environ.get("DEPTHS", os.environ.get("DEPTH", "32768")).split(","))
D, N = os.environ.get("DIR", "/tmp/s13deep"), 64
mode = sys.argv[1]
deepest = DEPTHS[-1]
if mode != "fill" and os.path.exists(D + "/tokens.json"):
    deepest = len(json.load(open(D + "/tokens.json")))  # the fill's context, which every depth is a prefix of
t0 = time.time()
llm = tallow.load(MODEL, ctx=max(deepest, 16) + N, device="cpu")  # Falcon-H1-0.5B: 16320 + 64 = its 16384
eng = llm.engine
eng.kv_store_dir = D + "/kv"
ctx = bench._context(llm, deepest)
if mode == "fill":
    json.dump(ctx, open(D + "/tokens.tmp", "w"))
    os.replace(D + "/tokens.tmp", D + "/tokens.json")  # whole, for the llama.cpp side waiting on it
    done, at = [], 0
    for depth in DEPTHS:
        bench.fill(llm, ctx[at:depth], at)
        at = depth
        if hasattr(eng.kv, "checkpoint"):
            eng.kv.checkpoint(depth)  # the state at this depth, to rewind to (a recurrent state cannot be truncated)
        eng.kv_store.save(f"d{depth}", eng.kv)
        done.append(depth)
        json.dump(done, open(D + "/filled.json", "w"))
        print(f"filled {depth} at {time.time() - t0:.0f} s ({time.strftime('%H:%M:%S')})", flush=True)
elif mode == "rounds":  # depths interleaved, one tg64 each per round: drift in the machine's load hits every depth alike
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    first = int(torch.randint(0, llm.spec.vocab_size, (1,), generator=torch.Generator().manual_seed(0)))
    got = {d: [] for d in DEPTHS}
    for r in range(rounds + 1):  # round 0 warms up
        for depth in sorted(DEPTHS, reverse=True):
            eng.reset()
            if depth:
                assert eng.kv_store.load(f"d{depth}", eng.kv) == depth and eng.kv.tokens == ctx[:depth], depth  # else rewind refills
            speed = bench_depths.time_decode(llm, ctx[:depth], first, N)
            if r:
                got[depth].append(speed)
    for d in DEPTHS:
        print(json.dumps({"tallow_tg64": d, "rounds": got[d], "median": sorted(got[d])[len(got[d]) // 2],
                          "end": time.strftime("%H:%M:%S"), "load": os.getloadavg()[0]}), flush=True)
else:
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    first = int(torch.randint(0, llm.spec.vocab_size, (1,), generator=torch.Generator().manual_seed(0)))
    for depth in sorted(DEPTHS, reverse=True):
        if depth:
            eng.reset()
            n = eng.kv_store.load(f"d{depth}", eng.kv)
            assert n == depth and eng.kv.tokens == ctx[:depth], (n, depth)
        bench_depths.time_decode(llm, ctx[:depth], first, 8)  # warm-up
        speeds = [bench_depths.time_decode(llm, ctx[:depth], first, N) for _ in range(reps)]
        print(json.dumps({"tallow_tg64": depth, "samples": speeds, "mean": sum(speeds) / len(speeds), "median": sorted(speeds)[len(speeds) // 2],
                          "threads": torch.get_num_threads(), "kernel": bench._cpu_kernel(llm),
                          "end": time.strftime("%H:%M:%S"), "load": os.getloadavg()[0]}), flush=True)
