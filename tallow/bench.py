"""`tallow bench`: prefill and decode speed measured the way llama-bench measures them.

pp N: prefill N tokens into an empty KV pool, one forward pass (in prefill chunks).
tg N: generate N tokens one at a time from an empty context (greedy on the logits).
-d D: both after D tokens of context, prefilled untimed (llama-bench's -d applies to pp and tg alike)
once per test; each run rewinds the pool to them (`rewind`), as llama-bench restores its depth state.
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
from .kernels.gpu.machine_state import describe, machine_state
from .registry import display_name
from .sampling import greedy


def _lengths(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated token counts, not {text!r}.") from None
    if any(v < 0 for v in values):
        raise UsageError(f"{flag} takes non-negative token counts.")
    return [v for v in values if v > 0]


def _sync(llm) -> None:
    if llm.model.device.type == "cuda":
        torch.cuda.synchronize(llm.model.device)


def fill(llm, tokens: list[int], at: int) -> None:
    """tokens written at positions at.., in prefill chunks."""
    engine = llm.engine
    for start in range(0, len(tokens), engine.prefill_chunk):
        engine.prefill_chunk_at(tokens[start : start + engine.prefill_chunk], at + start)


def rewind(llm, context: list[int]) -> None:
    """Make the memory hold exactly `context`: a truncation when it is still there (for a
    recurrent state, the checkpoint kept at its end), else prefilled again from empty — as
    llama-bench b11434 restores its cached depth state instead of refilling it."""
    kv, n = llm.engine.kv, len(context)
    if n and kv.tokens[:n] == context:
        kv.truncate(n)
        if len(kv.tokens) == n:
            return
    llm.engine.reset()
    fill(llm, context, 0)
    if n and hasattr(kv, "checkpoint"):
        kv.checkpoint(n)  # a recurrent memory keeps its state here to rewind to (none with TALLOW_STATE_CHECKPOINTS=0)


def _context(llm, depth: int) -> list[int]:
    """The depth's tokens: the same for every repetition of a test, so each rewinds to them."""
    return torch.randint(0, llm.spec.vocab_size, (depth,), generator=torch.Generator().manual_seed(depth)).tolist()


def bench_prefill(llm, n: int, depth: int, generator: torch.Generator) -> float:
    """n prompt tokens after `depth` tokens of context (prefilled, untimed)."""
    rewind(llm, _context(llm, depth))
    tokens = torch.randint(0, llm.spec.vocab_size, (n,), generator=generator).tolist()
    _sync(llm)
    t0 = time.perf_counter()
    fill(llm, tokens, depth)
    _sync(llm)
    return n / (time.perf_counter() - t0)


def bench_decode(llm, n: int, depth: int, generator: torch.Generator) -> float:
    """n tokens one at a time after `depth` tokens of context (prefilled, untimed), each
    step's argmax fed back as the next token — the decode loop's real path (a CUDA graph
    on the GPU)."""
    engine = llm.engine
    rewind(llm, _context(llm, depth))
    token = int(torch.randint(0, llm.spec.vocab_size, (1,), generator=generator))
    _sync(llm)
    t0 = time.perf_counter()
    for _ in range(n):
        token = greedy(engine.decode_step(token))  # the sampler's greedy path
    return n / (time.perf_counter() - t0)


def _cpu_kernel(llm) -> str | None:
    """Whether CPU decode products run in the C kernel (kernels/cpu/ggml_dot.py), for the record."""
    if str(llm.model.device) != "cpu":
        return None
    from .kernels.cpu import ggml_dot

    return ggml_dot.in_use_status()


def run_bench(args: argparse.Namespace) -> int:
    from .api import load

    prompts = _lengths(args.n_prompt, "-p")
    gens = _lengths(args.n_gen, "-n")
    if not prompts and not gens:
        raise UsageError("-p and -n are all 0: there is nothing to measure (give a prompt or generation length above 0).")
    if args.repetitions < 1:
        raise UsageError("-r takes a positive number of repetitions.")
    depths = [int(d) for d in args.depth.split(",")] if args.depth else [0]
    if any(d < 0 for d in depths):
        raise UsageError("-d takes non-negative depths.")
    need = max([n + d for n in prompts + gens for d in depths] + [1])
    llm = load(args.model, ctx=max(need, 16), mem_budget=getattr(args, "mem_budget", None),
               reserve=getattr(args, "reserve", None), device=getattr(args, "device", None),
               kv_dtype=getattr(args, "kv_dtype", None))
    generator = torch.Generator().manual_seed(0)
    if not args.json and _cpu_kernel(llm):
        print(f"  C kernel: {_cpu_kernel(llm)}", file=sys.stderr)
    rows = []
    tests = [("pp", n, d, bench_prefill) for n in prompts for d in depths] + [("tg", n, d, bench_decode) for n in gens for d in depths]
    for kind, n, depth, fn in tests:
        fn(llm, n, depth, generator)  # warm-up (and, on the GPU, graph capture)
        speeds = [fn(llm, n, depth, generator) for _ in range(args.repetitions)]
        rows.append(
            {
                "model": display_name(llm.path),  # the registry name, not the GGUF's general.name
                "file": llm.path,
                "test": f"{kind}{n}" + (f" @ d{depth}" if depth else ""),
                "depth": depth,
                "n": n,
                "repetitions": args.repetitions,
                "tok_s_mean": statistics.mean(speeds),
                "tok_s_std": statistics.stdev(speeds) if len(speeds) > 1 else 0.0,
                "tok_s_median": statistics.median(speeds),
                "samples": speeds,
                "threads": torch.get_num_threads(),
                "device": str(llm.model.device),
                "machine": platform.processor() or platform.machine(),
                "cpu_kernel": _cpu_kernel(llm),
                "state": machine_state(llm.model.device),  # clocks, temperature, power, load, read right after
            }
        )
        if not args.json:
            state = describe(rows[-1]["state"])
            print(f"  {rows[-1]['test']}: {rows[-1]['tok_s_mean']:.1f} ± {rows[-1]['tok_s_std']:.1f} tok/s"
                  + (f"  [{state}]" if state else ""), file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("| model | test | t/s |\n| --- | --- | ---: |")
        for r in rows:
            print(f"| {r['model']} | {r['test']} | {r['tok_s_mean']:.2f} ± {r['tok_s_std']:.2f} |")
    return 0
