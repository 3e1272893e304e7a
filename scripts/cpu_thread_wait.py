#!/usr/bin/env python3
"""Decode milliseconds per step with 1 and 2 torch threads, alternated, on the loaded shared machine:
whether OpenMP's waiting threads (spinning by default; OMP_WAIT_POLICY=PASSIVE: sleeping) starve
the thread doing the work. Run it once as is and once with OMP_WAIT_POLICY=PASSIVE set.

    python scripts/cpu_thread_wait.py MODEL.gguf [--steps 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    import torch

    import tallow

    llm = tallow.load(a.model, ctx=64, device="cpu")
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    for threads in (1, 2, 1, 2):
        torch.set_num_threads(threads)
        engine = llm.engine
        engine.reset()
        token = int(engine.decode_step(5).argmax())  # one untimed step
        t0 = time.perf_counter()
        for _ in range(a.steps):
            token = int(engine.decode_step(token).argmax())
        ms = (time.perf_counter() - t0) / a.steps * 1000
        print(f"{threads} thread(s): {ms:.1f} ms/step  (load {open('/proc/loadavg').read().split()[0]})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
