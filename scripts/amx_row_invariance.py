"""Is a bf16 GEMM row-invariant on this CPU? One row computed alone against the same row of a 64-row
product, and the time of a 512x1536 @ 1536x8960 product (docs/performance.md, session 10 CPU).

    python scripts/amx_row_invariance.py                 # as tallow runs it (oneDNN capped below AMX)
    TALLOW_CPU_AMX=1 python scripts/amx_row_invariance.py   # oneDNN's own choice (AMX where present)
"""

import os
import time

import tallow  # noqa: F401  (sets ONEDNN_MAX_CPU_ISA before torch's first operation, unless TALLOW_CPU_AMX=1)
import torch

torch.manual_seed(0)
w, x = torch.randn(1536, 576).bfloat16(), torch.randn(64, 576).bfloat16()
full, one = x @ w.T, torch.cat([x[i:i + 1] @ w.T for i in range(64)])
print("ONEDNN_MAX_CPU_ISA", os.environ.get("ONEDNN_MAX_CPU_ISA"), "row-invariant", torch.equal(full, one),
      "max diff", float((full.float() - one.float()).abs().max()))
w2, x2 = torch.randn(8960, 1536).bfloat16(), torch.randn(512, 1536).bfloat16()
x2 @ w2.T
t = time.perf_counter()
for _ in range(3):
    x2 @ w2.T
print(f"512x1536 @ 1536x8960 bf16: {(time.perf_counter() - t) / 3 * 1e3:.1f} ms")
