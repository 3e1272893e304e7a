"""A/B decode and prefill speed of switch settings on the twins, in one GPU session.

    python scripts/gpu_ab.py --work /root/twins [--twins a,b] [--tests "-p 0 -n 128"] VAR=VAL[,VAR=VAL] ...

Each argument is one variant (env settings, "base" for none); every twin is benchmarked under
every variant with `tallow bench --json`, and one line per (twin, variant, test) is printed:
tok/s mean ± std over the repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

TWINS = ["smollm2-135m", "gemma3-270m", "qwen25-1.5b", "qwen3-4b"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/root/twins")
    ap.add_argument("--twins", default=",".join(TWINS))
    ap.add_argument("--tests", default="-p 0 -n 128 -r 3")
    ap.add_argument("variants", nargs="+")
    args = ap.parse_args()
    for name in args.twins.split(","):
        for variant in args.variants:
            env = dict(os.environ)
            if variant != "base":
                env.update(kv.split("=", 1) for kv in variant.split(","))
            cmd = [sys.executable, "-m", "tallow.cli", "bench", "-m", f"{args.work}/{name}.gguf", "--device", "cuda",
                   *args.tests.split(), "--json"]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
            if r.returncode != 0:
                print(f"{name:14s} {variant:28s} FAILED: {r.stderr.strip()[-400:]}", flush=True)
                continue
            for row in json.loads(r.stdout):
                test = row["test"] + (f"@{row['depth']}" if row.get("depth") else "")
                print(f"{name:14s} {variant:28s} {test:10s} {row['tok_s_mean']:9.1f} ± {row['tok_s_std']:.1f}", flush=True)


if __name__ == "__main__":
    main()
