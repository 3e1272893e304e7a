"""llama-bench's `-o jsonl` lines (stdin) -> one line per test with its steady speed: the mean of
its repetitions after the first (the first repetition of a prompt test runs 1.5-3x slower).
The reading is tallow.bench_depths.llama_bench_rows's, which `tallow bench --depths --llama-bench` uses.

    llama-bench -m M.gguf ... -o jsonl | python scripts/llama_samples.py
"""

import json
import sys

from tallow.bench_depths import steady

for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    xs = r["samples_ts"]
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    print(f"llama.cpp | {r['model_filename'].split('/')[-1]} | {test} @ d{r.get('n_depth', 0)} | steady "
          f"{steady(xs):.1f} t/s | samples {[round(x, 1) for x in xs]}", flush=True)
