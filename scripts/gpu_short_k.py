"""TALLOW_GEMV_SHORT_K on a Mamba file's own dt projections, on the GPU: each chosen layer's ssm_dt (4096 x 128 in
Mamba-1.4B) built with the switch off (the integer-dot GEMV: x rounded to Q8_1 first) and on (the fp32 GEMV), applied
to one row of the x projection's size scale, both against the fp64 product of the dequantized weight.

    python scripts/gpu_short_k.py MODEL.gguf [--layers 0,5,-1] [--scale 1.0]

The twins' logits are NaN (their random activations overflow fp16 Q8_1 blocks: docs/performance.md, session 16), so
a model-level bit check says nothing there; this compares the products themselves.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from tallow import switches
    from tallow.gguf_file import GGUFFile
    from tallow.kernels.gpu.linear import GPULinear, Scratch
    from tallow.quant.reference import dequantize

    gf = GGUFFile(sys.argv[1])
    n_layers = 1 + max(int(n.split(".")[1]) for n in gf.tensors if n.startswith("blk."))
    layers = [int(v) % n_layers for v in (sys.argv[sys.argv.index("--layers") + 1] if "--layers" in sys.argv else "0,5,-1").split(",")]
    scale = float(sys.argv[sys.argv.index("--scale") + 1]) if "--scale" in sys.argv else 1.0
    dev = torch.device(os.environ.get("SHORT_K_DEVICE", "cuda"))  # cpu: the Triton interpreter (a check of the script)
    g = torch.Generator(device=dev).manual_seed(0)
    for i in layers:
        t = gf.tensors[f"blk.{i}.ssm_dt.weight"]
        built = {}
        for on in ("0", "1"):
            os.environ["TALLOW_GEMV_SHORT_K"] = on
            switches.refresh()
            built[on] = GPULinear(t, None, dev, Scratch(dev))
        w = dequantize(t.data, t.qtype, t.n_cols).to(dev, torch.float64)
        x = torch.randn(1, t.n_cols, generator=g, device=dev) * scale
        ref = x.double() @ w.T
        line = [f"{Path(sys.argv[1]).name} layer {i} ssm_dt {t.n_rows}x{t.n_cols} {t.qtype.name}:"]
        for on, lin in built.items():
            y = lin(x).double()
            line.append(f"SHORT_K={on} {lin.kind} rel err {((y - ref).norm() / ref.norm()).item():.2e}")
        print(" ".join(line))


if __name__ == "__main__":
    main()
