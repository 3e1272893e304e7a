"""MXFP4 / NVFP4 weights on the CPU: the exact dense-bf16 home against the int8 requantizations.

    python scripts/fp4_cpu_paths.py [--n 2048] [--k 2048] [--threads 1]

For each type, a random-byte weight (N, K) with realistic scales, through make_linear's modes:
  auto   the default: MXFP4 as its exact group-32 int8 codes in the int4 kernel (kind int8g,
         ~1.25 bytes/weight), NVFP4 as dense bf16
  dense  bf16 copy of the dequantized weight (exact for FP4: quant/fp4.py), 2 bytes/weight
  int8   per-row int8 requantization (lossy), 1 byte/weight, torch's _weight_int8pack_mm
Prints resident MiB, ms per weight for 1 row (decode) and 64 rows (prefill), cycling through
--layers distinct weights (as a model's layers stream from DRAM), median of --reps, and the
output's relative error against the fp32 reference product (ReferenceLinear).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from median_ms import median_ms  # noqa: E402  (scripts/, the running script's folder)
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT  # noqa: E402

from tallow.gguf_file import TensorInfo  # noqa: E402
from tallow.kernels.cpu.linear import make_linear  # noqa: E402


def random_fp4(qtype: QT, n: int, k: int, seed: int = 0) -> TensorInfo:
    """Random codes; scales around 2^-7 (MXFP4 exponent 120..122; NVFP4 UE4M3 0x18..0x27)."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n * k // block, size), dtype=np.uint8)
    if qtype == QT.MXFP4:
        raw[:, 0] = rng.integers(120, 123, raw.shape[0])
    else:
        raw[:, :4] = rng.integers(0x18, 0x28, (raw.shape[0], 4))
    raw = raw.reshape(n, -1)
    return TensorInfo("w", qtype, (k, n), 0, raw.nbytes, raw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--layers", type=int, default=16, help="distinct weights cycled through, so they stream from DRAM")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"({a.n} x {a.k}) weight, threads {torch.get_num_threads()}")
    for qtype in (QT.MXFP4, QT.NVFP4):
        t = random_fp4(qtype, a.n, a.k)
        ref = make_linear(t, mode="reference")
        x1, x64 = torch.randn(1, a.k), torch.randn(64, a.k)
        y_ref = ref(x64)
        print(f"{qtype.name}: file {t.n_bytes / 2**20:.2f} MiB")
        others = [random_fp4(qtype, a.n, a.k, seed) for seed in range(1, a.layers)]
        for mode in ("auto", "dense", "int8"):
            lin = make_linear(t, mode=mode)
            err = float((lin(x64) - y_ref).norm() / y_ref.norm())
            stack = [lin] + [make_linear(o, mode=mode) for o in others]

            def run(x, stack=stack):
                for layer in stack:
                    layer(x)

            n = len(stack)
            print(f"  {mode:6s} {lin.kind:10s} {lin.nbytes / 2**20:6.2f} MiB  1 row {median_ms(lambda: run(x1), a.reps) / n:7.3f} ms"
                  f"  64 rows {median_ms(lambda: run(x64), max(3, a.reps // 10)) / n:7.3f} ms  rel. error {err:.1e}")


if __name__ == "__main__":
    main()
