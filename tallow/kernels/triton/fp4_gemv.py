"""Decode GEMV over 4-bit float weights (MXFP4, NVFP4) straight from their GGUF blocks.

Hopper has no FP4 instructions, so the E2M1 codes are decoded in registers: a code's magnitude
bits m give the doubled value m for m < 4, else (4 or 6) << ((m - 4) >> 1) (4, 6, 8, 12); the
block scale is built from its bits (MXFP4's E8M0 as 2^(e - 128), NVFP4's UE4M3 as
(1 + man/8) * 2^(exp - 7) / 2), exactly as quant/fp4.py. The weight is read as the file stores it
(array of blocks: 17 bytes per 32 values, 36 per 64), one program per BLOCK_N rows and one row of
x, accumulating in fp32 block by block.

Tested under TRITON_INTERPRET=1 (tests/kernel_cases.py). The GPU engine runs it for routed experts
(kernels/triton/moe_gemv.py reuses `_fp4_row_dot`); other FP4 matrices take the dense fallback.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["fp4_gemv", "fp4_gemv_reference"]

MXFP4, NVFP4 = 39, 40  # GGUF type ids (ggml.h)
_LAYOUT = {MXFP4: (32, 17), NVFP4: (64, 36)}  # elements, bytes per block


@triton.jit
def _e2m1_doubled(c):
    """4-bit E2M1 codes (int32) -> their values doubled (kvalues_mxfp4), float32."""
    mag = c & 7
    big = tl.where((mag & 1) == 1, 6, 4) << (tl.maximum(mag - 4, 0) >> 1)
    v = tl.where(mag < 4, mag, big).to(tl.float32)
    return tl.where(c >= 8, -v, v)


@triton.jit
def _ue4m3_half(d):
    """NVFP4's UE4M3 scale bytes (int32) -> their float32 values halved (the codes' values are doubled);
    0 and 0x7F mean 0."""
    ex, man = (d >> 3) & 15, (d & 7).to(tl.float32)
    pow2 = ((ex + 120) << 23).to(tl.float32, bitcast=True)  # 2^(ex - 7)
    raw = tl.where(ex == 0, man * 0.001953125, (1.0 + man * 0.125) * pow2)
    return tl.where((d == 0) | (d == 0x7F), 0.0, raw * 0.5)


@triton.jit
def _fp4_row_dot(x_row, w_ptr, rows, K, NV: tl.constexpr, BLOCK_N: tl.constexpr):
    """sum_k W[rows, k] * x_row[k] (BLOCK_N,) fp32 for the FP4 rows `rows` (int64) of the weight
    at w_ptr (array of blocks, rows of K values). Shared with the routed-expert GEMV (moe_gemv.py)."""
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if NV:  # NVFP4: 4 sub-blocks of 16, a UE4M3 scale each, then 8 code bytes per sub-block
        nb = K // 64
        s = tl.arange(0, 4)
        j = tl.arange(0, 8)
        for b in range(nb):
            base = w_ptr + rows * (nb * 36) + b * 36
            scale = _ue4m3_half(tl.load(base[:, None] + s[None, :]).to(tl.int32))  # (BN, 4)
            q = tl.load(base[:, None, None] + 4 + s[None, :, None] * 8 + j[None, None, :]).to(tl.int32)  # (BN, 4, 8)
            k0 = b * 64 + s[:, None] * 16 + j[None, :]  # (4, 8): the low nibbles' positions
            x_lo = tl.load(x_row + k0).to(tl.float32)
            x_hi = tl.load(x_row + k0 + 8).to(tl.float32)
            part = _e2m1_doubled(q & 15) * x_lo[None, :, :] + _e2m1_doubled(q >> 4) * x_hi[None, :, :]
            acc += tl.sum(tl.sum(part, axis=2) * scale, axis=1)
    else:  # MXFP4: one E8M0 exponent, then 16 code bytes
        nb = K // 32
        j = tl.arange(0, 16)
        for b in range(nb):
            base = w_ptr + rows * (nb * 17) + b * 17
            e = tl.load(base).to(tl.int32)
            bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
            scale = bits.to(tl.float32, bitcast=True)
            q = tl.load(base[:, None] + 1 + j[None, :]).to(tl.int32)  # (BN, 16)
            x_lo = tl.load(x_row + b * 32 + j).to(tl.float32)
            x_hi = tl.load(x_row + b * 32 + 16 + j).to(tl.float32)
            part = _e2m1_doubled(q & 15) * x_lo[None, :] + _e2m1_doubled(q >> 4) * x_hi[None, :]
            acc += tl.sum(part, axis=1) * scale
    return acc


@triton.jit
def _fp4_gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, stride_xm, stride_ym, NV: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    rows = tl.minimum(rows, N - 1).to(tl.int64)
    m = tl.program_id(1)
    acc = _fp4_row_dot(x_ptr + m * stride_xm, w_ptr, rows, K, NV, BLOCK_N)
    tl.store(y_ptr + m * stride_ym + rows, acc, mask=row_ok)


def fp4_gemv(x: torch.Tensor, raw: torch.Tensor, qtype: int, block_n: int = 16) -> torch.Tensor:
    """x float32 (M, K) @ W^T for W the FP4 weight `raw`: uint8 (N, row_bytes), GGUF type
    `qtype` (39 MXFP4, 40 NVFP4), on x's device. Returns float32 (M, N)."""
    block, size = _LAYOUT[int(qtype)]
    m, k = x.shape
    n = raw.shape[0]
    if k % block or raw.shape[1] != k // block * size:
        raise ValueError(f"a row of {k} values needs {k // block * size} bytes of type {qtype}, not {raw.shape[1]}")
    x = x.float().contiguous()
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, block_n), m)
    _fp4_gemv_kernel[grid](x, raw.contiguous(), y, n, k, x.stride(0), y.stride(0), NV=int(qtype) == NVFP4,
                           BLOCK_N=block_n)
    return y


def fp4_gemv_reference(x: torch.Tensor, raw: torch.Tensor, qtype: int) -> torch.Tensor:
    """The product with the weight dequantized by quant/fp4.py (fp32, then float64 accumulation)."""
    from ...quant.fp4 import dequantize_mxfp4, dequantize_nvfp4

    block, size = _LAYOUT[int(qtype)]
    fn = dequantize_mxfp4 if int(qtype) == MXFP4 else dequantize_nvfp4
    w = fn(raw.reshape(-1, size)).reshape(raw.shape[0], -1)
    return (x.double() @ w.double().T).float()
