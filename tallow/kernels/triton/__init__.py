"""GPU kernels in Triton, one op per file.

Nothing here imports `gguf` (the GPU machine does not have it) and nothing is imported at
package import: each op module pulls in triton itself, so `import tallow.kernels.triton` stays
free on machines without triton.

  planes.py            repack of raw GGUF blocks into separate byte planes (+ a self-contained
                       torch dequantization of those planes, the device-side reference)
  quant_gemv.py        decode matrix-vector products (M <= 8 rows, each bit-exact as its own
                       one-row product), dequant fused, one kernel for six quant types
  rmsnorm.py           RMSNorm (+ residual add); a normed branch joining the stream (+ layer
                       scale, + the next norm) in one launch
  rope.py              RoPE norm/neox at device positions (+ q/k head norm, K/V cache write),
                       one token or consecutive rows of a verification pass
  glu.py               SwiGLU / GeGLU (ggml fp16 GELU), gate/up as views of one GEMV output
  argmax.py            two-stage greedy argmax over the vocabulary
  fp4_gemv.py          decode GEMV over MXFP4/NVFP4 blocks, E2M1 decoded in registers
  moe_gemv.py          routed experts' GEMV: one launch over the (token, slot) pairs of a
                       stacked expert weight, expert ids read on the device
  moe_route.py         the router's softmax, top-k and renormalisation, one launch per layer
  dequant.py           planes -> fp16/bf16 dense weight (scratch for the prefill cuBLAS product)
  decode_attention.py  split-K flash-decoding attention for one query token or consecutive rows
                       (GQA, sliding window, rings, int8/fp8 caches)
  prefill_attention.py flash attention of a prefill chunk over the KV pool (rings, int8/fp8)
  ssm.py               Mamba's causal conv1d (+ SiLU, conv state) and selective scan (Mamba-1
                       and Mamba-2, + D skip and SiLU(z) gate, SSM state in registers), one
                       launch per decode step or prefill chunk (TALLOW_SSM_TRITON)
  pdl.py               programmatic dependent launch of the decode step's kernels (TALLOW_PDL)
  interpreter_compat.py  a shim so TRITON_INTERPRET=1 works under NumPy >= 2.4

Each op module exposes a plain function (`quant_gemv`, `dequantize_to`,
`decode_attention`) and a torch reference (`quant_gemv_reference`, `dequantize_planes`,
`decode_attention_reference`); their TALLOW_TRITON_GEMV, TALLOW_TRITON_OPS and TALLOW_TRITON_ATTENTION switches live in tallow/switches.py.
"""

import os as _os

INTERPRETED = _os.environ.get("TRITON_INTERPRET") == "1"  # kernels run by Triton's CPU interpreter

if INTERPRETED:
    from . import interpreter_compat as _compat

    _compat.apply()
