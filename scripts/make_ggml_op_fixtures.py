"""Record libggml-cpu's own activation quantization and block dot products on random blocks
into tests/fixtures/ggml_ops.json, for tests/test_ggml_numerics.py (dev only: CI has no ggml).

  tar xJf ../shared/llama.cpp/llama-b11434-cpu.tar.xz -C /tmp/llama
  LD_LIBRARY_PATH=/tmp/llama python scripts/make_ggml_op_fixtures.py /tmp/llama

It calls ggml_get_type_traits_cpu(type) through ctypes: from_float of the weight's
vec_dot_type on the activations, then vec_dot(weight row, quantized activations) per row --
exactly what ggml_compute_forward_mul_mat does per output element on this machine (AVX-512).
(llama-cpp-python 0.3.36's libggml-cpu is built with AVX-VNNI and stops with an illegal
instruction in vec_dot on the development machine; its from_float gives the same bytes.)
"""

from __future__ import annotations

import base64
import ctypes
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

# Bytes per block of ggml's activation types (gguf's table lists Q8_1 with float d and s, 40
# bytes; ggml's block_q8_1 holds two fp16: 36).
ACT_BLOCK = {QT.Q8_0: (32, 34), QT.Q8_1: (32, 36), QT.Q8_K: (256, 292)}
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ggml_ops.json"
K, N = 512, 6


class _Traits(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


_FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def random_k_blocks(qtype: QT, rng: np.random.Generator) -> np.ndarray:
    """Random bytes for a K-quant weight (N, row bytes) with sane fp16 super-block scales."""
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(N, K // 256, block_bytes), dtype=np.uint8)
    d = (rng.uniform(0.5, 2.0, size=(N, K // 256)) * 1e-3).astype(np.float16).view(np.uint8).reshape(N, K // 256, 2)
    if qtype == QT.Q6_K:
        raw[..., 208:210] = d
    else:  # Q4_K / Q5_K: d then dmin
        raw[..., 0:2] = d
        raw[..., 2:4] = (rng.uniform(0.5, 2.0, size=(N, K // 256)) * 1e-3).astype(np.float16).view(np.uint8).reshape(N, K // 256, 2)
    return raw.reshape(N, -1)


def main() -> None:
    lib_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/llama")
    lib = ctypes.CDLL(str(next(p for p in (lib_dir / "libggml-cpu.so", lib_dir / "libggml-cpu.so.0") if p.exists())))
    lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_Traits)
    lib.ggml_cpu_init()
    rng = np.random.default_rng(14)
    # Activations like a residual stream's: heavy-tailed, one all-zero block, one large outlier
    # (like a first token's), and in block 2 a largest magnitude held by both signs (-40, +40).
    x = (rng.standard_normal(K) * rng.standard_normal(K) ** 2).astype(np.float32)
    x[32:64] = 0
    x[300] = 900.0
    x[64 + 3], x[64 + 9] = -40.0, 40.0
    cases = []
    for qtype in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):
            raw = random_k_blocks(qtype, rng)
        else:
            raw = quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, qtype)
        traits = lib.ggml_get_type_traits_cpu(int(qtype)).contents
        vt = QT(traits.vec_dot_type)
        vt_traits = lib.ggml_get_type_traits_cpu(int(vt)).contents
        xq = np.zeros(K // ACT_BLOCK[vt][0] * ACT_BLOCK[vt][1], np.uint8)
        _FROM_FLOAT(vt_traits.from_float)(x.ctypes.data, xq.ctypes.data, K)
        dots = np.zeros(N, np.float32)
        for n in range(N):
            row = np.ascontiguousarray(raw[n])
            _VEC_DOT(traits.vec_dot)(K, dots[n:].ctypes.data, 0, row.ctypes.data, 0, xq.ctypes.data, 0, 1)
        cases.append({"weight_type": qtype.name, "vec_dot_type": vt.name, "weight": _b64(raw),
                      "x_quantized": _b64(xq), "dots": dots.tolist()})
        print(f"{qtype.name}: vec_dot_type {vt.name}, dots {dots[:3]}")
    OUT.write_text(json.dumps({"source": f"libggml-cpu b11434 ({lib_dir})", "K": K, "N": N, "x": _b64(x),
                               "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
