"""Speculative verification on the GPU: exactness and the cost of a pass by its size (run there).

    python scripts/gpu_speculate.py MODEL.gguf [MODEL.gguf ...] [--depth 512] [--reps 200]

For each model (twins are fine: this measures kernels, not text):
  exact: 24 random tokens decoded one by one through the decode graph, then again in
         verification passes of 1, 3, 8, 5, 2, 5 tokens (engine.decode_rows, a graph per size):
         every row must equal the decode graph's logits bit for bit;
  cost:  milliseconds per pass of m = 1..8 tokens at a given depth (decode_step for m = 1,
         decode_rows otherwise), synchronised per pass as the decode loop is, and t(m)/t(1).
With t(m) and an acceptance rate a, a draft of k = m - 1 tokens commits 1 + a + ... + a^k tokens
per pass: the speed-up over plain decoding is that over t(m)/t(1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def exactness(llm, n_prefill: int = 8) -> dict:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, llm.spec.vocab_size, (n_prefill + 24,), generator=gen).tolist()
    engine = llm.engine
    engine.reset()
    engine.model.forward(ids[:n_prefill], 0, engine.kv)
    steps = torch.stack([engine.decode_step(t).float().cpu() for t in ids[n_prefill:]])
    engine.reset()
    engine.model.forward(ids[:n_prefill], 0, engine.kv)
    rows, i = [], n_prefill
    for m in (1, 3, 8, 5, 2, 5):
        chunk = ids[i : i + m]
        rows.append(engine.decode_step(chunk[0]).float().cpu()[None] if m == 1 else engine.decode_rows(chunk).float().cpu())
        i += m
    rows = torch.cat(rows)
    return {"rows_equal_steps": bool(torch.equal(rows, steps)), "max_abs": float((rows - steps).abs().max()),
            "top1_equal": bool(torch.equal(rows.argmax(-1), steps.argmax(-1)))}


def costs(llm, depth: int, reps: int) -> dict:
    engine = llm.engine
    engine.reset()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, llm.spec.vocab_size, (depth + 8,), generator=gen).tolist()
    engine.prefill(ids[:depth], _stats())
    out = {}
    for m in range(1, 9):
        chunk = ids[depth : depth + m]
        times = []
        for r in range(reps + 5):
            t0 = time.perf_counter()
            logits = engine.decode_step(chunk[0]) if m == 1 else engine.decode_rows(chunk)
            if logits.is_cuda:
                torch.cuda.synchronize()
            if r >= 5:  # the first passes capture the graphs
                times.append(time.perf_counter() - t0)
            engine.kv.truncate(depth)
            del logits
        out[m] = statistics.median(times) * 1e3
    return {"ms_per_pass": {m: round(t, 4) for m, t in out.items()},
            "relative": {m: round(t / out[1], 3) for m, t in out.items()}}


def _stats():
    from tallow.engine.engine import GenerationStats

    return GenerationStats()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script (no graphs)")
    args = ap.parse_args()
    import tallow

    ok = True
    for path in args.models:
        llm = tallow.LLM(path, ctx=2048, device=args.device)
        result = {"model": Path(path).stem, "exact": exactness(llm), "cost": costs(llm, args.depth, args.reps)}
        ok &= result["exact"]["rows_equal_steps"]
        print(json.dumps(result), flush=True)
        del llm
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
