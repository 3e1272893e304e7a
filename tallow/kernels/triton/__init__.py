"""GPU kernels in Triton, one op per file.

Nothing here imports `gguf` (the GPU machine does not have it) and nothing is imported at
package import: each op module pulls in triton itself, so `import tallow.kernels.triton` stays
free on machines without triton.

  planes.py           repack of raw GGUF blocks into separate byte planes (+ a self-contained
                      torch dequantization of those planes, the device-side reference)
  gemv_q4_k.py ...    decode matrix-vector products, one per quant type, dequant fused
  quant_gemv.py       `quant_gemv(x, weight)`: picks the per-type kernel, plus its reference
  dequant.py          planes -> fp16/bf16 dense weight (scratch for the prefill GEMM)
  gemm_q4_k.py ...    prefill matrix products with the dequantization inside the tensor-core loop
  decode_attention.py split-K flash-decoding attention for one query token (GQA, sliding window)
"""

import os as _os

if _os.environ.get("TRITON_INTERPRET") == "1":
    from . import interpreter_compat as _compat

    _compat.apply()
