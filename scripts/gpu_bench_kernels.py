"""Check and time the Triton kernels of tallow/kernels/triton on a CUDA GPU (the H200 machine).

    PYTHONUNBUFFERED=1 python scripts/gpu_bench_kernels.py [--quick] [--out results.json]

Needs torch (CUDA) and triton only -- no gguf, no model file: weights are random GGUF blocks
(sane fp16 scales) with the real models' shapes and types (qwen2.5-1.5b and the qwen3-4b twin,
../shared/twins), and the reference is the self-contained plane dequantization (planes.py,
bit-exact with tallow.quant.reference by tests/test_triton_gemv.py).

How it times: every kernel call is captured in a CUDA graph (as the decode step will run it),
over enough distinct copies of the weight that the working set is several times the 60 MB L2
(each decode layer's weights are distinct, so an L2-resident timing would be a lie); the graph
is replayed and timed with CUDA events, median of the replays, divided by the number of calls.
Effective bandwidth = the weight's bytes (plus activations, negligible) / time, against the
device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tallow.kernels.triton.decode_attention import decode_attention, decode_attention_reference, make_scratch  # noqa: E402
from tallow.kernels.triton.dequant import dequantize_to  # noqa: E402
from tallow.kernels.triton.planes import dequantize_planes, pack_planes, random_raw  # noqa: E402
from tallow.kernels.triton.quant_gemv import gemv_config, quant_gemv  # noqa: E402
from tallow.kernels.triton.argmax import argmax, make_argmax_scratch  # noqa: E402
from tallow.kernels.triton.glu import glu  # noqa: E402
from tallow.kernels.triton.rmsnorm import rmsnorm  # noqa: E402
from tallow.kernels.triton.rope import rope  # noqa: E402

RESULTS: dict = {"gemv": [], "gemv_m": [], "prefill": [], "attention": [], "baseline": [], "ops": []}
L2_ROTATE_BYTES = 320e6


def save(path: str) -> None:
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1)


def graph_time_us(calls: list, reps: int = 15) -> float:
    """Median µs per call of `calls` (callables) captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1000.0)
    del g
    return statistics.median(times) / len(calls)


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(50):  # let the clocks ramp up (the card idles at ~500 MHz)
        b.copy_(a)
    t = graph_time_us([lambda: b.copy_(a)] * 5)
    del a, b
    return 2 * (1 << 30) / t / 1e3  # GB/s, read + write


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def make_weight(qtype: str, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    scale = 0.02 if qtype in ("Q8_0", "Q4_0", "Q4_1", "Q5_0") else 0.02 / 32
    return pack_planes(random_raw(qtype, n, k, g, scale=scale), qtype, k).to("cuda")


def copies_of(w, max_copies: int = 512):
    n = max(2, min(max_copies, math.ceil(L2_ROTATE_BYTES / w.nbytes)))
    out = [w]
    for _ in range(n - 1):
        out.append(type(w)(w.qtype, w.n, w.k, {k: v.clone() for k, v in w.planes.items()}))
    return out


def gemv_sweep(qtype: str) -> list[tuple[int, int, int, int]]:
    if qtype in ("Q4_K", "Q6_K"):
        return [(4, 2, 4, 1), (8, 2, 4, 1), (8, 4, 4, 1), (16, 2, 8, 1), (2, 4, 4, 3), (4, 2, 4, 3),
                (8, 2, 4, 3), (8, 4, 4, 3), (16, 2, 8, 3), (16, 4, 8, 3)]
    return [(4, 8, 4, 1), (8, 8, 4, 1), (8, 16, 4, 1), (16, 8, 8, 1), (4, 8, 4, 3), (8, 8, 4, 3),
            (8, 16, 4, 3), (16, 8, 8, 3), (16, 16, 8, 3)]


WIDE_K_QUANT = [(1, 2, 2, 1), (1, 2, 2, 3), (1, 4, 2, 3), (1, 4, 4, 3), (1, 8, 4, 3),
                (2, 1, 2, 3), (2, 2, 2, 3), (2, 2, 4, 3), (2, 4, 4, 1), (2, 4, 4, 3), (2, 4, 2, 3),
                (2, 8, 4, 3), (2, 4, 4, 4), (4, 1, 2, 3), (4, 2, 2, 3), (4, 2, 4, 3), (4, 4, 4, 3),
                (4, 2, 4, 1), (4, 4, 8, 3), (8, 1, 4, 3), (8, 2, 4, 1), (8, 2, 4, 3), (8, 2, 8, 3), (16, 2, 8, 1)]


def bench_gemv(qtype: str, n: int, k: int, label: str, bw: float, sweep: bool, configs_override=None) -> None:
    w = make_weight(qtype, n, k, seed=n * 7 + k)
    x = torch.randn(1, k, device="cuda")
    ref = x @ dequantize_planes(w).T
    ws = copies_of(w)
    outs = [torch.empty(1, n, device="cuda") for _ in ws]
    default = gemv_config(qtype, n, k)
    configs = configs_override or (gemv_sweep(qtype) if sweep else [])
    if default not in configs:
        configs = [default] + configs
    best = None
    for cfg in configs:
        y = torch.full((1, n), float("nan"), device="cuda")
        quant_gemv(x, w, out=y, config=cfg)
        err = rel_err(y, ref)
        if not err < 2e-5:
            print(f"  !! {qtype} {n}x{k} cfg {cfg}: rel err {err:.2e}")
        t = graph_time_us([(lambda wi=wi, oi=oi: quant_gemv(x, wi, out=oi, config=cfg)) for wi, oi in zip(ws, outs)])
        row = dict(qtype=qtype, n=n, k=k, label=label, config=cfg, us=t, gbs=w.nbytes / t / 1e3,
                   frac_copy=w.nbytes / t / 1e3 / bw, rel_err=err, default=cfg == default, bytes=w.nbytes)
        RESULTS["gemv"].append(row)
        if best is None or t < best["us"]:
            best = row
    d = [r for r in RESULTS["gemv"] if r["qtype"] == qtype and r["n"] == n and r["k"] == k and r["default"]][0]
    print(f"{label:28s} {qtype} {n:6d}x{k:<5d} {w.nbytes / 1e6:7.2f} MB  default {d['config']} {d['us']:7.2f} us "
          f"{d['gbs']:6.0f} GB/s ({d['frac_copy'] * 100:3.0f}%)   best {best['config']} {best['us']:7.2f} us "
          f"{best['gbs']:6.0f} GB/s ({best['frac_copy'] * 100:3.0f}%)  err {d['rel_err']:.1e}", flush=True)
    del ws, outs


SPLITK_K_QUANT = [(8, 2, 4, 3, 1), (8, 2, 4, 3, 2), (8, 2, 4, 3, 4), (8, 2, 4, 1, 4), (8, 1, 4, 3, 4), (8, 1, 4, 1, 8),
                  (4, 2, 4, 3, 2), (4, 2, 4, 3, 4), (4, 1, 4, 1, 8), (16, 2, 8, 3, 2), (16, 2, 8, 3, 4), (16, 1, 4, 1, 8),
                  (4, 4, 4, 3, 1), (4, 4, 4, 3, 2), (2, 4, 4, 3, 4), (16, 2, 8, 1, 1), (32, 1, 8, 1, 4), (16, 1, 8, 1, 8)]
SPLITK_SMALL_QUANT = [(8, 8, 4, 1, 1), (8, 8, 4, 1, 2), (8, 8, 4, 1, 4), (8, 4, 4, 1, 4), (8, 4, 4, 1, 8), (4, 8, 4, 1, 4),
                      (16, 8, 8, 1, 2), (16, 4, 4, 1, 4), (8, 16, 4, 3, 1), (8, 16, 4, 3, 2), (8, 16, 4, 3, 4), (16, 16, 8, 1, 2)]
SPLITK_SHAPES = [("qwen3-4b ffn_gate+up", "Q4_K", 19456, 2560), ("qwen3-4b ffn_down", "Q6_K", 2560, 9728),
                 ("qwen3-4b ffn_down", "Q4_K", 2560, 9728), ("qwen3-4b attn_q+k", "Q4_K", 5120, 2560),
                 ("qwen3-4b attn_o", "Q4_K", 2560, 4096), ("qwen3-4b attn_v", "Q6_K", 1024, 2560),
                 ("qwen3-4b output", "Q6_K", 151936, 2560),
                 ("qwen2.5 ffn_gate+up", "Q4_K", 17920, 1536), ("qwen2.5 ffn_down", "Q6_K", 1536, 8960),
                 ("qwen2.5 attn_q+k", "Q4_K", 1792, 1536), ("qwen2.5 attn_o", "Q4_K", 1536, 1536),
                 ("8960x1536 (Q8_0)", "Q8_0", 8960, 1536), ("1536x8960 (Q8_0)", "Q8_0", 1536, 8960),
                 ("smollm2 output", "Q8_0", 49152, 576), ("smollm2 gate+up", "Q4_1", 3072, 576),
                 ("smollm2 down", "Q4_1", 576, 1536), ("1536x8960 (Q5_0)", "Q5_0", 1536, 8960),
                 ("8960x1536 (Q4_0)", "Q4_0", 8960, 1536)]


def check_rows_bitwise(qtype: str, n: int, k: int, cfg) -> bool:
    """Row r of a 4-row product equals its one-row product bit for bit (speculation's rule)."""
    w = make_weight(qtype, n, k, seed=11)
    x = torch.randn(4, k, device="cuda")
    y4 = quant_gemv(x, w, config=cfg)
    return all(torch.equal(y4[r], quant_gemv(x[r:r + 1], w, config=cfg)[0]) for r in range(4))


def bench_gemv_m(qtype: str, n: int, k: int, bw: float) -> None:
    w = make_weight(qtype, n, k, seed=3)
    wd = dequantize_planes(w)
    ws = copies_of(w)
    for m in (1, 2, 4, 8):
        x = torch.randn(m, k, device="cuda")
        y = quant_gemv(x, w)
        err = rel_err(y, x @ wd.T)
        outs = [torch.empty(m, n, device="cuda") for _ in ws]
        t = graph_time_us([(lambda wi=wi, oi=oi: quant_gemv(x, wi, out=oi)) for wi, oi in zip(ws, outs)])
        RESULTS["gemv_m"].append(dict(qtype=qtype, n=n, k=k, m=m, us=t, gbs=w.nbytes / t / 1e3, rel_err=err))
        print(f"  M={m} {qtype} {n}x{k}: {t:7.2f} us  {w.nbytes / t / 1e3:6.0f} GB/s  err {err:.1e}", flush=True)


def bench_dense_gemv(n: int, k: int, bw: float) -> None:
    """cuBLAS fp16 GEMV on a dense weight of the same shape: what a dense path would cost."""
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    copies = max(2, min(256, math.ceil(L2_ROTATE_BYTES / w.numel() / 2)))
    ws = [w.clone() for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=torch.float16)
    t = graph_time_us([(lambda wi=wi: torch.matmul(x, wi.T)) for wi in ws])
    nbytes = w.numel() * 2
    RESULTS["baseline"].append(dict(what="cublas fp16 gemv", n=n, k=k, us=t, gbs=nbytes / t / 1e3))
    print(f"  cuBLAS fp16 dense GEMV {n}x{k}: {t:7.2f} us {nbytes / t / 1e3:6.0f} GB/s ({nbytes / t / 1e3 / bw * 100:.0f}%)",
          flush=True)


def bench_prefill(qtype: str, n: int, k: int, label: str, ms: tuple[int, ...]) -> None:
    """The prefill path the engine runs (kernels/gpu/linear.py): dequantize to a dense scratch
    (dequant.py), then cuBLAS."""
    w = make_weight(qtype, n, k, seed=11)
    wd = dequantize_planes(w)
    for dt in (torch.float16, torch.bfloat16):
        dq = torch.empty(n, k, dtype=dt, device="cuda")
        dequantize_to(w, dt, out=dq)
        err_w = rel_err(dq, wd)
        t_dq = graph_time_us([lambda dt=dt, dq=dq: dequantize_to(w, dt, out=dq)] * 10, reps=10)
        for m in ms:
            x32 = torch.randn(m, k, device="cuda")
            ref = x32 @ wd.T
            x = x32.to(dt)
            err = rel_err(torch.matmul(x, dq.T), ref)
            if not err < (2e-3 if dt == torch.float16 else 1e-2):
                print(f"  !! prefill {qtype} {n}x{k} M={m} {dt}: rel err {err:.2e}")
            t_mm = graph_time_us([lambda x=x, dq=dq: torch.matmul(x, dq.T)] * 10, reps=10)
            flops = 2 * m * n * k
            RESULTS["prefill"].append(dict(qtype=qtype, n=n, k=k, m=m, dtype=str(dt), us=t_dq + t_mm, dequant_us=t_dq,
                                           cublas_us=t_mm, tflops=flops / (t_dq + t_mm) / 1e6, rel_err=err,
                                           weight_rel_err=err_w))
            print(f"{label:22s} {qtype} {n}x{k} M={m:5d} {str(dt)[6:]:8s}: dequant {t_dq:6.1f} + cuBLAS {t_mm:6.1f} us "
                  f"({flops / (t_dq + t_mm) / 1e6:5.0f} TF/s; cuBLAS alone {flops / t_mm / 1e6:5.0f} TF/s)  err {err:.1e}",
                  flush=True)


def bench_attention(n_heads: int, n_kv: int, d: int, depths: tuple[int, ...], label: str, bw: float) -> None:
    n_ctx = max(depths) + 64
    for depth in depths:
        L = depth + 1
        kv_bytes = 2 * n_kv * L * d * 2
        n_copies = max(2, min(64, math.ceil(L2_ROTATE_BYTES / max(kv_bytes, 1))))
        ctx = max(L + 63, 128)
        caches = [(torch.randn(n_kv, ctx, d, device="cuda", dtype=torch.float16),
                   torch.randn(n_kv, ctx, d, device="cuda", dtype=torch.float16)) for _ in range(n_copies)]
        q = torch.randn(n_heads, d, device="cuda")
        seq = torch.tensor([L], dtype=torch.int32, device="cuda")
        k0, v0 = caches[0]
        ref = decode_attention_reference(q, k0, v0, L, d ** -0.5)
        for splits in (None, "half", "double"):
            from tallow.kernels.triton.decode_attention import default_splits
            ns = default_splits(n_kv, n_ctx)
            ns = ns if splits is None else (max(1, ns // 2) if splits == "half" else min(512, ns * 2))
            for bt in (64, 128):
                outs = [torch.empty(n_heads, d, device="cuda") for _ in caches]
                scr = [make_scratch(n_heads, ns, d, "cuda") for _ in caches]
                decode_attention(q, k0, v0, seq, d ** -0.5, n_splits=ns, out=outs[0], scratch=scr[0], block_t=bt)
                err = rel_err(outs[0], ref)
                t = graph_time_us([(lambda c=c, o=o, s=s: decode_attention(q, c[0], c[1], seq, d ** -0.5, n_splits=ns,
                                                                           out=o, scratch=s, block_t=bt))
                                   for c, o, s in zip(caches, outs, scr)])
                RESULTS["attention"].append(dict(label=label, depth=depth, n_splits=ns, block_t=bt, us=t,
                                                 gbs=kv_bytes / t / 1e3, rel_err=err, kv_bytes=kv_bytes))
                print(f"{label:14s} depth {depth:6d} splits {ns:4d} BT {bt:3d}: {t:7.2f} us  "
                      f"{kv_bytes / t / 1e3:6.0f} GB/s ({kv_bytes / t / 1e3 / bw * 100:3.0f}%)  err {err:.1e}", flush=True)
        del caches
    # graph-friendliness: one captured graph, the length bumped in place between replays
    k0 = torch.randn(n_kv, 4096, d, device="cuda", dtype=torch.float16)
    v0 = torch.randn_like(k0)
    q = torch.randn(n_heads, d, device="cuda")
    seq = torch.tensor([1], dtype=torch.int32, device="cuda")
    out = torch.empty(n_heads, d, device="cuda")
    scr = make_scratch(n_heads, 64, d, "cuda")
    decode_attention(q, k0, v0, seq, 0.1, n_splits=64, out=out, scratch=scr)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        decode_attention(q, k0, v0, seq, 0.1, n_splits=64, out=out, scratch=scr)
    worst = 0.0
    for L in (1, 2, 63, 64, 65, 1000, 4096):
        seq.fill_(L)
        g.replay()
        worst = max(worst, rel_err(out, decode_attention_reference(q, k0, v0, L, 0.1)))
    RESULTS["attention"].append(dict(label=label, graph_replay_worst_rel_err=worst))
    print(f"{label}: one CUDA graph replayed at lengths 1..4096, worst rel err {worst:.1e}", flush=True)


# ---------------------------------------------------------------------------------------------
# small decode ops
# ---------------------------------------------------------------------------------------------

def time_op(name: str, fn, n_calls: int = 20) -> float:
    t = graph_time_us([fn] * n_calls)
    RESULTS["ops"].append(dict(op=name, us=t))
    print(f"  {name:52s} {t:7.2f} us", flush=True)
    return t


def bench_ops() -> dict:
    """Small decode kernels inside a graph (back to back, same buffers: L2-resident, as in a step)."""
    t = {}
    dev = "cuda"
    for d, tag in ((2560, "qwen3"), (576, "smollm2")):
        x, r, w = torch.randn(1, d, device=dev), torch.randn(1, d, device=dev), torch.randn(d, device=dev)
        y, s_out = torch.empty(1, d, device=dev), torch.empty(1, d, device=dev)
        t[f"rmsnorm_{tag}"] = time_op(f"rmsnorm D={d}", lambda: rmsnorm(x, w, 1e-6, out=y))
        t[f"rmsnorm_res_{tag}"] = time_op(f"rmsnorm+residual D={d}",
                                          lambda: rmsnorm(x, w, 1e-6, out=y, residual=r, sum_out=s_out))
    for f, tag in ((9728, "qwen3"), (1536, "smollm2")):
        gu = torch.randn(1, 2 * f, device=dev)
        out = torch.empty(1, f, device=dev)
        t[f"swiglu_{tag}"] = time_op(f"swiglu F={f}", lambda: glu(gu[:, :f], gu[:, f:], "swiglu", out=out))
        t[f"geglu_{tag}"] = time_op(f"geglu F={f}", lambda: glu(gu[:, :f], gu[:, f:], "geglu", out=out))
    for nq, nk, d, tag, style in ((32, 8, 128, "qwen3", "neox"), (9, 3, 64, "smollm2", "norm")):
        q, k, v = (torch.randn(nq, d, device=dev), torch.randn(nk, d, device=dev), torch.randn(nk, d, device=dev))
        ang = torch.rand(4096, d // 2, device=dev)
        cos, sin = ang.cos(), ang.sin()
        kc = torch.zeros(nk, 4096, d, dtype=torch.float16, device=dev)
        vc = torch.zeros_like(kc)
        pos = torch.tensor([17], dtype=torch.int32, device=dev)
        qo = torch.empty(nq, d, device=dev)
        qn = torch.randn(d, device=dev) if tag == "qwen3" else None
        t[f"rope_{tag}"] = time_op(f"rope {style} {nq}+{nk} heads d{d} (+qk norm, kv write)",
                                   lambda: rope(q, k, cos, sin, pos, style, q_out=qo, k_cache=kc, v=v, v_cache=vc,
                                                q_norm=qn, k_norm=qn))
        seq = torch.tensor([1], dtype=torch.int32, device=dev)
        ns = 64 if tag == "qwen3" else 32
        scr = make_scratch(nq, ns, d, dev)
        ao = torch.empty(nq, d, device=dev)
        t[f"attn_{tag}"] = time_op(f"decode_attention depth 0 {nq}/{nk} heads splits {ns}",
                                   lambda: decode_attention(qo, kc, vc, seq, d ** -0.5, n_splits=ns, out=ao, scratch=scr))
    for v, tag in ((151936, "qwen3"), (49152, "smollm2")):
        logits = torch.randn(1, v, device=dev)
        out = torch.empty(1, dtype=torch.int64, device=dev)
        scr = make_argmax_scratch(1, 256, dev)
        argmax(logits, out=out, scratch=scr)
        assert int(out.item()) == int(torch.argmax(logits))
        t[f"argmax_{tag}"] = time_op(f"argmax V={v}", lambda: argmax(logits, out=out, scratch=scr))
    return t


OUT_PATH = [""]


def guard(fn, *args) -> None:
    """Run one benchmark; a failure is printed and recorded, and the rest still runs."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        RESULTS.setdefault("errors", []).append(f"{fn.__name__}{args[:4]}: {type(e).__name__}: {e}"[:500])
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="no config sweeps")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_bench_kernels.json"))
    ap.add_argument("--only", default="gemv,gemv_m,baseline,attention,prefill,ops",
                    help="comma-separated sections of: wide, splitk, gemv, baseline, gemv_m, attention, prefill, ops")
    args = ap.parse_args()
    only = set(args.only.split(","))
    OUT_PATH[0] = args.out
    sweep = not args.quick
    props = torch.cuda.get_device_properties(0)
    import triton
    RESULTS["device"] = dict(name=props.name, sms=props.multi_processor_count, torch=torch.__version__,
                             triton=triton.__version__)
    t0 = time.time()
    bw = copy_bandwidth()
    RESULTS["copy_gbs"] = bw
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}; "
          f"device-to-device copy {bw:.0f} GB/s (read+write)", flush=True)

    if "wide" in only:
        print("\n== decode GEMV, K-quants: wide config sweep (small row tiles, more programs) ==")
        for label, qt, n, k in [("qwen3-4b ffn_gate+up", "Q4_K", 19456, 2560), ("qwen3-4b ffn_down", "Q6_K", 2560, 9728),
                                ("qwen3-4b ffn_down", "Q4_K", 2560, 9728), ("qwen3-4b attn_q+k", "Q4_K", 5120, 2560),
                                ("qwen3-4b attn_o", "Q4_K", 2560, 4096), ("qwen3-4b attn_v", "Q6_K", 1024, 2560),
                                ("qwen2.5 ffn_gate+up", "Q4_K", 17920, 1536), ("qwen2.5 ffn_down", "Q6_K", 1536, 8960),
                                ("qwen2.5 ffn_down", "Q4_K", 1536, 8960), ("qwen2.5 attn_q+k", "Q4_K", 1792, 1536),
                                ("qwen2.5 attn_o", "Q4_K", 1536, 1536), ("qwen2.5 attn_v", "Q6_K", 256, 1536)]:
            guard(bench_gemv, qt, n, k, label, bw, True, WIDE_K_QUANT)
            save(args.out)
        print(f"[{time.time() - t0:.0f} s]", flush=True)
    if "splitk" in only:
        print("\n== decode GEMV, split-K sweep (config = BLOCK_N, BLOCKS, warps, stages, splits) ==")
        for label, qt, n, k in SPLITK_SHAPES:
            cfgs = SPLITK_K_QUANT if qt in ("Q4_K", "Q6_K") else SPLITK_SMALL_QUANT
            if n >= 32768:
                cfgs = [c for c in cfgs if c[4] <= 2] + [(16, 2, 8, 1, 1), (32, 2, 8, 1, 1)]
            guard(bench_gemv, qt, n, k, label, bw, True, cfgs)
            save(args.out)
        for qt, n, k in (("Q4_K", 19456, 2560), ("Q6_K", 2560, 9728), ("Q8_0", 1536, 8960)):
            cfg = gemv_config(qt, n, k)
            print(f"rows bitwise {qt} {n}x{k} {cfg}: {check_rows_bitwise(qt, n, k, cfg)}", flush=True)
        print(f"[{time.time() - t0:.0f} s]", flush=True)
    if "defaults" in only:
        print("\n== decode GEMV, each shape at its default config (gemv_config) ==")
        for label, qt, n, k in SPLITK_SHAPES:
            guard(bench_gemv, qt, n, k, label, bw, False, [gemv_config(qt, n, k)])
            save(args.out)
    if "gemv" in only:
        print("\n== decode GEMV, M=1, fp32 x, CUDA graph over rotating weight copies ==")
        shapes = [
            ("qwen2.5-1.5b ffn_gate/up", "Q4_K", 8960, 1536), ("qwen2.5-1.5b ffn_down", "Q4_K", 1536, 8960),
            ("qwen2.5-1.5b ffn_down", "Q6_K", 1536, 8960), ("qwen2.5-1.5b attn_q/o", "Q4_K", 1536, 1536),
            ("qwen2.5-1.5b attn_k/v", "Q4_K", 256, 1536), ("qwen2.5-1.5b output", "Q6_K", 151936, 1536),
            ("qwen3-4b ffn_gate/up", "Q4_K", 9728, 2560), ("qwen3-4b ffn_down", "Q4_K", 2560, 9728),
            ("qwen3-4b ffn_down", "Q6_K", 2560, 9728), ("qwen3-4b attn_q", "Q4_K", 4096, 2560),
            ("qwen3-4b attn_o", "Q4_K", 2560, 4096), ("qwen3-4b attn_k/v", "Q4_K", 1024, 2560),
            ("qwen3-4b attn_v", "Q6_K", 1024, 2560), ("qwen3-4b output (tied)", "Q6_K", 151936, 2560),
            ("8960x1536 (Q8_0)", "Q8_0", 8960, 1536), ("1536x8960 (Q8_0)", "Q8_0", 1536, 8960),
            ("smollm2 output", "Q8_0", 49152, 576),
            ("8960x1536 (Q4_0)", "Q4_0", 8960, 1536), ("8960x1536 (Q4_1)", "Q4_1", 8960, 1536),
            ("8960x1536 (Q5_0)", "Q5_0", 8960, 1536), ("1536x8960 (Q5_0)", "Q5_0", 1536, 8960),
        ]
        for label, qt, n, k in shapes:
            guard(bench_gemv, qt, n, k, label, bw, sweep)
            save(args.out)
        print(f"[{time.time() - t0:.0f} s]", flush=True)
    if "baseline" in only:
        for n, k in ((8960, 1536), (9728, 2560), (2560, 9728)):
            guard(bench_dense_gemv, n, k, bw)
        save(args.out)
    if "gemv_m" in only:
        print("\n== GEMV with M > 1 (one program per (row tile, m); repeated reads from L2) ==")
        guard(bench_gemv_m, "Q4_K", 9728, 2560, bw)
        guard(bench_gemv_m, "Q6_K", 2560, 9728, bw)
        save(args.out)
        print(f"[{time.time() - t0:.0f} s]", flush=True)
    if "attention" in only:
        print("\n== split-K decode attention, fp16 KV, CUDA graph over rotating caches ==")
        guard(bench_attention, 32, 8, 128, (0, 4096, 32768), "qwen3-4b", bw)
        guard(bench_attention, 12, 2, 128, (0, 4096, 32768), "qwen2.5-1.5b", bw)
        save(args.out)
        print(f"[{time.time() - t0:.0f} s]", flush=True)
    if "prefill" in only:
        print("\n== prefill: dequant-to-scratch + cuBLAS ==")
        guard(bench_prefill, "Q4_K", 9728, 2560, "qwen3-4b ffn_gate/up", (33, 512, 2048))
        guard(bench_prefill, "Q6_K", 2560, 9728, "qwen3-4b ffn_down", (33, 512, 2048))
        guard(bench_prefill, "Q8_0", 8960, 1536, "8960x1536 Q8_0", (512,))
        save(args.out)
        print(f"[{time.time() - t0:.0f} s]", flush=True)
    if "ops" in only:
        print("\n== small decode ops (graph of 20 back-to-back calls) ==", flush=True)
        guard(bench_ops)
        save(args.out)
    bw2 = copy_bandwidth()
    RESULTS["copy_gbs_end"] = bw2
    print(f"done in {time.time() - t0:.0f} s; copy bandwidth again at the end: {bw2:.0f} GB/s", flush=True)
    save(args.out)


if __name__ == "__main__":
    main()
