"""The chunked SSD scan (kernels/triton/ssd.py, TALLOW_SSD_CHUNKED) on the GPU, alone, on the study's
Mamba-2 layer shapes: checked against the token-by-token scan (kernels/triton/ssm.py) and timed
beside it, then a sweep of its tile choices.

    python scripts/gpu_ssd.py check            # y and the state it leaves vs the token-by-token scan; both timed
    python scripts/gpu_ssd.py sweep [--quick]  # µs for a 512-token chunk: the token-by-token scan, then
                                               # (chunk, block_p, block_n, warps, precision) choices

One JSON line per result. Inputs: dt raw N(-2, 1.5) (softplus ~0.02-1, as trained models' steps),
A = -exp(U(0, 3)), x, B, C, z N(0, 1), a random entering state; n 512 (the prefill chunk) and
300 rows with n_valid 291 (a captured graph's padding). Times: CUDA events over 20 calls after 3.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
from gpu_timing import time_us

SHAPES = {  # heads, head_dim, d_state (one group each): the twins' Mamba-2 layers (the 1.5B's first: the sweep's grid)
    "falcon-h1-1.5b": (48, 64, 256),
    "falcon-h1-0.5b": (24, 64, 128),
    "falcon-h1-1.5b-deep": (24, 64, 256),
    "falcon-h1-3b": (32, 128, 256),
}


def inputs(heads, head_dim, d_state, n, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")
    rows = heads * head_dim
    bc = r(n, 2 * d_state)
    return dict(state=r(heads, head_dim, d_state), x=r(n, rows), dt=r(n, heads) * 1.5 - 2.0,
                A=-torch.exp(torch.rand(heads, generator=g, device="cuda") * 3), B=bc[:, :d_state], C=bc[:, d_state:],
                dt_bias=r(heads) * 0.5, D=r(heads), z=r(n, rows))


def timed(fn):
    return time_us(fn, 20, 3)


def run(fn, a, nv=None, **kw):
    s = a["state"].clone()
    y = fn(s, a["x"], a["dt"], a["A"], a["B"], a["C"], nv, a["dt_bias"], a["D"], a["z"], **kw)
    return y, s


def rel(u, v):
    return ((u - v).norm() / v.norm()).item()


def check() -> bool:
    from tallow.kernels.triton.ssd import ssd_scan
    from tallow.kernels.triton.ssm import ssm_scan

    ok = True
    for name, shape in SHAPES.items():
        for n, n_valid in ((512, None), (300, 291)):
            a = inputs(*shape, n)
            nv = torch.tensor([n_valid], device="cuda") if n_valid else None
            k = n_valid or n
            y0, s0 = run(ssm_scan, a, nv)
            for precision in ("tf32x3", "ieee", "tf32"):
                y1, s1 = run(ssd_scan, a, nv, precision=precision)
                e = dict(y_rel=rel(y1[:k], y0[:k]), state_rel=rel(s1, s0), state_max_abs=(s1 - s0).abs().max().item(),
                         state_max=s0.abs().max().item())
                good = e["y_rel"] < 1e-5 and e["state_rel"] < 1e-5 if precision != "tf32" else None
                ok &= good is not False
                print(json.dumps({"check": name, "n": n, "n_valid": n_valid, "precision": precision, "pass": good,
                                  **{k_: float(f"{v:.3g}") for k_, v in e.items()}}), flush=True)
            if n == 512:  # the default tiles' time beside the token-by-token scan's (the state runs on)
                st = a["state"].clone()
                args = (st, a["x"], a["dt"], a["A"], a["B"], a["C"], None, a["dt_bias"], a["D"], a["z"])
                print(json.dumps({"time": name, "n": n, "token_by_token_us": round(timed(lambda: ssm_scan(*args)), 1),
                                  "ssd_us": round(timed(lambda: ssd_scan(*args)), 1)}), flush=True)
    return ok


def sweep(quick: bool) -> None:
    from tallow.kernels.triton.ssd import ssd_scan
    from tallow.kernels.triton.ssm import ssm_scan

    # session 15 call 1 swept (32, 64, 128) x (16, 32, 64) x (32, 64) x (4, 8) with C B^T in every program:
    # 64-row blocks and 8 warps were never best; now around the best
    grid = list(itertools.product((32, 64, 128), (16, 32), (32, 64), (4,))) + [(64, 16, 32, 8), (64, 16, 64, 8)]
    results = {}
    for name in (("falcon-h1-1.5b",) if quick else SHAPES):
        a = inputs(*SHAPES[name], 512)
        st = a["state"].clone()
        args = lambda: (st, a["x"], a["dt"], a["A"], a["B"], a["C"], None, a["dt_bias"], a["D"], a["z"])
        base = timed(lambda: ssm_scan(*args()))
        default = timed(lambda: ssd_scan(*args()))
        print(json.dumps({"shape": name, "token_by_token_us": round(base, 1), "ssd_default_us": round(default, 1)}), flush=True)
        configs = grid if name == "falcon-h1-1.5b" else sorted(results, key=results.get)[:6]
        for chunk, bp, bn, w in configs:
            try:
                us = timed(lambda: ssd_scan(*args(), chunk=chunk, block_p=bp, block_n=bn, warps=w))
            except Exception as e:  # out of shared memory / registers for this tile
                print(json.dumps({"shape": name, "config": [chunk, bp, bn, w], "error": str(e)[:120]}), flush=True)
                continue
            if name == "falcon-h1-1.5b":
                results[(chunk, bp, bn, w)] = us
            print(json.dumps({"shape": name, "config": [chunk, bp, bn, w], "us": round(us, 1)}), flush=True)
        if name == "falcon-h1-1.5b":
            best = min(results, key=results.get)
            for precision in ("ieee", "tf32"):
                us = timed(lambda: ssd_scan(*args(), chunk=best[0], block_p=best[1], block_n=best[2], warps=best[3],
                                            precision=precision))
                print(json.dumps({"shape": name, "config": list(best), "precision": precision, "us": round(us, 1)}), flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("check", "sweep"))
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__}), flush=True)
    if a.what == "check":
        return 0 if check() else 1
    sweep(a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
