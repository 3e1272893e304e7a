"""Cold and warm start of `tallow run` next to llama.cpp's `llama-cli` on the same GGUF files.

    python scripts/load_times.py [-r 3] [--llama /tmp/llama] MODEL.gguf ...

Per model and repeat, one after the other (the machine is shared: repeats, median and min):
  tallow cold   `tallow run -m MODEL -p PROMPT -n 1 --raw`, the weight cache emptied first (packs, writes)
  tallow warm   the same again (maps the cache)
  first byte    warm, -n 16: seconds from process start to the first byte of the answer on stdout
  llama-cli     `llama-cli -m MODEL -p PROMPT -n 1 -st -t 2` (maps the file, warms up, answers)
`exit` = the process's wall time from start (imports included); `load` = tallow's own load
figure (its stderr stats line: LLM() from opening the file to a ready engine).
The GGUF files stay in the page cache throughout (no cache drop: the machine is shared).
Uses TALLOW_HOME=/tmp/tallow-load-times so the user's cache is left alone.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "The capital of France is"
HOME = Path("/tmp/tallow-load-times")


def tallow_run(model: str, n: int) -> tuple[float, float, float]:
    """(seconds to the first answer byte, seconds to exit, tallow's load seconds)."""
    env = {**os.environ, "TALLOW_HOME": str(HOME), "TALLOW_PROGRESS": "0"}
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "tallow.cli", "run", "-m", model, "-p", PROMPT, "-n", str(n), "--raw"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first_byte = p.stdout.read(1)
    first = time.perf_counter() - t0
    _, err = p.communicate()
    wall = time.perf_counter() - t0
    if p.returncode != 0 or not first_byte:
        raise SystemExit(f"tallow run failed ({p.returncode}): {err.decode()[-500:]}")
    m = re.search(r"load (\d+) ms", err.decode())
    return first, wall, int(m.group(1)) / 1000 if m else float("nan")


def llama_cli(llama: Path, model: str) -> float:
    env = {**os.environ, "LD_LIBRARY_PATH": str(llama)}
    t0 = time.perf_counter()
    r = subprocess.run([str(llama / "llama-cli"), "-m", model, "-p", PROMPT, "-n", "1", "-st", "-t", "2"],
                       stdin=subprocess.DEVNULL, capture_output=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"llama-cli failed ({r.returncode}): {r.stderr.decode()[-500:]}")
    return time.perf_counter() - t0


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
    print("| model | tallow cold: exit / load s | tallow warm: exit / load s | tallow warm: first answer byte s | llama-cli exit s |")
    print("|---|---|---|---|---|")
    for model in args.models:
        cold_exit, cold_load, warm_exit, warm_load, warm_first, llama = [], [], [], [], [], []
        for _ in range(args.repeats):
            clear_cache()
            _, wall, load = tallow_run(model, 1)  # packs, writes the cache
            cold_exit.append(wall)
            cold_load.append(load)
            _, wall, load = tallow_run(model, 1)  # maps it
            warm_exit.append(wall)
            warm_load.append(load)
            warm_first.append(tallow_run(model, 16)[0])
            llama.append(llama_cli(args.llama, model))
        print(f"| {Path(model).stem} | {fmt(cold_exit)} / {fmt(cold_load)} | {fmt(warm_exit)} / {fmt(warm_load)} |"
              f" {fmt(warm_first)} | {fmt(llama)} |", flush=True)


if __name__ == "__main__":
    main()
