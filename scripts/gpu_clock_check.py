"""Does `stats.prefill_s` time the GPU's prefill? (issue 12: it read 0.21 ms for an 8.9 ms prefill)

    python scripts/gpu_clock_check.py MODEL.gguf [--tokens 33]

Prints prefill_s and ttft_s of a few greedy generations of a random prompt (the pool reset
before each, so nothing is reused): with the device wait in place prefill_s is within the
sampling time of ttft_s; without it, it is a fraction.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=33)
    args = ap.parse_args()
    import tallow
    from tallow.engine.engine import GenerationStats
    from tallow.sampling import Sampler, SamplingParams

    llm = tallow.LLM(args.model, ctx=512, device="cuda")
    ids = torch.randint(0, llm.spec.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = Sampler(SamplingParams(temperature=0), llm.spec.vocab_size)
    for i in range(5):
        llm.engine.reset()
        stats = GenerationStats()
        list(llm.engine.generate(ids, 2, sampler, set(), stats))
        print(f"run {i}: prefill {stats.prefill_tokens} tok, prefill_s {stats.prefill_s * 1e3:.2f} ms, "
              f"ttft_s {stats.ttft_s * 1e3:.2f} ms, prefill tok/s {stats.prefill_tok_s:.0f}", flush=True)


if __name__ == "__main__":
    main()
