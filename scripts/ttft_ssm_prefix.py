"""Warm-vs-cold time to first token on a recurrent (or any) model: a second request sharing a
long prefix with the first (issue 17's target: >= 10x faster than cold on a Falcon-H1 twin, the
same greedy tokens).

    python scripts/ttft_ssm_prefix.py /tmp/study_twins/falcon-h1-0.5b.gguf [--prefix 2000] [--suffix 48] [--pairs 2]
        [--tail-cuts "1,1;2,1"]     # memory/recurrent.TAIL_CUTS settings to compare, one cold run for all
                                    # ("1,1": the last chunk cut only min_rows before the end, as before)

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
    p.add_argument("--tail-cuts", default=None, help="settings of memory/recurrent.TAIL_CUTS, ';'-separated")
    a = p.parse_args()
    from tallow.memory import recurrent

    engine_cuts = recurrent.TAIL_CUTS
    settings = [tuple(int(x) for x in t.split(",")) for t in a.tail_cuts.split(";")] if a.tail_cuts else [recurrent.TAIL_CUTS]
    llm = tallow.load(a.model, ctx=a.prefix + 2 * a.suffix + a.tokens + 16, progress=False)
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(0, llm.spec.vocab_size, (n,), generator=g).tolist()

    def ask(prompt: list[int]):
        out = llm.generate(prompt, max_tokens=a.tokens, temperature=0.0)
        return out.tokens, out.stats

    ask(ids(64))  # the first request pays one-time costs (page faults, allocations): not the cold one
    cold, warm, same, stats = [], {t: [] for t in settings}, [], {}
    for _ in range(a.pairs):
        prefix, first, second = ids(a.prefix), ids(a.suffix), ids(a.suffix)
        recurrent.TAIL_CUTS = engine_cuts  # the cold run is the engine's own
        llm.engine.reset()
        cold_tokens, c = ask(prefix + second)
        cold.append(c.ttft_s)
        for cuts in settings:
            recurrent.TAIL_CUTS = cuts
            llm.engine.reset()
            ask(prefix + first)
            warm_tokens, w = ask(prefix + second)
            stats[cuts] = (w.reused_tokens, w.prefill_tokens, w.ttft_s)
            warm[cuts].append(w.ttft_s)
            same.append(warm_tokens == cold_tokens)
    print(f"{a.model.split('/')[-1]}: prompt {c.prompt_tokens} tok (prefix {a.prefix} + {a.suffix}); cold TTFT "
          f"{statistics.median(cold) * 1000:.0f} ms {[round(x * 1000) for x in cold]}; threads {torch.get_num_threads()}")
    for cuts in settings:
        reused, prefilled, _ = stats[cuts]
        print(f"  TAIL_CUTS {cuts}: warm reused {reused}, prefilled {prefilled}; TTFT "
              f"{statistics.median(warm[cuts]) * 1000:.0f} ms {[round(x * 1000) for x in warm[cuts]]}, "
              f"ratio {statistics.median(cold) / statistics.median(warm[cuts]):.1f}x")
    print(f"  greedy tokens identical to cold in every warm run: {all(same)}")
    return 0 if all(same) else 1


if __name__ == "__main__":
    raise SystemExit(main())
