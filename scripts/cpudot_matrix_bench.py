"""Decode products of one model, C kernel against the torch layer make_linear builds, in one process:
the best of N calls per matrix (the least disturbed on a shared machine) and the median, summed over
every linear of the model (one token's matrix work; attention and the rest not included).

  PYTHONPATH=$PWD python scripts/cpudot_matrix_bench.py MODEL [--threads 1,2] [--calls 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

from tallow.families.tensors import OUTPUT, model_roles
from tallow.gguf_file import GGUFFile
from tallow.kernels.cpu import ggml_dot
from tallow.kernels.cpu.linear import _make_linear
from tallow.registry import resolve_model


def timed(f, calls: int) -> tuple[float, float]:
    f()
    ts = []
    for _ in range(calls):
        a = time.perf_counter()
        f()
        ts.append(time.perf_counter() - a)
    return min(ts), statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args()
    gf = GGUFFile(resolve_model(args.model, pull_missing=False))
    roles = model_roles(gf.tensors)
    groups = defaultdict(list)  # (type, rows, cols, role) -> names: one of each is timed, times the count
    for name, t in gf.tensors.items():
        if len(t.shape) == 2 and t.n_rows > 1 and t.qtype in ggml_dot.TYPES:
            role = roles.get(name)
            if role == "token_embd" and "output.weight" in gf.tensors:
                continue
            groups[(t.qtype.name, t.n_rows, t.n_cols, role == OUTPUT or name == "output.weight" or role == "token_embd")].append(name)
    for threads in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(threads)
        tot = {"C best": 0.0, "C median": 0.0, "torch best": 0.0, "torch median": 0.0}
        for (qt, n, k, out), names in sorted(groups.items()):
            t = gf.tensors[names[0]]
            torch_layer = _make_linear(t, role=OUTPUT if out else None)
            w = ggml_dot._as_uint8_tensor(t.data)
            x = torch.randn(1, k)
            cb, cm = timed(lambda: ggml_dot.linear(w, t.qtype, x), args.calls)
            tb, tm = timed(lambda: torch_layer(x), args.calls)
            c = len(names)
            tot["C best"] += c * cb
            tot["C median"] += c * cm
            tot["torch best"] += c * tb
            tot["torch median"] += c * tm
            print(f"  {threads}t {qt:5s} {n:6d}x{k:<5d} x{c:3d} ({torch_layer.kind:8s}): C {cb * 1e3:.3f}/{cm * 1e3:.3f} ms, "
                  f"torch {tb * 1e3:.3f}/{tm * 1e3:.3f} ms (best/median)")
        print(f"{args.model}, {threads} thread(s), all decode products per token: "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in tot.items()))


if __name__ == "__main__":
    main()
