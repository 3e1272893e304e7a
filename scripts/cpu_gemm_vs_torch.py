"""Prompt products of one weight type: the C kernel's register-tiled GEMM (over the file's bytes, llama.cpp's prompt
order) against the torch layer make_linear builds for that type on the torch paths, on one model's matrices of that
type, 512 rows, in one process, alternating, best of 5 each (the evidence for ggml_dot.PREFILL_TYPES).

    PYTHONPATH=$PWD python scripts/cpu_gemm_vs_torch.py MODEL.gguf Q5_K [--rows 512]
"""
import argparse
import time

import torch
from gguf import GGMLQuantizationType as QT

from tallow.families.tensors import OUTPUT, TOKEN_EMBD, model_roles
from tallow.gguf_file import GGUFFile
from tallow.kernels.cpu import ggml_dot
from tallow.kernels.cpu.linear import _make_linear

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("qtype")
ap.add_argument("--rows", type=int, default=512)
args = ap.parse_args()
qt = QT[args.qtype]
h = GGUFFile(args.model)
roles = model_roles(h.tensors)
shapes: dict[tuple[int, int], list] = {}
for t in h.tensors.values():  # prompts project every row through these; not the embedding or the output
    if t.qtype == qt and len(t.shape) == 2 and roles.get(t.name) not in (TOKEN_EMBD, OUTPUT):
        shapes.setdefault((t.n_rows, t.n_cols), []).append(t)
torch.manual_seed(0)
tot_c = tot_t = 0.0
for (n, k), ts in sorted(shapes.items()):
    t = ts[0]
    layer, w = _make_linear(t), t.private_view()
    x = torch.randn(args.rows, k) * 0.5

    def run_c():
        return ggml_dot.gemv_quantized(w, qt, k, ggml_dot.quantize(x.numpy(), qt))

    run_c(), layer(x)
    bc, bt = [], []
    for _ in range(5):
        a = time.perf_counter(); run_c(); bc.append(time.perf_counter() - a)
        a = time.perf_counter(); layer(x); bt.append(time.perf_counter() - a)
    print(f"{t.name:28s} {n}x{k} (x{len(ts)}): C {min(bc) * 1e3:.1f} ms, torch {type(layer).__name__} {min(bt) * 1e3:.1f} ms, "
          f"C/torch {min(bc) / min(bt):.2f}")
    tot_c, tot_t = tot_c + len(ts) * min(bc), tot_t + len(ts) * min(bt)
print(f"every {qt.name} matrix a prompt runs, times its count: C {tot_c:.2f} s, torch {tot_t:.2f} s, C/torch {tot_c / tot_t:.2f}")
