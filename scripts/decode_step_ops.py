"""Which of the C decode step's ops bring it to llama.cpp's decode step, op by op (dev only; issue 14).

  PYTHONPATH=$PWD python scripts/decode_step_ops.py [MODEL ...]

The fixture text teacher-forced through the C decode step (kernels/cpu/decode_layer.c) one token at a time, with
ggml's arithmetic (TALLOW_CPU_GGML_STEP) on for a subset of its ops — RoPE (ggml's angle tables, rotate_pairs'
fmas), attention (Q and softmax weights rounded to f16, ggml_vec_dot_f16's lanes, ggml_v_expf; gemma3's Q scaled
before the scores), GLU (SiLU by ggml_v_expf, GeGLU by ggml's fp16 table) — and torch's for the rest; each subset
compared with the fixtures' decode_steps (llama.cpp b11434's own decode steps: one token per ubatch) and, for
reference, their teacher_forced (its ubatch of 512). The products and norms are ggml's in every row.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct")


def main() -> None:
    import tallow
    from model_paths import require_model
    from tallow.kernels.cpu.decode_layer import GGML_ATTENTION, GGML_GLU, GGML_ROPE

    names = {0: "none (torch's)", GGML_ROPE: "RoPE", GGML_ATTENTION: "attention", GGML_GLU: "GLU",
             GGML_ROPE | GGML_ATTENTION: "RoPE+attention", GGML_ROPE | GGML_GLU: "RoPE+GLU",
             GGML_ATTENTION | GGML_GLU: "attention+GLU", GGML_ROPE | GGML_ATTENTION | GGML_GLU: "all (default)"}
    print("| model | ggml's ops | top-1 vs llama.cpp decode steps | bit-equal top-10 rows | \\|Δ top-1\\| median / p99 / max"
          " | top-10 max | top-1 vs ubatch 512 |\n|---|---|---:|---:|---:|---:|---:|")
    for name in sys.argv[1:] or MODELS:
        data = json.loads((ROOT / "tests" / "fixtures" / f"conformance_{name}.json").read_text())
        ids = data["teacher_forced"]["ids"]
        llm = tallow.LLM(require_model(name), ctx=1024)
        step = llm.model.c_decode
        if step is None or not step.ggml_capable:
            raise SystemExit(f"{name}: the C decode step in ggml's arithmetic does not apply")
        for mask, label in names.items():
            step.ggml_mask = mask
            llm.engine.reset()
            t0 = time.time()
            ours = torch.cat([llm.model.forward([t], p, llm.engine.kv) for p, t in enumerate(ids)]).float()[1:]
            row = []
            for ref in (data["decode_steps"], data["teacher_forced"]):
                top_ids, top = torch.tensor(ref["top_ids"])[1:], torch.tensor(ref["top_logits"])[1:]
                delta = (ours.gather(1, top_ids) - top).abs()
                row.append(((ours.argmax(-1) == top_ids[:, 0]).float().mean().item(), delta))
            (agree, delta), (agree_batch, _) = row
            q = torch.quantile(delta[:, 0], torch.tensor([0.5, 0.99])).tolist()
            exact_rows = int((delta.max(1).values <= 1e-5).sum())  # the fixture's 5 decimals
            print(f"| {name} | {label} | {agree:.4f} | {exact_rows}/{len(delta)} | {q[0]:.3f} / {q[1]:.3f} /"
                  f" {delta[:, 0].max():.3f} | {delta.max():.3f} | {agree_batch:.4f} |", flush=True)
            if time.time() - t0 > 600:
                break


if __name__ == "__main__":
    main()
