#!/usr/bin/env python3
"""The routed experts' grouped prefill product on the device: moe_grouped (kernels/triton/moe_grouped.py)
against the dequantize-all path it replaces (each stacked weight to bf16, torch._grouped_mm), on the
twins' projection shapes (128 experts, random blocks), the pairs of 33 and 512 tokens routed to 8
experts each at random.

Per shape and token count: the check (moe_grouped's output, poisoned with NaN first, against fp32
products of the same bf16 weights and activations, expert by expert: max |diff| / max |ref|), then
the median time of each path over 20 launches (CUDA events), and with --sweep the other configs.

    python3 scripts/gpu_moe_grouped.py [--sweep] [--only NAME]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from tallow.kernels.gpu.moe import _grouped_mm_available  # noqa: E402
from tallow.kernels.triton.dequant import dequantize_to  # noqa: E402
from tallow.kernels.triton.moe_gemv import ExpertWeights, fp4_dequantize_to  # noqa: E402
from tallow.kernels.triton.moe_grouped import group_pairs, grouped_block_m, moe_grouped  # noqa: E402
from tallow.kernels.triton.planes import pack_planes, random_raw  # noqa: E402

# name, type, one expert's rows, K, gather (gate/up: x per token) or not (down: x per pair)
SHAPES = [("qwen3 gate+up Q4_K", "Q4_K", 1536, 2048, True), ("qwen3 down Q6_K", "Q6_K", 2048, 768, False),
          ("qwen3 down Q4_K", "Q4_K", 2048, 768, False), ("gemma26 gate+up NVFP4", 40, 1408, 2816, True),
          ("gemma26 down NVFP4", 40, 2816, 704, False), ("gemma26 down Q8_0", "Q8_0", 2816, 704, False)]
E, TOP = 128, 8
CONFIGS = [(16, 64, 4, 2), (16, 64, 2, 2), (16, 128, 4, 2), (32, 64, 4, 2), (32, 64, 8, 2), (32, 128, 8, 2),
           (64, 64, 8, 2), (64, 128, 8, 2)]


def weight(qtype, rows, k, g) -> ExpertWeights:
    if qtype == 40:
        raw = torch.randint(0, 256, (E * rows * k // 64, 36), generator=g, dtype=torch.uint8)
        raw[:, :4] = torch.randint(0x20, 0x48, (raw.shape[0], 4), generator=g, dtype=torch.uint8)
        return ExpertWeights(E, rows, k, raw=raw.reshape(E * rows, -1).cuda(), qtype=40)
    raw = random_raw(qtype, E * rows, k, g).cuda()
    return ExpertWeights(E, rows, k, planes=pack_planes(raw, qtype, k), qtype=0)


def dense(w: ExpertWeights, buf: torch.Tensor) -> torch.Tensor:
    out = buf[: w.n_experts * w.rows * w.k].view(w.n_experts * w.rows, w.k)
    if w.planes is not None:
        dequantize_to(w.planes, torch.bfloat16, out=out)
    else:
        fp4_dequantize_to(w.raw, w.qtype, w.k, out)
    return out.view(w.n_experts, w.rows, w.k)


def timed(fn, reps=20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return sorted(times)[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    buf = torch.empty(E * 2816 * 1408, dtype=torch.bfloat16, device="cuda")
    worst = 0.0
    grouped_mm = _grouped_mm_available(torch.device("cuda"))
    for name, qtype, rows, k, gather in SHAPES:
        if a.only and a.only not in name:
            continue
        w = weight(qtype, rows, k, g)
        mb = w.nbytes / E / 1e6
        for n in (33, 512):
            p = n * TOP
            ids = torch.stack([torch.randperm(E, generator=g)[:TOP] for _ in range(n)]).cuda().reshape(-1)
            x = torch.randn(n if gather else p, k, generator=g).cuda()
            x_div = TOP if gather else 1
            gp = group_pairs(ids, E, grouped_block_m(w, p, E))
            out = torch.full((p, rows), float("nan"), device="cuda")
            moe_grouped(x, w, gp, x_div, out, True, True)  # (down's x per pair: gathered by pair, as out is)
            stack = dense(w, buf)
            xs = x.bfloat16().float()
            ref = torch.empty(p, rows, device="cuda")
            xr = xs.repeat_interleave(x_div, 0) if gather else xs
            for e in range(E):
                sel = (ids == e).nonzero().squeeze(1)
                if sel.numel():
                    ref[sel] = xr[sel] @ stack[e].float().T
            err = float((out - ref).abs().max() / ref.abs().max())
            worst = max(worst, err)
            touched = int(torch.unique(ids).numel())
            def new(gq=gp, config=None):  # as the bank runs it: x in expert order, bf16, then the launch
                xs = x.index_select(0, gq.order // x_div).bfloat16() if gather else x.bfloat16()
                moe_grouped(xs, w, gq, 1, out, False, not gather, config=config)
            t_new = timed(new)

            def old():
                order = gp.order
                xo = x.index_select(0, order // x_div).bfloat16() if gather else x.bfloat16()
                st = dense(w, buf)
                torch._grouped_mm(xo, st.transpose(1, 2), offs=gp.offsets[1:])
            t_old = timed(old) if grouped_mm else float("nan")
            print(f"{name:24s} n={n:4d} P={p:5d} experts {touched:3d}: err {err:.1e}  grouped {t_new:8.1f} us "
                  f"({touched * mb / t_new * 1e3:6.0f} GB/s of the touched experts)  dequantize-all {t_old:8.1f} us  "
                  f"({t_old / t_new:4.1f}x)", flush=True)
            if a.sweep:
                res = []
                for bm, bn, warps, stages in CONFIGS:
                    gq = group_pairs(ids, E, bm)
                    try:
                        res.append((timed(lambda: new(gq, (bn, warps, stages)), 10),
                                    (bm, bn, warps, stages)))
                    except Exception as exc:  # a config out of shared memory
                        print(f"    {(bm, bn, warps, stages)}: {type(exc).__name__}", flush=True)
                res.sort()
                print("    sweep: " + ", ".join(f"{c} {t:.1f}" for t, c in res[:6]), flush=True)
        del w
    print(f"worst err {worst:.1e} ({'ok' if worst < 1e-3 else 'FAIL'})")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
