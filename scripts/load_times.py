"""Cold and warm start of `tallow run` next to llama.cpp's `llama-cli` on the same GGUF files.

    python scripts/load_times.py [-r 3] [--llama /tmp/llama] MODEL.gguf ...

Per model and repeat, one after the other (the machine is shared: repeats, median and min):
  tallow cold   `tallow run -m MODEL -p PROMPT -n 1 --raw`, the weight cache emptied first (packs, writes)
  tallow warm   the same again (maps the cache)
  first byte    warm, -n 16: seconds from process start to the first byte of the answer on stdout
  llama-cli     `llama-cli -m MODEL -p PROMPT -n 1 -st -t 2` (maps the file, warms up, answers)
`exit` = the process's wall time from start (imports included); `load` = tallow's own load
figure (its stderr stats line: LLM() from opening the file to a ready engine); `CPU s` = the
process's user + system CPU seconds, which a busy machine inflates far less than wall time.
The GGUF files stay in the page cache throughout (no cache drop: the machine is shared).
Uses TALLOW_HOME=/tmp/tallow-load-times so the user's cache is left alone.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "The capital of France is"
HOME = Path("/tmp/tallow-load-times")
CPU: list[float] = []  # CPU seconds (user + system) of each child, in run order


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tallow_run(model: str, n: int) -> tuple[float, float, float]:
    """(seconds to the first answer byte, seconds to exit, tallow's load seconds); the child's CPU
    seconds go to CPU[-1]."""
    env = {**os.environ, "TALLOW_HOME": str(HOME), "TALLOW_PROGRESS": "0"}
    c0, t0 = _child_cpu(), time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "tallow.cli", "run", "-m", model, "-p", PROMPT, "-n", str(n), "--raw"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first_byte = p.stdout.read(1)
    first = time.perf_counter() - t0
    _, err = p.communicate()
    wall = time.perf_counter() - t0
    CPU.append(_child_cpu() - c0)
    if p.returncode != 0 or not first_byte:
        raise SystemExit(f"tallow run failed ({p.returncode}): {err.decode()[-500:]}")
    m = re.search(r"load (\d+) ms", err.decode())
    return first, wall, int(m.group(1)) / 1000 if m else float("nan")


def llama_cli(llama: Path, model: str) -> float:
    env = {**os.environ, "LD_LIBRARY_PATH": str(llama)}
    c0, t0 = _child_cpu(), time.perf_counter()
    r = subprocess.run([str(llama / "llama-cli"), "-m", model, "-p", PROMPT, "-n", "1", "-st", "-t", "2"],
                       stdin=subprocess.DEVNULL, capture_output=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"llama-cli failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    wall = time.perf_counter() - t0
    CPU.append(_child_cpu() - c0)
    return wall


def clear_cache() -> None:
    shutil.rmtree(HOME / "packed", ignore_errors=True)


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} (min {min(xs):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("-r", "--repeats", type=int, default=3)
    ap.add_argument("--llama", type=Path, default=Path("/tmp/llama"))
    args = ap.parse_args()
    print("| model | tallow cold: exit / load s (CPU s) | tallow warm: exit / load s (CPU s) | tallow warm: first answer byte s |"
          " llama-cli -n 1: exit s (CPU s) |")
    print("|---|---|---|---|---|")
    for model in args.models:
        cold, warm, first, llama = [[], [], []], [[], [], []], [], [[], []]
        for _ in range(args.repeats):
            clear_cache()
            for row in (cold, warm):  # packs and writes the cache, then maps it
                _, wall, load = tallow_run(model, 1)
                for i, v in enumerate((wall, load, CPU[-1])):
                    row[i].append(v)
            first.append(tallow_run(model, 16)[0])
            llama[0].append(llama_cli(args.llama, model))
            llama[1].append(CPU[-1])
        cell = lambda row: f"{fmt(row[0])} / {fmt(row[1])} ({fmt(row[2])})"  # noqa: E731
        print(f"| {Path(model).stem} | {cell(cold)} | {cell(warm)} | {fmt(first)} | {fmt(llama[0])} ({fmt(llama[1])}) |",
              flush=True)


if __name__ == "__main__":
    main()
