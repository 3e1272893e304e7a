"""The routed experts' GEMVs on the H200: the integer-dot kernel (moe_mmvq) against the fp32 one (moe_gemv).

    python3 scripts/gpu_moe_mmvq.py [--layers 8] [--sweep] [--only NAME,...]

Per projection shape of the twins (Qwen3-30B-A3B Q4_K_M, Gemma 4 26B-A4B Q4_K_M and NVFP4; 128
experts, 8 chosen): first the check on the device -- moe_mmvq against moe_mmvq_reference (float64
integer dots, relative error < 1e-6) and against moe_gemv (fp32, < 2e-2: x's Q8_1 rounding), the
output poisoned with NaN first; then the time of one launch: `--layers` copies of the stacked
weight (so the 8 chosen experts' bytes of successive launches do not sit in the 50 MB L2, as in a
decode step), each with its own 8 distinct random expert ids, captured in one CUDA graph, the
replays timed with events, and GB/s of the chosen experts' bytes. With --sweep, a few other
(BLOCK_N, BLOCKS, warps, stages) for moe_mmvq. Prints a table last.
"""

from __future__ import annotations

import argparse

import torch

from tallow.kernels.triton.mmvq import nv_order_reference, quantize_q8_1
from tallow.kernels.triton.moe_gemv import ExpertWeights, moe_gemv
from tallow.kernels.triton.moe_mmvq import NVFP4_CONFIG, moe_mmvq, moe_mmvq_config, moe_mmvq_ok, moe_mmvq_reference
from tallow.kernels.triton.planes import pack_planes, random_raw

# name, ggml type, experts, rows of one expert, K, pairs per x row (gate/up: the 8 slots read the token's row)
SHAPES = [
    ("qwen3 gate+up Q4_K", 12, 128, 1536, 2048, 8),
    ("qwen3 down Q6_K", 14, 128, 2048, 768, 1),
    ("qwen3 down Q4_K", 12, 128, 2048, 768, 1),
    ("g26 gate+up Q4_K", 12, 128, 1408, 2816, 8),
    ("g26 down Q8_0", 8, 128, 2816, 704, 1),
    ("g26 down Q5_0", 6, 128, 2816, 704, 1),
    ("g26 gate+up NVFP4", 40, 128, 1408, 2816, 8),
    ("g26 down NVFP4", 40, 128, 2816, 704, 1),
]
SWEEP_NV = [(2, 2, 1, 3), (4, 1, 1, 3), (4, 4, 1, 2), (8, 2, 1, 1), (8, 2, 2, 2), (4, 2, 2, 3), (16, 2, 4, 1), (8, 4, 4, 1),
            (2, 4, 1, 3), (1, 4, 1, 3)]
SWEEP = [(2, 2, 1, 1), (2, 4, 1, 3), (4, 1, 1, 3), (4, 2, 1, 3), (4, 2, 2, 3), (8, 2, 1, 1), (8, 2, 2, 3), (4, 4, 1, 2),
         (8, 4, 4, 1), (16, 2, 4, 1)]


def make_weight(qtype: int, n_exp: int, rows: int, k: int, g: torch.Generator) -> ExpertWeights:
    if qtype in (39, 40):
        from tallow.kernels.triton.fp4_gemv import _LAYOUT

        block, size = _LAYOUT[qtype]
        raw = torch.randint(0, 256, (n_exp * rows, k // block * size), dtype=torch.uint8, generator=g)
        if qtype == 40:  # finite E4M3 scales (not 0x7F / 0xFF): the first 4 bytes of every 36
            sc = raw.view(n_exp * rows, -1, size)[:, :, :4]
            sc &= 0x77
        return ExpertWeights(n_exp, rows, k, raw=raw.cuda(), qtype=qtype)
    raw = random_raw(qtype, n_exp * rows, k, g).cuda()
    return ExpertWeights(n_exp, rows, k, planes=pack_planes(raw, qtype, k), qtype=qtype)


def clone(w: ExpertWeights) -> ExpertWeights:
    if w.planes is not None:
        from tallow.kernels.triton.planes import PlaneWeight

        p = w.planes
        return ExpertWeights(w.n_experts, w.rows, w.k, planes=PlaneWeight(p.qtype, p.n, p.k,
                             {f: t.clone() for f, t in p.planes.items()}), qtype=w.qtype)
    return ExpertWeights(w.n_experts, w.rows, w.k, raw=w.raw.clone(), qtype=w.qtype)


def time_graph(fn, reps: int = 50) -> float:
    """ms per replay of a CUDA graph of fn()."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    rows_out = []
    failed = False
    for name, qtype, n_exp, rows, k, x_div in SHAPES:
        if args.only and not any(o in name for o in args.only.split(",")):
            continue
        w0 = make_weight(qtype, n_exp, rows, k, g)
        ws = [w0] + [clone(w0) for _ in range(args.layers - 1)]
        ids = [torch.randperm(n_exp, generator=g)[:8].cuda() for _ in ws]
        m = 8 // x_div
        x = torch.randn(m, k, generator=g).cuda()
        per_expert = w0.nbytes / n_exp
        touched = 8 * per_expert  # the 8 chosen experts' bytes a launch reads
        out = torch.full((8, rows), float("nan"), device="cuda")
        fp = moe_gemv(x, w0, ids[0], x_div, out=torch.full((8, rows), float("nan"), device="cuda"))
        line = {"name": name, "MB": touched / 1e6}
        nv = qtype == 40  # the NVFP4 kernel reads x's codes in nv_order
        if moe_mmvq_ok(w0):
            xq = quantize_q8_1(x)
            xq_run = quantize_q8_1(x, nv_order=nv)
            if nv and not torch.equal(xq_run.qs, nv_order_reference(xq.qs)):
                print(f"check {name}: quantize_q8_1(nv_order=True) is not the permuted natural quantization FAILED")
                failed = True
            got = moe_mmvq(xq_run, w0, ids[0], x_div, out=out)
            ref = moe_mmvq_reference(xq, w0, ids[0], x_div).cuda()
            e_ref = float((got.double() - ref.double()).norm() / ref.double().norm())
            e_fp = float((got - fp).norm() / fp.norm())
            ok = bool(torch.isfinite(got).all()) and e_ref < 1e-6 and e_fp < 2e-2
            failed |= not ok
            print(f"check {name}: vs reference {e_ref:.2e}, vs fp32 GEMV {e_fp:.2e} {'ok' if ok else 'FAILED'}", flush=True)
        outs = [torch.empty((8, rows), device="cuda") for _ in ws]
        t = time_graph(lambda: [moe_gemv(x, w, i, x_div, out=o) for w, i, o in zip(ws, ids, outs)]) / len(ws)
        line["fp32_us"] = t * 1e3
        line["fp32_GBs"] = touched / (t * 1e-3) / 1e9
        if moe_mmvq_ok(w0):
            xq = quantize_q8_1(x, nv_order=nv)
            cfgs = ([NVFP4_CONFIG] + (SWEEP_NV if args.sweep else []) if nv else
                    [moe_mmvq_config(w0.planes.qtype, rows, k)] + (SWEEP if args.sweep else []))
            best = None
            for cfg in cfgs:
                try:
                    t = time_graph(lambda: [moe_mmvq(xq, w, i, x_div, out=o, config=cfg)
                                            for w, i, o in zip(ws, ids, outs)]) / len(ws)
                except Exception as exc:  # a config the compiler refuses (shared memory, ...)
                    print(f"  {name} {cfg}: {type(exc).__name__}", flush=True)
                    continue
                print(f"  {name} moe_mmvq {cfg}: {t * 1e3:.2f} us, {touched / (t * 1e-3) / 1e9:.0f} GB/s", flush=True)
                if cfg == cfgs[0]:
                    line["mmvq_us"] = t * 1e3
                if best is None or t < best[0]:
                    best = (t, cfg)
            line["best_us"], line["best_cfg"] = best[0] * 1e3, best[1]
            tq = time_graph(lambda: [moe_mmvq(quantize_q8_1(x, nv_order=nv), w, i, x_div, out=o)
                                     for w, i, o in zip(ws, ids, outs)]) / len(ws)
            line["q8+mmvq_us"] = tq * 1e3
        rows_out.append(line)
        del ws, w0
        torch.cuda.empty_cache()
    print("\n| projection | MB read | fp32 GEMV µs (GB/s) | integer-dot µs (GB/s) | + quantize µs | best config µs |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows_out:
        mm = (f"{r['mmvq_us']:.2f} ({r['MB'] / r['mmvq_us'] * 1e3:.0f})" if "mmvq_us" in r else "-")
        print(f"| {r['name']} | {r['MB']:.2f} | {r['fp32_us']:.2f} ({r['fp32_GBs']:.0f}) | {mm} | "
              f"{r.get('q8+mmvq_us', float('nan')):.2f} | "
              f"{r.get('best_us', float('nan')):.2f} {r.get('best_cfg', '')} |")
    print("checks:", "FAILED" if failed else "all passed")


if __name__ == "__main__":
    main()
