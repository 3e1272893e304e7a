"""GPU kernels in Triton, one op per file.

Nothing here imports `gguf` (the GPU machine does not have it) and nothing is imported at
package import: each op module pulls in triton itself, so `import tallow.kernels.triton` stays
free on machines without triton.

  planes.py            repack of raw GGUF blocks into separate byte planes (+ a self-contained
                       torch dequantization of those planes, the device-side reference)
  quant_gemv.py        decode matrix-vector products (M <= 8), dequant fused, per quant type (v1: the
                       default; fastest on mid-size shapes on the H200, see docs/performance.md)
  gemv.py              GEMV v2: word loads, codes as mantissa bits, per-sub-block scales, x gathered
                       once per call (gemv_prep / GemvInput), concat_weights for one launch per group;
                       faster for vocab projections, Q5_0 and small (smollm2) shapes
  rmsnorm.py           RMSNorm (+ residual add, + the GEMV v2 prep of its output)
  rope.py              RoPE norm/neox at a device position (+ q/k head norm, K/V cache write)
  glu.py               SwiGLU / GeGLU (ggml fp16 GELU) (+ the GEMV v2 prep of the output)
  argmax.py            two-stage greedy argmax over the vocabulary
  dequant.py           planes -> fp16/bf16 dense weight (scratch for the prefill GEMM)
  quant_gemm.py        prefill matrix products with the dequantization inside the tensor-core loop
  decode_attention.py  split-K flash-decoding attention for one query token (GQA, sliding window)
  interpreter_compat.py  a shim so TRITON_INTERPRET=1 works under NumPy >= 2.4

Each op module exposes a plain function (`quant_gemv`, `quant_gemm`, `dequantize_to`,
`decode_attention`) and a torch reference (`quant_gemv_reference`, `dequantize_planes`,
`decode_attention_reference`); the dispatcher owns the TALLOW_TRITON_* switches.
"""

import os as _os

if _os.environ.get("TRITON_INTERPRET") == "1":
    from . import interpreter_compat as _compat

    _compat.apply()
