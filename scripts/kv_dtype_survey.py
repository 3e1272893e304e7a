"""Which KV dtype can a model take without changing its greedy text? (issue 4: int8 by default
where greedy text on the reference prompts stays identical to f16, f16 elsewhere).

    python scripts/kv_dtype_survey.py [--models DIR] [--only NAME] [--json out.json]

For each reference model and each KV dtype (f16, bf16, int8, fp8): the 24 conformance prompts
of tests/fixtures/conformance_<model>.json (12 raw, 12 chat-templated), greedy, as many tokens
as llama.cpp's continuation. Reports per dtype how many continuations are token-identical to
our f16 run, where the first differing one diverges, and how many still pass the llama.cpp
conformance rule (identical, or diverging only where llama.cpp's top-2 gap < NEAR_TIE); plus
the KV bytes per token and the pool at ctx 4096. Speculative decoding is turned off so only
the KV dtype differs between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["TALLOW_SPECULATE"] = "0"
os.environ.setdefault("TALLOW_PERSIST_KV", "0")
if os.environ.get("SURVEY_THREADS"):  # on a busy machine one intra-op thread wastes less
    import torch

    torch.set_num_threads(int(os.environ["SURVEY_THREADS"]))

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct")
NEAR_TIE = {"smollm2-135m": 0.7, "gemma3-270m": 0.8, "qwen2.5-coder-1.5b-instruct": 0.5}
DTYPES = ("f16", "bf16", "int8", "fp8")


def run_dtype(name: str, models: Path, dtype: str, cache: Path | None) -> tuple[list[list[int]], int, float]:
    """Greedy continuations of the conformance prompts with one KV dtype (cached as JSON)."""
    import tallow

    path = cache / f"{name}_{dtype}.json" if cache else None
    if path is not None and path.exists():
        saved = json.loads(path.read_text())
        return saved["texts"], saved["conform"], saved["seconds"]
    cases = json.loads((ROOT / "tests" / "fixtures" / f"conformance_{name}.json").read_text())["greedy"]
    llm = tallow.LLM(models / f"{name}.gguf", ctx=1024, kv_dtype=dtype, device="cpu")
    eog = llm.tokenizer.eog_ids
    t0 = time.perf_counter()
    texts, conform = [], 0
    for case in cases:
        expected = case["ids"]
        ours = llm.generate(case["prompt_ids"], max_tokens=len(expected), temperature=0).tokens
        texts.append(ours)
        if expected and expected[-1] in eog:
            expected = expected[:-1]
        n = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), min(len(ours), len(expected)))
        conform += n == len(expected) == len(ours) or (n < len(case["gaps"]) and case["gaps"][n] < NEAR_TIE[name])
    seconds = round(time.perf_counter() - t0, 1)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"texts": texts, "conform": conform, "seconds": seconds}))
    return texts, conform, seconds


def survey(name: str, models: Path, dtypes=DTYPES, cache: Path | None = None) -> dict:
    from tallow.memory.budget import kv_bytes, kv_bytes_per_token, scan_header
    from tallow.spec import spec_from_gguf

    spec = spec_from_gguf(scan_header(models / f"{name}.gguf"))
    out = {"model": name, "dtypes": {}}
    ref, _, _ = run_dtype(name, models, "f16", cache)
    for dtype in dtypes:
        texts, conform, seconds = run_dtype(name, models, dtype, cache)
        same = [a == b for a, b in zip(texts, ref)]
        first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in zip(texts, ref)]
        out["dtypes"][dtype] = {
            "identical_to_f16": sum(same), "cases": len(texts),
            "first_divergence_steps": [f for f, s in zip(first, same) if not s],
            "pass_llama_cpp_rule": conform,
            "kv_bytes_per_token": kv_bytes_per_token(spec, dtype),
            "kv_bytes_ctx4096": kv_bytes(spec, 4096, dtype),
            "kv_bytes_ctx4096_no_ring": kv_bytes(spec, 4096, dtype, ring=False),
            "seconds": seconds,
        }
        print(name, dtype, out["dtypes"][dtype], flush=True)
    return out


def llama_cpp_kv(name: str, models: Path, n_ctx: int = 4096) -> dict:
    """llama.cpp's own KV buffer for an f16 cache at n_ctx, read from its log (llama-cpp-python
    0.3.36; it keeps full-size SWA caches for gemma3, swa_full=True)."""
    import re
    import subprocess

    code = ("import llama_cpp; llama_cpp.Llama(%r, n_ctx=%d, n_threads=1, verbose=True)" % (str(models / f"{name}.gguf"), n_ctx))
    log = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stderr
    sizes = [float(m) for m in re.findall(r"llama_kv_cache: size = +([\d.]+) MiB", log)]
    lines = [ln.strip() for ln in log.splitlines() if "llama_kv_cache" in ln and ("size" in ln or "SWA" in ln)]
    return {"n_ctx": n_ctx, "mib": sum(sizes), "bytes_per_token": round(sum(sizes) * 2**20 / n_ctx), "log": lines}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="/root/models")
    ap.add_argument("--only", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated, e.g. f16,int8")
    ap.add_argument("--cache", default=None, help="folder keeping each (model, dtype) run's tokens")
    ap.add_argument("--no-llama-cpp", action="store_true")
    args = ap.parse_args()
    results = []
    for name in MODELS:
        if args.only and name not in args.only.split(","):
            continue
        r = survey(name, Path(args.models), tuple(args.dtypes.split(",")), Path(args.cache) if args.cache else None)
        if not args.no_llama_cpp:
            try:
                r["llama_cpp_f16"] = llama_cpp_kv(name, Path(args.models))
            except Exception as exc:  # llama-cpp-python absent: the table says so
                r["llama_cpp_f16"] = {"error": str(exc)}
            print(name, "llama.cpp", r["llama_cpp_f16"], flush=True)
        results.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
