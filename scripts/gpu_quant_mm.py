"""Check and time the short-prompt product (kernels/triton/quant_mm.py) on the H200 against the
path it replaces (dequantize to a bf16 scratch + cuBLAS), on the qwen3-4b and qwen2.5-1.5b twins'
shapes, M = 16, 33, 64: a CUDA graph over rotating weight copies (helpers of gpu_bench_kernels.py).

    python scripts/gpu_quant_mm.py [--sweep] [--out quant_mm.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from gpu_bench_kernels import copies_of, copy_bandwidth, graph_time_us, make_weight, rel_err  # noqa: E402

from tallow.kernels.triton.dequant import dequantize_to  # noqa: E402
from tallow.kernels.triton.planes import dequantize_planes  # noqa: E402
from tallow.kernels.triton.quant_mm import _config, quant_mm, quant_mm_reference  # noqa: E402

SHAPES = [  # (label, qtype, N, K)
    ("qwen3-4b gate+up", "Q4_K", 19456, 2560), ("qwen3-4b down", "Q6_K", 2560, 9728),
    ("qwen3-4b down", "Q4_K", 2560, 9728), ("qwen3-4b q+k", "Q4_K", 5120, 2560),
    ("qwen3-4b o", "Q4_K", 2560, 4096), ("qwen3-4b v", "Q6_K", 1024, 2560),
    ("qwen2.5 gate+up", "Q4_K", 17920, 1536), ("qwen2.5 down", "Q6_K", 1536, 8960),
]
SWEEP = [(bn, w, s) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    bw = copy_bandwidth()
    print(f"device copy: {bw:.0f} GB/s", flush=True)
    rows = []
    for label, qtype, n, k in SHAPES:
        w = make_weight(qtype, n, k, seed=3)
        wd = dequantize_planes(w)
        ws = copies_of(w)
        scratch = torch.empty(n, k, dtype=torch.bfloat16, device="cuda")
        for m in (16, 33, 64):
            x = torch.randn(m, k, device="cuda")
            ref = quant_mm_reference(x, w)
            err = rel_err(quant_mm(x, w), ref)
            exact = rel_err(quant_mm(x, w, exact=True), x @ wd.T)
            out = torch.empty(m, n, device="cuda")
            t_old = graph_time_us([lambda wi=wi: torch.matmul(x.bfloat16(), dequantize_to(wi, torch.bfloat16, out=scratch).T)
                                   for wi in ws], reps=10)
            base = _config(m, n)
            configs = [base] + ([(base[0], bn, nw, st) for bn, nw, st in SWEEP] if args.sweep else [])
            best = None
            for cfg in configs:
                try:
                    t = graph_time_us([lambda wi=wi, cfg=cfg: quant_mm(x, wi, out=out, config=cfg) for wi in ws], reps=10)
                except Exception as e:  # a config Triton cannot build (registers, shared memory)
                    print(f"   {cfg}: {type(e).__name__}", flush=True)
                    continue
                if best is None or t < best[1]:
                    best = (cfg, t)
                if args.sweep:
                    print(f"   {label} M={m} {cfg}: {t:.1f} us", flush=True)
            t_def = graph_time_us([lambda wi=wi: quant_mm(x, wi, out=out) for wi in ws], reps=10)
            gbs = w.nbytes / (best[1] * 1e-6) / 1e9
            print(f"{label:18s} {qtype} {n}x{k} M={m:2d}: scratch+cuBLAS {t_old:7.1f} us | quant_mm default {t_def:7.1f} us, "
                  f"best {best[1]:7.1f} us {best[0]} ({gbs:.0f} GB/s, {gbs / bw:.0%} of copy) | err vs bf16 ref {err:.1e}, "
                  f"exact {exact:.1e}", flush=True)
            rows.append(dict(label=label, qtype=qtype, n=n, k=k, m=m, scratch_us=t_old, default_us=t_def,
                             best_us=best[1], best=best[0], err=err, exact_err=exact))
        del ws
        torch.cuda.empty_cache()
    if args.out:
        json.dump(dict(copy_gbs=bw, rows=rows), open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
