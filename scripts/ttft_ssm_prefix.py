"""Warm-vs-cold time to first token on a recurrent (or any) model: a second request sharing a
long prefix with the first (issue 17's target: >= 10x faster than cold on a Falcon-H1 twin, the
same greedy tokens).

    python scripts/ttft_ssm_prefix.py /tmp/study_twins/falcon-h1-0.5b.gguf [--prefix 2000] [--suffix 48] [--pairs 2]

Token ids, not text (a twin's vocabulary is synthetic): a prefix of random ids, then two different
suffixes (the "questions"). Cold: the second prompt into an empty memory. Warm: the first prompt,
then the second, which reuses the longest prefix the memory holds a state for (memory/recurrent.py:
the checkpoints kept while prefilling the first). Each request generates 8 greedy tokens; the warm
and cold tokens must be equal. Medians over --pairs pairs; every sample printed.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import tallow


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--prefix", type=int, default=2000)
    p.add_argument("--suffix", type=int, default=48)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--tokens", type=int, default=8)
    a = p.parse_args()
    llm = tallow.load(a.model, ctx=a.prefix + 2 * a.suffix + a.tokens + 16, progress=False)
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(0, llm.spec.vocab_size, (n,), generator=g).tolist()

    def ask(prompt: list[int]):
        out = llm.generate(prompt, max_tokens=a.tokens, temperature=0.0)
        return out.tokens, out.stats

    cold, warm, same = [], [], []
    for _ in range(a.pairs):
        prefix, first, second = ids(a.prefix), ids(a.suffix), ids(a.suffix)
        llm.engine.reset()
        cold_tokens, c = ask(prefix + second)
        cold.append(c.ttft_s)
        llm.engine.reset()
        ask(prefix + first)
        warm_tokens, w = ask(prefix + second)
        warm.append(w.ttft_s)
        same.append(warm_tokens == cold_tokens)
    kv = llm.engine.kv
    held = sorted(getattr(kv, "checkpoints", {}))
    print(f"{a.model.split('/')[-1]}: prompt {c.prompt_tokens} tok (prefix {a.prefix} + {a.suffix}); warm reused "
          f"{w.reused_tokens}, prefilled {w.prefill_tokens}; TTFT cold {statistics.median(cold) * 1000:.0f} ms, warm "
          f"{statistics.median(warm) * 1000:.0f} ms, ratio {statistics.median(cold) / statistics.median(warm):.1f}x; "
          f"greedy tokens identical: {all(same)}; threads {torch.get_num_threads()}; checkpoints held at {held}; "
          f"cold {[round(x * 1000) for x in cold]} warm {[round(x * 1000) for x in warm]} ms")
    return 0 if all(same) else 1


if __name__ == "__main__":
    raise SystemExit(main())
