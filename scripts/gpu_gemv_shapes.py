"""Sweep the decode GEMV's configs over named shapes (gpu_bench_kernels.py's harness: CUDA graph
over rotating weight copies, error checked against fp32), on a GPU.

    python scripts/gpu_gemv_shapes.py gemma4-e2b [--out FILE]

Each shape prints the default config (gemv_config) and the best of the sweep, with GB/s and the
fraction of the device copy bandwidth measured in the same process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_bench_kernels as kb  # noqa: E402

SHAPES = {
    # scripts/make_gemma4_twin.py's E2B table: dim 1536; sliding layers 8 x 256 Q heads and one
    # 256 KV head, global layers 8 x 512 and one 512; MLP 6144, double wide (12288) in the
    # shared-KV layers; per-layer inputs 256; vocabulary 262144.
    "gemma4-e2b": [("sliding q+k", "Q4_K", 2304, 1536), ("global q+k", "Q4_K", 4608, 1536),
                   ("sliding v", "Q6_K", 256, 1536), ("global v", "Q6_K", 512, 1536),
                   ("sliding o", "Q4_K", 1536, 2048), ("global o", "Q4_K", 1536, 4096),
                   ("gate+up", "Q4_K", 12288, 1536), ("gate+up wide", "Q4_K", 24576, 1536),
                   ("down", "Q4_K", 1536, 6144), ("down", "Q6_K", 1536, 6144), ("down wide", "Q4_K", 1536, 12288),
                   ("ple gate", "Q4_K", 256, 1536), ("ple proj", "Q4_K", 1536, 256),
                   ("output (tied)", "Q6_K", 262144, 1536)],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(SHAPES))
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gemv_shapes.json"))
    args = ap.parse_args()
    bw = kb.copy_bandwidth()
    print(f"device-to-device copy {bw:.0f} GB/s (read+write)", flush=True)
    configs = sorted(set(kb.SPLITK_K_QUANT) | {c + (1,) for c in kb.WIDE_K_QUANT}
                     | {(32, 2, 8, 1, 1), (64, 2, 8, 1, 1), (32, 1, 8, 1, 1), (32, 2, 4, 1, 1), (32, 4, 8, 3, 1)})
    for label, qt, n, k in SHAPES[args.model]:
        kb.guard(kb.bench_gemv, qt, n, k, label, bw, True, list(configs))
    with open(args.out, "w") as f:
        json.dump(kb.RESULTS, f, indent=1)


if __name__ == "__main__":
    main()
