"""The integer-dot GEMV (tallow/kernels/triton/mmvq.py) against quant_gemv on a GPU, per shape.

    PYTHONUNBUFFERED=1 python scripts/gpu_mmvq.py [--quick] [--budget-s 170] [--out FILE]
    bash scripts/gpu_mmvq.sh        (the same, tee'd to $OUT/gpu_mmvq.log, killed at 290 s)

First a correctness gate on the GPU: the dp4a kernel equals the int32 multiply-reduce variant bit
for bit (same integers, same fp32 combination), equals the float64 torch reference exactly where
every partial sum is an integer below 2^24 (weight scales and x's d8 set to 1), stays within 1e-5
of it with random scales, and row r of a 4-row product is its one-row product bit for bit.

Then per shape (qwen3-4b's, qwen2.5-1.5b's, gemma4-e2b's, then 32-element-block types: smollm2's Q4_1, gemma3-270m's
Q5_0, Q8_0, Q4_0; random GGUF blocks, sane scales),
timed with gpu_bench_kernels.py's harness (one CUDA graph over rotating weight copies > L2): the
quant_gemv default config, the mmvq configs (DP4A and int32-multiply), the Q8_1 quantization of
x on its own, and the errors vs the float64 integer reference and vs the fp32 dequantized product.
The LAYER line: one qwen3-4b layer's five GEMVs in one graph, quant_gemv against mmvq with its
four Q8_1 launches (bench_layer).
One line per shape: qwen's with all configs, then the LAYER line and M = 4/8, then gemma4-e2b's
and the 32-element-block types with the first two configs (--full: all). A failing shape prints
its error and the rest still run. Past --budget-s the remaining shapes time only the first
configs; past --stop-s they are listed, not run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_bench_kernels as kb  # noqa: E402
from gpu_gemv_shapes import SHAPES  # noqa: E402

from tallow.kernels.triton.mmvq import (mmvq_config, mmvq_q8, mmvq_reference, quantize_q8_1,  # noqa: E402
                                        quantize_q8_1_reference)
from tallow.kernels.triton.planes import dequantize_planes  # noqa: E402
from tallow.kernels.triton.quant_gemv import quant_gemv  # noqa: E402

OTHER = [("qwen3-4b ffn_gate+up", "Q4_K", 19456, 2560), ("qwen3-4b ffn_down", "Q6_K", 2560, 9728),
         ("qwen3-4b ffn_down", "Q4_K", 2560, 9728), ("qwen3-4b attn_q+k", "Q4_K", 5120, 2560),
         ("qwen3-4b attn_o", "Q4_K", 2560, 4096), ("qwen3-4b attn_v", "Q6_K", 1024, 2560),
         ("qwen3-4b output", "Q6_K", 151936, 2560),
         ("qwen2.5 ffn_gate+up", "Q4_K", 17920, 1536), ("qwen2.5 ffn_down", "Q6_K", 1536, 8960),
         ("qwen2.5 attn_q+k", "Q4_K", 1792, 1536), ("qwen2.5 attn_o", "Q4_K", 1536, 1536),
         ("qwen2.5 output", "Q6_K", 151936, 1536)]
SMALL_BLOCKS = [("smollm2 output", "Q8_0", 49152, 576), ("8960x1536 (Q8_0)", "Q8_0", 8960, 1536),
                ("1536x8960 (Q8_0)", "Q8_0", 1536, 8960), ("qwen2.5 attn_q+k (Q8_0)", "Q8_0", 1792, 1536),
                ("smollm2 gate+up", "Q4_1", 3072, 576), ("smollm2 down", "Q4_1", 576, 1536),
                ("gemma3-270m gate+up", "Q5_0", 4096, 640), ("gemma3-270m down", "Q5_0", 640, 2048),
                ("1536x8960 (Q5_0)", "Q5_0", 1536, 8960), ("8960x1536 (Q4_0)", "Q4_0", 8960, 1536)]

# (BLOCK_N, BLOCKS, warps, stages); K splits are chosen per shape (_split)
# Fewer warps with more words per thread reuse each x word across rows in registers. SASS of the
# K loop per weight (sm_90, offline: python scripts/gemv_sass_count.py, Triton 3.8, 2026-12-02):
# mmvq Q4_K 2.9 (8,2,1) / 4.4 (8,2,4) / 2.5 (16,2,2) / 2.4 (32,2,4), Q6_K 2.5 / 2.3 (16,2,2),
# Q8_0 1.3 (8,16,1), the int32 multiply-reduce Q4_K 5.6; quant_gemv's defaults Q4_K 9.4, Q6_K 12.1,
# Q8_0 5.9.
# Deeper K steps (BLOCKS 4) and cp.async stages put more bytes in flight per warp: the
# 2026-12-01 ledger found the earlier low-instruction GEMV (v2) latency-bound (few warps in flight).
CANDIDATES = [(8, 2, 1, 1), (16, 2, 2, 1), (8, 2, 4, 1), (4, 2, 1, 1), (32, 1, 2, 1), (8, 2, 1, 3),
              (32, 2, 4, 1), (8, 4, 1, 3), (16, 4, 2, 3), (4, 4, 1, 3), (16, 1, 1, 1)]
SMALL_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0")  # 32-element blocks
# --short: the shapes the first H200 run (ac3bdff, 2026-12-02) found mmvq losing or tying on, and the
# configs that run did not have (more bytes in flight per warp)
LOST = [("qwen3-4b ffn_down", "Q6_K", 2560, 9728), ("qwen3-4b ffn_down", "Q4_K", 2560, 9728),
        ("qwen3-4b attn_v", "Q6_K", 1024, 2560), ("qwen3-4b attn_o", "Q4_K", 2560, 4096),
        ("e2b down", "Q6_K", 1536, 6144), ("e2b global o", "Q4_K", 1536, 4096), ("e2b sliding v", "Q6_K", 256, 1536),
        ("qwen2.5 ffn_down", "Q6_K", 1536, 8960)]
DEEP = [(4, 2, 1, 1), (8, 4, 1, 3), (16, 4, 2, 3), (4, 4, 1, 3), (8, 2, 1, 3), (4, 2, 2, 3)]
RESULTS: dict = {"gate": [], "shapes": [], "m": [], "errors": []}


def _split(n: int, k: int, block_n: int, blocks: int, block_k: int = 256) -> int:
    """The fewest power-of-two K splits (<= 8) that give >= 264 programs (two per SM)."""
    tiles = -(-n // block_n)
    steps = max(1, (k // block_k) // blocks)
    s = 1
    while tiles * s < 264 and s < 8 and s * 2 <= steps:
        s *= 2
    return s


def _weight(qtype: str, n: int, k: int, seed: int, unit_scales: bool = False):
    w = kb.make_weight(qtype, n, k, seed)
    if unit_scales:
        for name in ("dm", "d", "m"):
            if name in w.planes:
                w.planes[name].fill_(1.0)
    return w


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def gate() -> bool:
    ok_all = True
    g = torch.Generator(device="cuda").manual_seed(5)
    # one config each (compiles are the cost here): unsplit, and split K with cp.async stages
    for qtype, n, k, m, cfg in (("Q4_K", 300, 512, 2, (8, 2, 1, 1, 1)), ("Q6_K", 300, 512, 2, (8, 2, 1, 1, 1)),
                                ("Q4_K", 4100, 1536, 3, (16, 1, 4, 3, 4)), ("Q6_K", 2560, 9728, 1, (16, 1, 4, 3, 4)),
                                ("Q8_0", 1000, 1536, 4, (8, 2, 1, 1, 1)), ("Q4_0", 300, 576, 1, (8, 2, 1, 1, 1)),
                                ("Q4_1", 1000, 576, 3, (16, 1, 4, 3, 4)), ("Q5_0", 1000, 1536, 2, (8, 2, 1, 1, 2))):
        if qtype in SMALL_TYPES:
            cfg = (cfg[0], cfg[1] * 8) + cfg[2:]
        # exact: unit weight scales, x integer with |x| <= 3 plus one 127 per 32 (so d8 = 1); at K 256
        # every partial is an integer below 2^24 (Q6_K: 16 groups x 32 x 172 x 127 < 2^24)
        w1 = _weight(qtype, n, 256, seed=n + 1, unit_scales=True)  # (and Q4_1's min)
        x1 = torch.randint(-3, 4, (m, 256), device="cuda", generator=g).float()
        x1[:, ::32] = 127.0
        xq1 = quantize_q8_1(x1)
        ref1 = mmvq_reference(x1, w1)
        y1 = mmvq_q8(xq1, w1, config=cfg + (True,))
        exact = torch.equal(y1.double(), ref1)
        # random scales: dp4a == int32-mul bit for bit; vs the float64 reference
        w = _weight(qtype, n, k, seed=n * 3 + k)
        x = torch.randn(m, k, device="cuda", generator=g)
        xq = quantize_q8_1(x)
        qref = quantize_q8_1_reference(x)
        q_same = all(torch.equal(a, b) for a, b in zip(xq.__dict__.values(), qref.__dict__.values()))
        yd = mmvq_q8(xq, w, config=cfg + (True,))
        yi = mmvq_q8(xq, w, config=cfg + (False,))
        same = torch.equal(yd, yi)
        err = rel(yd, mmvq_reference(x, w, xq))
        rows = all(torch.equal(yd[r], mmvq_q8(quantize_q8_1(x[r:r + 1]), w, config=cfg + (True,))[0])
                   for r in range(m))
        ok = exact and same and err < 1e-5 and rows and q_same
        ok_all &= ok
        RESULTS["gate"].append(dict(qtype=qtype, n=n, k=k, m=m, config=cfg, exact=exact, dp4a_eq_int=same,
                                    rel_err=err, rows_bitwise=rows, q8_1_eq_ref=q_same, ok=ok))
        print(f"gate {qtype} {n}x{k} M={m} cfg {cfg}: exact {exact} dp4a==int32 {same} rel {err:.1e} "
              f"rows {rows} q8_1==ref {q_same} -> {'ok' if ok else 'FAIL'}", flush=True)
    return ok_all


def bench_shape(label: str, qtype: str, n: int, k: int, bw: float, quick: bool, m: int = 1, cands=None) -> None:
    w = _weight(qtype, n, k, seed=n * 7 + k)
    x = torch.randn(m, k, device="cuda")
    xq = quantize_q8_1(x)
    ref = mmvq_reference(x, w, xq) if n * k <= 500e6 else None
    fp = x @ dequantize_planes(w).T
    ws = kb.copies_of(w)
    outs = [torch.empty(m, n, device="cuda") for _ in ws]
    t_qg = kb.graph_time_us([(lambda wi=wi, oi=oi: quant_gemv(x, wi, out=oi)) for wi, oi in zip(ws, outs)])
    y_qg = quant_gemv(x, w)
    rows = []
    if cands is None:
        cands = CANDIDATES[:2] if quick else CANDIDATES
    if qtype in SMALL_TYPES:  # 32-element blocks: 8 per K-quant block's worth of a step
        cands = [(c[0], c[1] * 8) + c[2:] for c in cands]
    block_k = 32 if qtype in SMALL_TYPES else 256
    cfgs = [c + (_split(n, k, c[0], c[1], block_k), True) for c in cands]
    boosted = cfgs[0][:4] + (min(8, cfgs[0][4] * 2), True)  # twice the K splits: more programs in flight
    if boosted[4] <= max(1, (k // block_k) // cfgs[0][1]) and boosted not in cfgs:
        cfgs.append(boosted)
    cfgs += [cfgs[0][:5] + (False,)]  # the int32 multiply-reduce variant
    default = mmvq_config(qtype, n, k)
    if default not in cfgs:
        cfgs.insert(0, default)
    for cfg in cfgs:
        try:
            y = mmvq_q8(xq, w, config=cfg)
            err = rel(y, ref) if ref is not None else float("nan")
            t = kb.graph_time_us([(lambda wi=wi, oi=oi: mmvq_q8(xq, wi, out=oi, config=cfg)) for wi, oi in zip(ws, outs)])
            rows.append(dict(config=cfg, us=t, gbs=w.nbytes / t / 1e3, rel_err_int=err, rel_err_fp32=rel(y, fp)))
        except Exception as e:  # noqa: BLE001
            RESULTS["errors"].append(f"{label} {qtype} {n}x{k} {cfg}: {type(e).__name__}: {e}"[:400])
            print(f"  !! {cfg}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    buf = quantize_q8_1(x)
    t_q = kb.graph_time_us([lambda: quantize_q8_1(x, out=buf)] * 50)
    dp = [r for r in rows if r["config"][5]]
    best = min(dp, key=lambda r: r["us"])
    imul = [r for r in rows if not r["config"][5]]
    dflt = [r for r in rows if r["config"] == default]
    rec = dict(label=label, qtype=qtype, n=n, k=k, m=m, bytes=w.nbytes, quant_gemv_us=t_qg, q8_1_us=t_q,
               quant_gemv_rel_err_fp32=rel(y_qg, fp), mmvq=rows, best=best, copy_gbs=bw)
    RESULTS["shapes" if m == 1 else "m"].append(rec)
    im = f"int32-mul {imul[0]['us']:7.2f}" if imul else "int32-mul    n/a"
    im += f" | mmvq_config {dflt[0]['us']:7.2f}" if dflt else ""
    print(f"{label:22s} {qtype} {n:6d}x{k:<5d} M={m} {w.nbytes / 1e6:7.2f} MB | quant_gemv {t_qg:7.2f} us "
          f"{w.nbytes / t_qg / 1e3:5.0f} GB/s | mmvq {best['us']:7.2f} us {best['gbs']:5.0f} GB/s "
          f"({best['gbs'] / bw * 100:3.0f}%) {best['config']} | {im} | q8_1 {t_q:5.2f} us | "
          f"x{t_qg / best['us']:.2f} gemv, x{t_qg / (best['us'] + t_q):.2f} with q8_1 | err int {best['rel_err_int']:.1e} "
          f"fp32 {best['rel_err_fp32']:.1e} (quant_gemv {rec['quant_gemv_rel_err_fp32']:.1e})", flush=True)
    del ws, outs


# qwen3-4b Q4_K_M's decode GEMVs of one layer: (name, type, N, K, input); q+k and v share x.
LAYER = [("q+k", "Q4_K", 5120, 2560, "a"), ("v", "Q6_K", 1024, 2560, "a"), ("o", "Q4_K", 2560, 4096, "o"),
         ("gate+up", "Q4_K", 19456, 2560, "f"), ("down", "Q6_K", 2560, 9728, "d")]


def _best_config(qtype: str, n: int, k: int):
    rows = [r for r in RESULTS["shapes"] if (r["qtype"], r["n"], r["k"]) == (qtype, n, k)]
    return tuple(rows[0]["best"]["config"]) if rows else mmvq_config(qtype, n, k)


def bench_layer(bw: float, layers: int = 8) -> None:
    """One CUDA graph over `layers` distinct copies of a qwen3-4b layer's five GEMVs (> L2): the
    fp32 GEMV's five launches against mmvq's four Q8_1 quantizations + five integer GEMVs, with
    the best configs of this run's sweep. (The norms, RoPE and attention between are left out.)"""
    xs = {"a": torch.randn(1, 2560, device="cuda"), "o": torch.randn(1, 4096, device="cuda"),
          "f": torch.randn(1, 2560, device="cuda"), "d": torch.randn(1, 9728, device="cuda")}
    qx = {key: quantize_q8_1(x) for key, x in xs.items()}
    base = {name: _weight(qt, n, k, seed=n + k) for name, qt, n, k, _ in LAYER}
    stack = [{name: type(w)(w.qtype, w.n, w.k, {f: t.clone() for f, t in w.planes.items()}) for name, w in base.items()}
             for _ in range(layers)]
    outs = {name: torch.empty(1, n, device="cuda") for name, _, n, _, _ in LAYER}
    cfgs = {name: _best_config(qt, n, k) for name, qt, n, k, _ in LAYER}
    qg_calls, mm_calls = [], []
    for ws in stack:
        for name, _, _, _, src in LAYER:
            qg_calls.append(lambda x=xs[src], w=ws[name], o=outs[name]: quant_gemv(x, w, out=o))
        for name, _, _, _, src in LAYER:
            if name != "v":  # v reuses q+k's quantized x
                mm_calls.append(lambda x=xs[src], q=qx[src]: quantize_q8_1(x, out=q))
            mm_calls.append(lambda q=qx[src], w=ws[name], o=outs[name], c=cfgs[name]: mmvq_q8(q, w, out=o, config=c))
    nbytes = sum(w.nbytes for w in base.values())
    t_qg = kb.graph_time_us(qg_calls) * len(qg_calls) / layers
    t_mm = kb.graph_time_us(mm_calls) * len(mm_calls) / layers
    RESULTS["layer"] = dict(model="qwen3-4b", bytes=nbytes, quant_gemv_us=t_qg, mmvq_us=t_mm, configs=cfgs)
    print(f"LAYER qwen3-4b (5 GEMVs, {nbytes / 1e6:.1f} MB, {layers} distinct copies): quant_gemv {t_qg:7.2f} us "
          f"({nbytes / t_qg / 1e3:4.0f} GB/s) | mmvq + 4 Q8_1 launches {t_mm:7.2f} us ({nbytes / t_mm / 1e3:4.0f} GB/s) "
          f"| x{t_qg / t_mm:.2f}  configs {cfgs}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="two configs per shape")
    ap.add_argument("--full", action="store_true", help="the whole sweep on every shape (past the 4-minute plan)")
    ap.add_argument("--short", action="store_true", help="gate, LAYER, M=4 and the shapes mmvq lost or tied on the "
                    "first run, with the deeper-pipeline configs (estimated 2 minutes)")
    ap.add_argument("--budget-s", type=float, default=170.0, help="past this, only the first configs")
    ap.add_argument("--stop-s", type=float, default=240.0, help="past this, no more shapes")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_mmvq.json"))
    args = ap.parse_args()
    start = time.time()
    print(f"torch {torch.__version__}  {torch.cuda.get_device_name()}", flush=True)
    bw = kb.copy_bandwidth()
    print(f"device-to-device copy {bw:.0f} GB/s (read+write)", flush=True)
    try:
        print("GATE", "PASS" if gate() else "FAIL", flush=True)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        RESULTS["errors"].append(f"gate: {type(e).__name__}: {e}"[:400])
    # qwen's shapes with the whole sweep, then one layer of them, M = 4/8, then the rest with the
    # first two configs (unless --full): the order of what matters if time runs out
    rest = [("e2b " + lab, qt, n, k) for lab, qt, n, k in SHAPES["gemma4-e2b"]] + SMALL_BLOCKS
    plan = [("shape", s_, False) for s_ in OTHER] + [("layer", None, False)]
    plan += [("rows", (label, qt, n, k, m), True) for label, qt, n, k in
             (("qwen3-4b ffn_gate+up", "Q4_K", 19456, 2560), ("qwen3-4b ffn_down", "Q6_K", 2560, 9728)) for m in (4, 8)]
    plan += [("shape", s_, not args.full) for s_ in rest]
    if args.short:
        plan = [("layer", None, False), ("rows", ("qwen3-4b ffn_gate+up", "Q4_K", 19456, 2560, 4), True)]
        plan += [("deep", s_, False) for s_ in LOST]
    for i, (kind, what, quick) in enumerate(plan):
        if time.time() - start > args.stop_s:
            left = [w[0] if isinstance(w, tuple) else kind_ for kind_, w, _ in plan[i:]]
            print(f"out of time: {len(left)} items not run ({', '.join(map(str, left))})", flush=True)
            break
        try:
            if kind == "layer":
                bench_layer(bw)
            elif kind == "deep":
                label, qt, n, k = what
                bench_shape(label, qt, n, k, bw, False, cands=DEEP)
            elif kind == "rows":
                label, qt, n, k, m = what
                bench_shape(label, qt, n, k, bw, True, m=m)
            else:
                label, qt, n, k = what
                bench_shape(label, qt, n, k, bw, quick or args.quick or time.time() - start > args.budget_s)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            RESULTS["errors"].append(f"{kind} {what}: {type(e).__name__}: {e}"[:400])
            torch.cuda.synchronize()
        with open(args.out, "w") as f:
            json.dump(RESULTS, f, indent=1)
    with open(args.out, "w") as f:
        json.dump(RESULTS, f, indent=1)
    print(f"done in {time.time() - start:.0f} s, {len(RESULTS['errors'])} errors", flush=True)


if __name__ == "__main__":
    main()
