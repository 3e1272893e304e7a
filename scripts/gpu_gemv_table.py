"""Issue 12's per-kernel bandwidth table: every decode GEMV of a model, bytes / kernel time, beside
the device-copy bandwidth measured in the same process (run on a GPU).

    PYTHONUNBUFFERED=1 python scripts/gpu_gemv_table.py MODEL.gguf [...] [--sweep-s 240] [--out FILE]

Per model: the GEMV calls of one decode step are recorded (the layer's path, quant type, N x K,
whether a norm/GLU prologue is folded in) by wrapping kernels/gpu/linear.py's quant_gemv and mmvq
during the first decode_step (warm-up and capture: counts are normalised by the output
projection's). Then per distinct shape (random GGUF blocks, gpu_bench_kernels.py's harness: one
CUDA graph over rotating weight copies > L2, median of 15 replays):
  fp32   quant_gemv at gemv_config, x fp32, no prologue
  mmvq   mmvq_q8 at mmvq_config with x already in Q8_1; q8_1 = the quantize launch on its own
  sweep  (until --sweep-s) mmvq configs for the shapes the engine sends to the fp32 GEMV
Per model the last lines sum count x time: the step's GEMV time as the engine runs it, and with
every shape at its faster kernel (the quantize launches counted once per distinct input).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_bench_kernels as kb  # noqa: E402

from tallow.kernels.triton.mmvq import MMVQ_TYPES, mmvq_config, mmvq_q8, quantize_q8_1  # noqa: E402
from tallow.kernels.triton.quant_gemv import quant_gemv  # noqa: E402

SMALL = ("Q8_0", "Q4_0", "Q4_1", "Q5_0")
# (BLOCK_N, BLOCKS, warps, stages); the K split is added per shape (two per SM, and twice that)
CANDS = [(4, 2, 1, 1), (4, 2, 1, 3), (8, 2, 1, 3), (4, 4, 1, 3), (8, 4, 1, 3), (16, 4, 2, 3), (8, 2, 1, 1),
         (16, 2, 2, 1), (2, 2, 1, 1), (2, 4, 1, 3)]


def record(path: str) -> Counter:
    """(path, qtype, n, k, prologue) -> launches per decode step."""
    import tallow
    from tallow.kernels.gpu import linear as lin

    calls: Counter = Counter()
    orig_qg, orig_mm = lin.quant_gemv, lin.mmvq

    def qg(x, w, *a, **kw):
        pro = kw.get("prologue")
        calls[("fp32", w.qtype, w.n, w.k, pro.kind if pro is not None else "-")] += 1
        return orig_qg(x, w, *a, **kw)

    def mm(x, w, *a, **kw):
        calls[("mmvq", w.qtype, w.n, w.k, "-")] += 1
        return orig_mm(x, w, *a, **kw)

    llm = tallow.LLM(path, ctx=64, device="cuda")
    ids = list(range(5, 13))
    llm.engine.reset()
    llm.model.forward(ids, 0, llm.engine.kv)
    lin.quant_gemv, lin.mmvq = qg, mm
    try:
        llm.engine.decode_step(ids[0])
    finally:
        lin.quant_gemv, lin.mmvq = orig_qg, orig_mm
    torch.cuda.synchronize()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    top = max(calls, key=lambda c: c[2])  # the output projection: once per step
    per = calls[top]
    return Counter({c: v // per for c, v in calls.items()})


def split_for(qtype: str, n: int, k: int, bn: int, blocks: int) -> int:
    block_k = 32 if qtype in SMALL else 256
    tiles, steps, s = -(-n // bn), max(1, (k // block_k) // blocks), 1
    while tiles * s < 264 and s < 8 and s * 2 <= steps:
        s *= 2
    return s


def bench(qtype: str, n: int, k: int, bw: float, sweep: bool) -> dict:
    w = kb.make_weight(qtype, n, k, seed=n * 7 + k)
    x = torch.randn(1, k, device="cuda")
    ws = kb.copies_of(w)
    outs = [torch.empty(1, n, device="cuda") for _ in ws]
    xq = quantize_q8_1(x)
    rec = dict(qtype=qtype, n=n, k=k, bytes=w.nbytes)
    rec["fp32_us"] = kb.graph_time_us([(lambda wi=wi, oi=oi: quant_gemv(x, wi, out=oi)) for wi, oi in zip(ws, outs)])
    dflt = mmvq_config(qtype, n, k)
    rec["mmvq_cfg"] = dflt
    rec["mmvq_us"] = kb.graph_time_us([(lambda wi=wi, oi=oi: mmvq_q8(xq, wi, out=oi, config=dflt)) for wi, oi in zip(ws, outs)])
    rec["q8_1_us"] = kb.graph_time_us([lambda: quantize_q8_1(x, out=xq)] * 50)
    best = (rec["mmvq_us"], dflt)
    if sweep:
        ref = mmvq_q8(xq, w, config=dflt)
        for c in CANDS:
            if qtype in SMALL:
                c = (c[0], c[1] * 8) + c[2:]
            s = split_for(qtype, n, k, c[0], c[1])
            for split in sorted({s, min(8, 2 * s)}):
                cfg = c + (split, True)
                try:
                    y = mmvq_q8(xq, w, config=cfg)
                    if not torch.allclose(y, ref, rtol=1e-4, atol=1e-4):
                        print(f"  !! {qtype} {n}x{k} {cfg}: differs from the default config", flush=True)
                        continue
                    t = kb.graph_time_us([(lambda wi=wi, oi=oi: mmvq_q8(xq, wi, out=oi, config=cfg))
                                          for wi, oi in zip(ws, outs)])
                except Exception as e:  # noqa: BLE001
                    print(f"  !! {cfg}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                if t < best[0]:
                    best = (t, cfg)
    rec["best_us"], rec["best_cfg"] = best
    del ws, outs
    return rec


# --narrow: the narrow shapes of the twins (>= 2^21 weights, and the small V's), by their share of a
# step, swept over deeper configs (cp.async stages, K splits): (BLOCK_N, BLOCKS, warps, stages, split)
NARROW = [("Q6_K", 2560, 9728), ("Q4_K", 2560, 9728), ("Q4_K", 2560, 4096), ("Q6_K", 1024, 2560),
          ("Q6_K", 1536, 12288), ("Q4_K", 1536, 12288), ("Q4_K", 1536, 2048), ("Q4_K", 2048, 1536),
          ("Q4_K", 1536, 6144), ("Q6_K", 1536, 6144), ("Q4_K", 1536, 4096), ("Q4_K", 2304, 1536),
          ("Q4_K", 2560, 1536), ("Q6_K", 1536, 8960), ("Q4_K", 1536, 8960), ("Q4_K", 1536, 1536),
          ("Q4_K", 1792, 1536), ("Q6_K", 256, 1536), ("Q6_K", 512, 1536)]
DEEP = [(4, 2, 1, 3, 1), (4, 2, 1, 3, 2), (4, 2, 1, 3, 4), (8, 2, 1, 3, 1), (8, 2, 1, 3, 2), (8, 2, 1, 3, 4),
        (8, 4, 1, 3, 1), (8, 4, 1, 3, 2), (16, 4, 2, 3, 1), (16, 4, 2, 3, 2), (16, 2, 2, 3, 4), (4, 4, 1, 3, 1),
        (4, 4, 1, 3, 2), (2, 4, 1, 3, 1), (8, 2, 2, 1, 4), (4, 1, 1, 3, 4), (8, 1, 1, 3, 8)]


def narrow_sweep(bw: float, budget_s: float) -> None:
    t0, out = time.time(), []
    for qt, n, k in NARROW:
        if time.time() - t0 > budget_s:
            print(f"{qt} {n}x{k}: not run (budget)", flush=True)
            continue
        w = kb.make_weight(qt, n, k, seed=n * 7 + k)
        x = torch.randn(1, k, device="cuda")
        ws = kb.copies_of(w)
        outs = [torch.empty(1, n, device="cuda") for _ in ws]
        xq = quantize_q8_1(x)
        t_fp = kb.graph_time_us([(lambda wi=wi, oi=oi: quant_gemv(x, wi, out=oi)) for wi, oi in zip(ws, outs)])
        dflt = mmvq_config(qt, n, k)
        ref = mmvq_q8(xq, w, config=dflt)
        rows = []
        for cfg in [dflt] + [c + (True,) for c in DEEP]:
            try:
                y = mmvq_q8(xq, w, config=cfg)
                if not torch.allclose(y, ref, rtol=1e-4, atol=1e-4):
                    print(f"  !! {cfg} differs", flush=True)
                    continue
                rows.append((kb.graph_time_us([(lambda wi=wi, oi=oi: mmvq_q8(xq, wi, out=oi, config=cfg))
                                               for wi, oi in zip(ws, outs)]), cfg))
            except Exception as e:  # noqa: BLE001
                print(f"  !! {cfg}: {type(e).__name__}: {str(e)[:160]}", flush=True)
        rows.sort()
        gb = lambda us: w.nbytes / us / 1e3  # noqa: E731
        print(f"{qt} {n:5d}x{k:<5d} {w.nbytes / 1e6:6.2f} MB | fp32 {t_fp:6.2f} us ({gb(t_fp) / bw * 100:3.0f}%) | "
              f"mmvq_config {rows and [r for r in rows if r[1] == dflt][0][0]:6.2f} | best {rows[0][0]:6.2f} us "
              f"({gb(rows[0][0]) / bw * 100:3.0f}%) {rows[0][1]} | next " + ", ".join(f"{t:.2f} {c[:5]}" for t, c in rows[1:4]),
              flush=True)
        out.append(dict(qtype=qt, n=n, k=k, bytes=w.nbytes, fp32_us=t_fp, rows=rows))
        del ws, outs
    with open(os.path.join(os.environ.get("OUT", "."), "narrow_sweep.json"), "w") as f:
        json.dump(dict(copy_gbs=bw, shapes=out), f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--narrow", type=float, default=0.0, help="sweep NARROW for this many seconds, then stop")
    ap.add_argument("--sweep-s", type=float, default=240.0)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gemv_table.json"))
    args = ap.parse_args()
    t0 = time.time()
    bw = kb.copy_bandwidth()
    print(f"device-to-device copy {bw:.0f} GB/s (read+write), {torch.cuda.get_device_name()}", flush=True)
    if args.narrow:
        narrow_sweep(bw, args.narrow)
        return
    steps = {}
    for path in args.models:
        try:
            steps[Path(path).stem] = record(path)
        except Exception as e:  # noqa: BLE001
            print(f"!! {path}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    shapes = sorted({c[1:4] for cs in steps.values() for c in cs}, key=lambda s: s[1] * s[2])
    res = {}
    for qt, n, k in shapes:
        narrow = any(c[0] == "fp32" and c[1:4] == (qt, n, k) for cs in steps.values() for c in cs)
        sweep = narrow and qt in MMVQ_TYPES and time.time() - t0 < args.sweep_s
        r = res[(qt, n, k)] = bench(qt, n, k, bw, sweep)
        gb = lambda us: r["bytes"] / us / 1e3  # noqa: E731
        print(f"{qt} {n:6d}x{k:<5d} {r['bytes'] / 1e6:7.2f} MB | fp32 {r['fp32_us']:6.2f} us {gb(r['fp32_us']):5.0f} GB/s "
              f"({gb(r['fp32_us']) / bw * 100:3.0f}%) | mmvq {r['mmvq_us']:6.2f} us {gb(r['mmvq_us']):5.0f} GB/s "
              f"({gb(r['mmvq_us']) / bw * 100:3.0f}%) | best {r['best_us']:6.2f} us ({gb(r['best_us']) / bw * 100:3.0f}%) "
              f"{r['best_cfg']} | q8_1 {r['q8_1_us']:.2f} us", flush=True)
    print(f"\nper decode step (copy {bw:.0f} GB/s; 'now' = the engine's path; 'all mmvq' = each shape at its best "
          f"mmvq config + one q8_1 per fp32 call that had none)", flush=True)
    for model, cs in steps.items():
        now = best = nbytes = 0.0
        for (path, qt, n, k, pro), cnt in sorted(cs.items(), key=lambda kv: -kv[1] * kv[0][2] * kv[0][3]):
            r = res[(qt, n, k)]
            t_now = r["fp32_us"] if path == "fp32" else r["mmvq_us"]
            t_best = r["best_us"] + (r["q8_1_us"] if path == "fp32" else 0.0)
            now += cnt * t_now
            best += cnt * min(t_now, t_best)
            nbytes += cnt * r["bytes"]
            print(f"  {model:14s} {cnt:3d} x {path:4s} {qt} {n:6d}x{k:<5d} pro {pro:6s} {t_now:6.2f} us "
                  f"({r['bytes'] / t_now / 1e3 / bw * 100:3.0f}% of copy) -> mmvq best {t_best:6.2f} us", flush=True)
        print(f"  {model}: GEMVs {now:.0f} us a step for {nbytes / 1e6:.1f} MB ({nbytes / now / 1e3:.0f} GB/s, "
              f"{nbytes / now / 1e3 / bw * 100:.0f}% of copy); each at its faster kernel {best:.0f} us", flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(copy_gbs=bw, steps={m: [list(c) + [v] for c, v in cs.items()] for m, cs in steps.items()},
                       shapes=[dict(v, cfg=None) | {"best_cfg": v["best_cfg"], "mmvq_cfg": v["mmvq_cfg"]}
                               for v in res.values()]), f, indent=1)
    print(f"done in {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
