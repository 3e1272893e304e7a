"""Time or profile N decode steps of a real model on the CPU (dev only; session 11).

  PYTHONPATH=$PWD python scripts/decode_profile.py MODEL [--steps 32] [--threads T] [--profile]
  PYTHONPATH=$PWD python scripts/decode_profile.py MODEL --ab TALLOW_CPU_C_LAYER [--rounds 6]

A 20-token prompt, 4 warm-up steps, then N steps of engine.decode_step with each step's argmax fed
back (bench.bench_decode's loop). Without --profile: tok/s and ms per step; with it: cProfile's 25
largest entries by own time. With --ab NAME: rounds of N steps with the switch NAME at 1 and at 0 in
turn (one process, one model: the pair sees the same minutes), each side's best and median round. The environment picks the path (TALLOW_NUMERICS=ggml, TALLOW_GGML_C_OPS=0 …).
Run timings under the shared lock: flock /tmp/cpu_bench.lock python scripts/decode_profile.py …
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch's (and the C kernel's) threads; 0: torch's default")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ab", metavar="SWITCH", help="alternate SWITCH=1 and =0, round by round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--depth", type=int, default=20, help="prompt tokens prefilled before the steps (the KV depth)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import tallow

    path = args.model if "/" in args.model else os.path.expanduser(f"~/.cache/tallow/models/{args.model}.gguf")
    need = args.depth + 4 + args.steps * (2 * args.rounds if args.ab else 1) + 8
    engine = tallow.load(path, ctx=max(need, 128)).engine  # small: no sliding-window ring
    engine.reset()
    prompt = [100 + i % 900 for i in range(args.depth)]
    for s in range(0, len(prompt), 512):
        engine.prefill_chunk_at(prompt[s : s + 512], s)
    token = 5
    for _ in range(4):
        token = int(engine.decode_step(token).argmax())
    if args.ab:
        from tallow import switches

        times = {"1": [], "0": []}
        for r in range(2 * args.rounds):
            side = "10"[r % 2]
            os.environ[args.ab] = side
            switches.refresh()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                token = int(engine.decode_step(token).argmax())
            times[side].append((time.perf_counter() - t0) / args.steps * 1e3)
        for side, ms in times.items():
            ms.sort()
            print(f"{args.model} {args.ab}={side}: best {ms[0]:.2f} ms/step ({1e3 / ms[0]:.1f} tok/s), median "
                  f"{ms[len(ms) // 2]:.2f} ms ({1e3 / ms[len(ms) // 2]:.1f} tok/s), {torch.get_num_threads()} threads")
        return
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        token = int(engine.decode_step(token).argmax())
    dt = time.perf_counter() - t0
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    print(f"{args.model}: {args.steps / dt:.1f} tok/s ({dt / args.steps * 1e3:.2f} ms/step), {torch.get_num_threads()} threads"
          f"{' (profiled)' if profiler else ''}")


if __name__ == "__main__":
    main()
