"""The tiny Gemma 4 models on the GPU (run on the GPU machine): each variant's prompt logits and
16 greedy tokens, eager and through the engine's CUDA graphs, against llama.cpp's fixture and the CPU.

    python scripts/gpu_gemma4_check.py [--work /root/g4]

Prints one line per check and exits 1 if a greedy sequence differs from llama.cpp's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tiny_models import write_tiny_model  # noqa: E402

import tallow  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--work", default="/tmp/g4")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bad = 0
    for arch in ("gemma4", "gemma4-31b"):
        ref = json.loads((ROOT / "tests" / "fixtures" / f"tiny_{arch}.json").read_text())
        path = write_tiny_model(arch, work / f"{arch}.gguf")
        want = ref["greedy"]["ids"]
        for kv_dtype in ("f16", "int8", "fp8"):
            llm = tallow.LLM(path, ctx=64, device="cuda", kv_dtype=kv_dtype)
            logits = llm.model.forward(ref["ids"], 0, llm.engine.kv, all_logits=True).float().cpu()
            delta = (logits - torch.tensor(ref["logits"])).abs().max().item()
            llm.engine.reset()
            got = llm.generate(ref["ids"], max_tokens=len(want), temperature=0).tokens
            graphs = llm.engine._graph is not None  # the decode step ran as a captured CUDA graph
            same = got == want
            bad += not same and kv_dtype == "f16"
            print(f"{arch} kv={kv_dtype}: prompt max|Δlogit| vs llama.cpp {delta:.3e}; greedy {len(want)} tokens "
                  f"{'identical' if same else 'DIFFER'} to llama.cpp ({got} vs {want}); decode graph={graphs}", flush=True)
            del llm
            torch.cuda.empty_cache()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
