"""Ground-truth dequantization of GGUF tensor data, in vectorized torch.

This module is the numeric contract of tallow: every fast kernel (int4/int8 repacks on CPU,
Triton kernels later) is tested against it, and it is tested bit-for-bit against
`gguf.quants.dequantize`, the reference that llama.cpp's Python tooling ships. To stay
bit-exact we reproduce the reference's float operation order exactly (e.g. Q4_K is
`(d * sc) * q - (dmin * m)` with separate multiply and subtract, never a fused multiply-add),
and all integer unpacking is done in uint8 before converting to float32.

Large tensors (gemma's 168M-element embedding table) are processed in row chunks so that
intermediates stay cache-sized and peak memory is the output plus a few megabytes.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from ..errors import ModelFileError
from .fp4 import dequantize_mxfp4, dequantize_nvfp4

__all__ = ["SUPPORTED_TYPES", "dequantize", "dequantize_blocks", "block_dims"]

QK_K = 256
_CHUNK_ELEMENTS = 1 << 21  # elements dequantized per chunk: 8 MiB of float32 output


def block_dims(qtype: QT) -> tuple[int, int]:
    """(elements per block, bytes per block) of a ggml type."""
    return GGML_QUANT_SIZES[qtype]


# --- small helpers -------------------------------------------------------------------------

def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte `start` of each block, as float32 (B, 1)."""
    return blocks[:, start:start + 2].contiguous().view(torch.float16).float()


_SHIFT_0_4 = torch.tensor([0, 4], dtype=torch.uint8)
_SHIFT_2BIT = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)
_SHIFT_BITS = torch.arange(8, dtype=torch.uint8)


def _nibbles(qs: torch.Tensor, chunk: int) -> torch.Tensor:
    """Split bytes (B, n) into nibbles laid out as ggml does: for each `chunk` bytes, first all
    low nibbles, then all high nibbles. Returns uint8 (B, n // chunk, 2, chunk)."""
    b = qs.reshape(qs.shape[0], -1, 1, chunk)
    return (b >> _SHIFT_0_4.view(1, 1, 2, 1)) & 15


def _crumbs(qs: torch.Tensor, chunk: int) -> torch.Tensor:
    """Split bytes (B, n) into 2-bit fields: for each `chunk` bytes, the fields at shift 0, 2, 4, 6
    in turn. Returns uint8 (B, n // chunk, 4, chunk)."""
    b = qs.reshape(qs.shape[0], -1, 1, chunk)
    return (b >> _SHIFT_2BIT.view(1, 1, 4, 1)) & 3


def _bits(qh: torch.Tensor, chunk: int) -> torch.Tensor:
    """Split bytes (B, n) into single bits: for each `chunk` bytes, bit 0 of each, then bit 1, ...
    Returns uint8 (B, n // chunk, 8, chunk)."""
    b = qh.reshape(qh.shape[0], -1, 1, chunk)
    return (b >> _SHIFT_BITS.view(1, 1, 8, 1)) & 1


def _bits_le32(qh: torch.Tensor) -> torch.Tensor:
    """The 32 bits of a little-endian uint32 stored as 4 bytes (B, 4), bit i at index i: (B, 32)."""
    return ((qh.unsqueeze(-1) >> _SHIFT_BITS.view(1, 1, 8)) & 1).reshape(qh.shape[0], 32)


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpack the 12-byte, 8 x (6-bit scale, 6-bit min) field of Q4_K/Q5_K: uint8 (B, 8) each.

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 hold
    mins 0-3 likewise; bytes 8-11 hold the low nibbles of scales 4-7 and mins 4-7.
    """
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], dim=1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], dim=1)
    return sc, mn


# --- per-type block dequantizers: uint8 (B, type_size) -> float32 (B, block_size) ----------

def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b, 0)
    q = _nibbles(b[:, 2:18], 16).reshape(-1, 32).to(torch.int8) - 8
    return d * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b, 0), _f16(b, 2)
    q = _nibbles(b[:, 4:20], 16).reshape(-1, 32)
    return d * q.float() + m


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b, 0)
    hi = _bits_le32(b[:, 2:6])
    lo = _nibbles(b[:, 6:22], 16).reshape(-1, 32)
    q = (lo | (hi << 4)).to(torch.int8) - 16
    return d * q.float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b, 0), _f16(b, 2)
    hi = _bits_le32(b[:, 4:8])
    lo = _nibbles(b[:, 8:24], 16).reshape(-1, 32)
    return d * (lo | (hi << 4)).float() + m


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b, 0)
    return b[:, 2:34].contiguous().view(torch.int8).float() * d


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, 0:16]
    d, dmin = _f16(b, 80), _f16(b, 82)
    dl = (d * (scales & 15).float()).view(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).view(n, 16, 1)
    q = _crumbs(b[:, 16:80], 32).reshape(n, 16, 16).float()  # element = half*128 + shift*32 + byte
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, sraw = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    d = _f16(b, 108)
    low = _nibbles(sraw[:, 0:8], 8).reshape(n, 16)  # scales 0-7 low nibbles, then 8-15
    high = _crumbs(sraw[:, 8:12], 4).reshape(n, 16)  # 2 high bits each
    sc = (low | (high << 4)).to(torch.int8) - 32
    dl = (d * sc.float()).view(n, 16, 1)
    ql = _crumbs(qs, 32).reshape(n, 16, 16).to(torch.int8)
    qh = _bits(hmask, 32).reshape(n, 16, 16) ^ 1  # a clear mask bit means "subtract 4"
    q = ql - (qh << 2).to(torch.int8)
    return (dl * q.float()).reshape(n, QK_K)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    dl = (d * sc.float()).view(n, 8, 1)
    ml = (dmin * mn.float()).view(n, 8, 1)
    q = _nibbles(b[:, 16:144], 32).reshape(n, 8, 32).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    dl = (d * sc.float()).view(n, 8, 1)
    ml = (dmin * mn.float()).view(n, 8, 1)
    lo = _nibbles(b[:, 48:176], 32).reshape(n, 8, 32)
    hi = _bits(b[:, 16:48], 32).reshape(n, 8, 32)
    q = (lo | (hi << 4)).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc = b[:, 192:208].contiguous().view(torch.int8).float()
    d = _f16(b, 208)
    dl = (d * sc).view(n, 16, 1)
    lo = _nibbles(b[:, 0:128], 64).reshape(n, 8, 32)  # element = half*128 + nibble*64 + byte
    hi = _crumbs(b[:, 128:192], 32).reshape(n, 8, 32)  # element = half*128 + shift*32 + byte
    q = ((lo | (hi << 4)).to(torch.int8) - 32).reshape(n, 16, 16).float()
    return (dl * q).reshape(n, QK_K)


def _f32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def _f16_t(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _bf16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.bfloat16).float()


_BLOCK_FNS: dict[QT, Callable[[torch.Tensor], torch.Tensor]] = {
    QT.F32: _f32,
    QT.F16: _f16_t,
    QT.BF16: _bf16,
    QT.Q4_0: _q4_0,
    QT.Q4_1: _q4_1,
    QT.Q5_0: _q5_0,
    QT.Q5_1: _q5_1,
    QT.Q8_0: _q8_0,
    QT.Q2_K: _q2_k,
    QT.Q3_K: _q3_k,
    QT.Q4_K: _q4_k,
    QT.Q5_K: _q5_k,
    QT.Q6_K: _q6_k,
    QT.MXFP4: dequantize_mxfp4,  # 4-bit floats: quant/fp4.py
    QT.NVFP4: dequantize_nvfp4,
}

SUPPORTED_TYPES: frozenset[QT] = frozenset(_BLOCK_FNS)


def _check_type(qtype: QT) -> None:
    if qtype not in _BLOCK_FNS:
        name = getattr(qtype, "name", str(qtype))
        raise ModelFileError(f"Tensor type {name} is not supported by tallow (supported: "
                             f"{', '.join(sorted(t.name for t in SUPPORTED_TYPES))}).")


def dequantize_blocks(blocks: torch.Tensor, qtype: QT) -> torch.Tensor:
    """Dequantize whole blocks: uint8 (B, type_size) -> float32 (B, block_size)."""
    _check_type(qtype)
    return _BLOCK_FNS[qtype](blocks)


def _as_uint8_tensor(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(raw, torch.Tensor):
        return raw if raw.dtype == torch.uint8 else raw.view(torch.uint8)
    # GGUF data is a read-only mmap view; torch.from_numpy would warn about it (and a tensor
    # aliasing the map would die with it), so take a private copy of just this chunk.
    return torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True))


def dequantize(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int) -> torch.Tensor:
    """Dequantize GGUF tensor bytes.

    raw: uint8 (n_rows, row_bytes) (numpy, e.g. `TensorInfo.data` or a few rows of it, or torch).
    n_cols: the row length in elements (ggml's shape[0]).
    Returns float32 (n_rows, n_cols), a fresh tensor not aliasing `raw`.
    Raises ModelFileError for a type tallow does not support or bytes that do not fit the type.
    """
    _check_type(qtype)
    qtype = QT(qtype)
    block_size, type_size = block_dims(qtype)
    if raw.ndim == 1:
        raw = raw.reshape(1, -1)
    n_rows, row_bytes = int(raw.shape[0]), int(raw.shape[1])
    if n_cols % block_size or n_cols // block_size * type_size != row_bytes:
        raise ModelFileError(
            f"A {qtype.name} row of {n_cols} elements needs {n_cols // block_size * type_size} bytes "
            f"in whole blocks of {block_size}, but the data has {row_bytes} bytes per row.")
    fn = _BLOCK_FNS[qtype]
    out = torch.empty(n_rows, n_cols, dtype=torch.float32)
    if n_rows == 0 or n_cols == 0:
        return out
    blocks_per_row = n_cols // block_size
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // n_cols)
    for r0 in range(0, n_rows, rows_per_chunk):
        r1 = min(n_rows, r0 + rows_per_chunk)
        chunk = _as_uint8_tensor(raw[r0:r1])  # (r, row_bytes)
        blocks = chunk.reshape((r1 - r0) * blocks_per_row, type_size)
        out[r0:r1] = fn(blocks).view(r1 - r0, n_cols)
    return out
