"""`tallow bench`: prefill and decode speed measured the way llama-bench measures them.

pp N: prefill N tokens into an empty KV pool, one forward pass (in prefill chunks).
tg N: generate N tokens one at a time from an empty context (greedy on the logits).
Each test runs once untimed to warm up, then `repetitions` times; we report mean and
standard deviation of tokens per second, like llama-bench.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

from .errors import UsageError


def _lengths(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated token counts, not {text!r}.") from None
    if any(v < 0 for v in values):
        raise UsageError(f"{flag} takes non-negative token counts.")
    return [v for v in values if v > 0]


def bench_prefill(llm, n: int, generator: torch.Generator) -> float:
    tokens = torch.randint(0, llm.spec.vocab_size, (n,), generator=generator).tolist()
    engine = llm.engine
    engine.reset()
    t0 = time.perf_counter()
    for start in range(0, n, engine.prefill_chunk):
        engine.model.forward(tokens[start : start + engine.prefill_chunk], start, engine.kv)
    return n / (time.perf_counter() - t0)


def bench_decode(llm, n: int, generator: torch.Generator) -> float:
    engine = llm.engine
    engine.reset()
    token = int(torch.randint(0, llm.spec.vocab_size, (1,), generator=generator))
    t0 = time.perf_counter()
    for pos in range(n):
        logits = engine.model.forward([token], pos, engine.kv)
        token = int(logits[-1].argmax())
    return n / (time.perf_counter() - t0)


def run_bench(args: argparse.Namespace) -> int:
    from .api import load

    prompts = _lengths(args.n_prompt, "-p")
    gens = _lengths(args.n_gen, "-n")
    if args.repetitions < 1:
        raise UsageError("-r takes a positive number of repetitions.")
    need = max(prompts + gens + [1])
    llm = load(args.model, ctx=max(need, 16), mem_budget=getattr(args, "mem_budget", None), reserve=getattr(args, "reserve", None))
    generator = torch.Generator().manual_seed(0)
    rows = []
    tests = [("pp", n, bench_prefill) for n in prompts] + [("tg", n, bench_decode) for n in gens]
    for kind, n, fn in tests:
        fn(llm, n, generator)  # warm-up
        speeds = [fn(llm, n, generator) for _ in range(args.repetitions)]
        rows.append(
            {
                "model": llm.spec.name,
                "file": llm.path,
                "test": f"{kind}{n}",
                "n": n,
                "repetitions": args.repetitions,
                "tok_s_mean": statistics.mean(speeds),
                "tok_s_std": statistics.stdev(speeds) if len(speeds) > 1 else 0.0,
                "tok_s_median": statistics.median(speeds),
                "samples": speeds,
                "threads": torch.get_num_threads(),
                "device": "cpu",
                "machine": platform.processor() or platform.machine(),
            }
        )
        if not args.json:
            print(f"  {kind}{n}: {rows[-1]['tok_s_mean']:.1f} ± {rows[-1]['tok_s_std']:.1f} tok/s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"| model | test | t/s |\n| --- | --- | ---: |")
        for r in rows:
            print(f"| {r['model']} | {r['test']} | {r['tok_s_mean']:.2f} ± {r['tok_s_std']:.2f} |")
    return 0
