"""One-row products of one weight type with TALLOW_CPU_ROW_PAIRS on and off (ggml_dot.row_pairs), per matrix shape of
one model, in one process, alternating, best of 7 rounds of 200 calls each (the evidence for a type's two-row form).

    PYTHONPATH=$PWD python scripts/cpu_row_pairs_ab.py MODEL.gguf Q5_1
"""
import sys
import time

import torch
from gguf import GGMLQuantizationType as QT

from tallow.gguf_file import GGUFFile
from tallow.kernels.cpu import ggml_dot

path, qt = sys.argv[1], QT[sys.argv[2]]
shapes = {}
for t in GGUFFile(path).tensors.values():
    if t.qtype == qt and len(t.shape) == 2:
        shapes.setdefault((t.n_rows, t.n_cols), t)
before = ggml_dot.row_pairs()
try:
    for (n, k), t in sorted(shapes.items()):
        w, xq = t.private_view(), ggml_dot.quantize(torch.randn(1, k), qt)
        best = {True: float("inf"), False: float("inf")}
        for _ in range(7):
            for on in (True, False):
                ggml_dot.row_pairs(on)
                a = time.perf_counter()
                for _ in range(200):
                    ggml_dot.gemv_quantized(w, qt, k, xq)
                best[on] = min(best[on], (time.perf_counter() - a) / 200)
        print(f"{qt.name} {n}x{k}: pairs {best[True] * 1e3:.4f} ms, single {best[False] * 1e3:.4f} ms, "
              f"pairs/single {best[True] / best[False]:.2f}")
finally:
    ggml_dot.row_pairs(before)
