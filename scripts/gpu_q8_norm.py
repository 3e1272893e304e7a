"""The norm-folded Q8_1 quantization on the GPU: the one-pass kernel against the chunked one (run there).

    python scripts/gpu_q8_norm.py [--ks 576,640,1536,2560,4096] [--rows 1,8]

For each row width K (the twins' hidden sizes) and row count (a decode step, a verification pass):
  check: one pass (TALLOW_Q8_NORM_ONE_PASS, each warp count swept) against the chunked kernel on the
         same random x + residual, outputs poisoned first: the residual sums bit for bit, codes within
         one, the fraction of codes that differ, every field written; each row its one-row result;
  time:  µs per launch, 50 launches in one CUDA graph (with the engine's PDL launches), median of 15
         replays; the chunked kernel, then the one-pass kernel at each (blocks per program, warps) of
         CONFIGS (0 blocks: the whole row in one program).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_bench_kernels import graph_time_us  # noqa: E402

from tallow import switches  # noqa: E402
from tallow.kernels.triton.mmvq import Q8Act, _norm_q8_config, quantize_q8_1  # noqa: E402
from tallow.kernels.triton.quant_gemv import Prologue  # noqa: E402


CONFIGS = [(0, 8), (0, 16), (4, 4), (8, 2), (8, 4), (8, 8), (16, 4), (16, 8)]


def setting(one_pass: bool) -> None:
    os.environ["TALLOW_Q8_NORM_ONE_PASS"] = "1" if one_pass else "0"
    switches.refresh()


def poisoned(m: int, k: int) -> Q8Act:
    dev = "cuda"
    return Q8Act(torch.full((m, k), -128, dtype=torch.int8, device=dev),
                 torch.full((m, k // 32), float("nan"), device=dev).half(),
                 torch.full((m, k // 32), float("nan"), device=dev).half(),
                 torch.full((m, k // 16), -(2**31), dtype=torch.int32, device=dev))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ks", default="576,640,1536,2560,4096")
    ap.add_argument("--rows", default="1,8")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'K':>5} {'M':>2} | {'chunked':>7} | one pass, µs by (blocks, warps): "
          + " ".join(f"{str(c):>7}" for c in CONFIGS) + " | default | codes off by 1 | max |Δcode| | sums equal | rows = one-row")
    for k in map(int, args.ks.split(",")):
        w = torch.rand(k, device="cuda", generator=g) + 0.5
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", generator=g) * 3.0
            res = torch.randn(m, k, device="cuda", generator=g)
            outs = {}
            for one in (False, True):
                setting(one)
                total = torch.full_like(x, float("nan"))
                q = quantize_q8_1(x, out=poisoned(m, k), prologue=Prologue("norm", w, 1e-6, res, total))
                torch.cuda.synchronize()
                outs[one] = (q, total)
            a, ta = outs[True]
            b, tb = outs[False]
            written = (not ta.isnan().any() and not a.d.isnan().any() and not a.s.isnan().any()
                       and bool((a.isum != -(2**31)).all()))
            rows_ok = True
            setting(True)
            for r in range(m):
                one = quantize_q8_1(x[r:r + 1], prologue=Prologue("norm", w, 1e-6, res[r:r + 1], torch.empty_like(x[r:r + 1])))
                rows_ok &= all(torch.equal(getattr(one, f)[0], getattr(a, f)[r]) for f in ("qs", "d", "s", "isum"))
            diff = (a.qs.int() - b.qs.int()).abs()
            times = {}
            n_calls = 50
            xs = [torch.randn(m, k, device="cuda", generator=g) for _ in range(4)]
            rs = [torch.randn(m, k, device="cuda", generator=g) for _ in range(4)]
            sums = [torch.empty(m, k, device="cuda") for _ in range(4)]
            outq = [poisoned(m, k) for _ in range(4)]

            def calls(cfg=None):
                return [lambda i=i: quantize_q8_1(xs[i % 4], out=outq[i % 4], norm_config=cfg,
                                                  prologue=Prologue("norm", w, 1e-6, rs[i % 4], sums[i % 4]))
                        for i in range(n_calls)]
            setting(False)
            times["chunked"] = graph_time_us(calls())
            setting(True)
            for cfg in CONFIGS:
                times[cfg] = graph_time_us(calls(cfg))
            print(f"{k:5d} {m:2d} | {times['chunked']:7.2f} | {'':32s} " + " ".join(f"{times[c]:7.2f}" for c in CONFIGS)
                  + f" | {str(_norm_q8_config(k)):>7} | {float((diff != 0).float().mean()):14.2e} | {int(diff.max()):11d} | "
                  f"{str(torch.equal(ta, tb)):10s} | {rows_ok and written}", flush=True)


if __name__ == "__main__":
    main()
