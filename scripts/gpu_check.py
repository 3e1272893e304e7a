"""GPU correctness and speed on twins, in one process (run on the GPU machine).

    python scripts/gpu_check.py --twins DIR --work /root/twins [--bench] [--only NAME]

For each twin (made from DIR/<name>.hdr/.json with make_twin.py if missing):
  parity: teacher-forced logits of the GPU path against the CPU fp32 reference path;
  graph:  greedy decode through the replayed CUDA graph against eager GPU decode;
  bench:  `tallow bench --device cuda` (pp33, pp512, tg128; tg128 at depth 4096 for qwen3-4b).
Twins are random weights: they time like the real models and say nothing about text.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TWINS = ["smollm2-135m", "gemma3-270m", "qwen25-1.5b", "qwen3-4b"]


def make_twin(twins: Path, work: Path, name: str) -> Path:
    out = work / f"{name}.gguf"
    if not out.exists():
        subprocess.run([sys.executable, str(twins / "make_twin.py"), "make", str(twins / name), str(out)], check=True)
    return out


def parity(path: Path, n_tokens: int = 48) -> dict:
    import tallow

    gen = torch.Generator().manual_seed(0)
    gpu = tallow.LLM(path, ctx=256, device="cuda")
    ids = torch.randint(0, gpu.spec.vocab_size, (n_tokens,), generator=gen).tolist()
    t0 = time.perf_counter()
    g = gpu.model.forward(ids, 0, gpu.engine.kv, all_logits=True).float().cpu()
    gpu_prefill_s = time.perf_counter() - t0
    # prefill through the engine (a CUDA graph per length bucket, padded) against the eager pass
    from tallow.engine.engine import GenerationStats

    graph_prefill = []
    for n in (40, 48, 17):  # buckets 64, 64 (replay), 32
        gpu.engine.reset()
        graph_prefill.append((gpu.engine.prefill(ids[:n], GenerationStats()).float().cpu() - g[n - 1]).abs().max().item())
    # decode: the same tokens one by one through the graph, against eager decode on the GPU
    gpu.engine.reset()
    gpu.model.forward(ids[:8], 0, gpu.engine.kv)
    graph_rows = [gpu.engine.decode_step(t).float().cpu() for t in ids[8:24]]
    os.environ["TALLOW_CUDA_GRAPHS"] = "0"
    eager = tallow.LLM(path, ctx=256, device="cuda")
    eager.model.forward(ids[:8], 0, eager.engine.kv)
    eager_rows = [eager.model.forward([t], 8 + i, eager.engine.kv)[-1].float().cpu() for i, t in enumerate(ids[8:24])]
    os.environ.pop("TALLOW_CUDA_GRAPHS")
    del eager
    cpu = tallow.LLM(path, ctx=256, device="cpu", linear_mode="reference")
    c = cpu.model.forward(ids, 0, cpu.engine.kv, all_logits=True).float()
    scale = c.std().item()
    gr, er = torch.stack(graph_rows), torch.stack(eager_rows)
    return {
        "prefill_vs_cpu_ref_max_abs": (g - c).abs().max().item(),
        "prefill_vs_cpu_ref_mean_abs": (g - c).abs().mean().item(),
        "cpu_ref_logit_std": scale,
        "prefill_top1_agree": (g.argmax(-1) == c.argmax(-1)).float().mean().item(),
        "graph_vs_eager_decode_max_abs": (gr - er).abs().max().item(),
        "graph_decode_vs_cpu_ref_max_abs": (gr - c[8:24]).abs().max().item(),
        "graph_top1_agree_cpu_ref": (gr.argmax(-1) == c[8:24].argmax(-1)).float().mean().item(),
        "gpu_prefill_48_s": gpu_prefill_s,
        "prefill_graph_vs_eager_max_abs": graph_prefill,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--twins", required=True)
    ap.add_argument("--work", default="/root/twins")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--parity", action="store_true")
    ap.add_argument("--only", default=None)
    ap.add_argument("--reps", default="3")
    args = ap.parse_args()
    twins, work = Path(args.twins), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    names = [args.only] if args.only else TWINS
    print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    for name in names:
        t0 = time.perf_counter()
        path = make_twin(twins, work, name)
        print(f"== {name}: twin ready in {time.perf_counter() - t0:.1f} s", flush=True)
        if args.parity:
            try:
                print(name, "parity", json.dumps(parity(path)), flush=True)
            except Exception as exc:  # report and go on to the next twin / the bench
                import traceback

                traceback.print_exc()
                print(name, "parity FAILED", exc, flush=True)
        if args.bench:
            depth = "0,4096" if name == "qwen3-4b" else "0"
            cmd = [sys.executable, "-m", "tallow.cli", "bench", "-m", str(path), "--device", "cuda", "-p", "33,512",
                   "-n", "128", "-d", depth, "-r", args.reps, "--json"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            print(r.stdout if r.returncode == 0 else r.stderr[-3000:], flush=True)


if __name__ == "__main__":
    main()
