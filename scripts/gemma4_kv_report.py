#!/usr/bin/env python3
"""KV memory of one GGUF at one context: tallow's plan, tallow's allocated pool, and llama.cpp's own
report for the same file (the `llama_kv_cache: size = ...` lines it logs when it creates a context).

    python scripts/gemma4_kv_report.py MODEL.gguf [--ctx 32768] [--llama-cli /tmp/llama/llama-cli]

Prints one table row per figure (bytes, and MiB); exits 1 if tallow's plan differs from its pool or
tallow needs more than llama.cpp.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MIB = 1 << 20


def llama_cpp_kv(cli: str, model: str, ctx: int) -> tuple[int, list[str]]:
    """llama.cpp's KV bytes (its logged sizes summed over the caches of the last context it built:
    llama-cli builds one to fit its parameters first) and the lines they came from."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "llama.log"
        env = dict(os.environ, LD_LIBRARY_PATH=str(Path(cli).parent))
        subprocess.run([cli, "-m", model, "-c", str(ctx), "-t", "2", "-st", "-p", "hi", "-n", "1", "--no-warmup",
                        "-v", "--log-file", str(log)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env, timeout=900, check=False)
        lines = [line.split(" I ", 1)[-1] for line in log.read_text(errors="replace").splitlines()
                 if re.search(r"llama_kv_cache(_iswa)?: (size =|creating)|llama_context: constructing", line)]
    last = max((i for i, line in enumerate(lines) if "constructing" in line), default=-1)
    lines = lines[last + 1:]
    sizes = [float(m.group(1)) for line in lines if (m := re.search(r"size =\s+([\d.]+) MiB", line))]
    if not sizes:
        raise SystemExit(f"{cli}: no KV size in its log (did it load {model}?)")
    return round(sum(sizes) * MIB), lines


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--ctx", type=int, default=32768)
    p.add_argument("--llama-cli", default="/tmp/llama/llama-cli")
    a = p.parse_args()

    import tallow
    from tallow.memory.budget import kv_bytes, kv_bytes_per_token

    llm = tallow.LLM(a.model, ctx=a.ctx, device="cpu")
    spec, pool = llm.spec, llm.engine.kv
    planned = kv_bytes(spec, a.ctx, pool.kv_dtype, llm.engine.prefill_chunk)
    theirs, lines = llama_cpp_kv(a.llama_cli, a.model, a.ctx)
    rows = [
        ("tallow KV bytes per token, f16 (tallow inspect)", kv_bytes_per_token(spec, "f16")),
        ("  the same were every layer to own a cache", kv_bytes_per_token(spec, "f16", shared=False)),
        (f"tallow plan, KV at ctx {a.ctx} (tallow plan)", planned),
        (f"tallow pool allocated at ctx {a.ctx} (KVPool.nbytes)", pool.nbytes),
        (f"llama.cpp KV at ctx {a.ctx} (its log, summed)", theirs),
    ]
    print(f"| {Path(a.model).name} | bytes | MiB |\n| --- | ---: | ---: |")
    for what, n in rows:
        print(f"| {what} | {n:,} | {n / MIB:.2f} |")
    print("llama.cpp's lines:\n  " + "\n  ".join(lines))
    ok = planned == pool.nbytes and pool.nbytes <= theirs
    print(f"plan == allocated: {planned == pool.nbytes}; tallow <= llama.cpp: {pool.nbytes <= theirs}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
