"""Repack GGUF quantized blocks into the layouts of PyTorch's CPU low-bit matmul kernels.

Two targets:

* **int4 ("tinygemm")** for Q4_0, Q4_1, Q4_K: `aten._weight_int4pack_mm_for_cpu(x_bf16, packed,
  32, scales_and_zeros)` dequantizes each weight as `(q - 8) * scale + zero` with one
  (scale, zero) pair per 32 consecutive K elements (verified in tests/test_cpu_linear.py). All
  three GGUF types are affine per 32 elements with 4-bit codes, so the nibbles carry over
  unchanged and only scale/zero are rounded (fp32 -> bf16):
    Q4_0: w = d*(q-8)          -> scale d,      zero 0
    Q4_1: w = d*q + m          -> scale d,      zero m + 8d
    Q4_K: w = (d*sc)*q - dmin*m -> scale d*sc,  zero 8*d*sc - dmin*m   (per 32-element sub-block)
* **int8 per output channel** for everything else quantized (Q5_0, Q5_1, Q8_0, Q2_K..Q6_K):
  `aten._weight_int8pack_mm(x_bf16, w_int8 (N, K), scales (N,))`. This is a lossy
  requantization (one scale per row instead of per block); `repack_error` measures it.
* **int4x2** (opt-in) for Q8_0, Q5_0, Q5_1, Q5_K: the codes split exactly into a low nibble and
  a high part, packed as one int4 matrix over a doubled K; exact codes like the int4 types,
  1 byte/weight like int8, and as fast as int8 for single-token decode (see int4x2_codes).

Why bf16 and not fp32/fp16 activations: the kernels accept all three dtypes, but only the bf16
path is vectorized on this torch build (measured at K=1536, N=8960, M=1: int4 0.23 ms bf16 vs
10 ms fp32; int8 0.17 ms vs 4.4 ms).

Everything is vectorized and processed in row chunks so that repacking never holds more than a
few tens of MB of temporaries, whatever the tensor size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from ..errors import ModelFileError
from .reference import _bits, _bits_le32, _f16, _k_scale_min, _nibbles, _as_uint8_tensor, block_dims, dequantize

__all__ = [
    "INT4_TYPES", "INT8_TYPES", "INT4X2_TYPES", "GROUP_SIZE", "HAS_INT4_OPS", "HAS_INT8_OPS",
    "int4_codes", "int4x2_codes", "pack_int4", "unpack_int4_weight", "pack_int8", "repack_error", "RepackError",
]

GROUP_SIZE = 32  # tinygemm group along K; equals the Q4_0/Q4_1 block and the Q4_K sub-block
INT4_TYPES: frozenset[QT] = frozenset({QT.Q4_0, QT.Q4_1, QT.Q4_K})
INT8_TYPES: frozenset[QT] = frozenset({QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q2_K, QT.Q3_K, QT.Q5_K, QT.Q6_K})
# Types whose codes split exactly into two 4-bit halves with a shared per-32 scale: they can run as
# one int4 matmul over a doubled K ("int4x2", opt-in; see int4x2_codes).
INT4X2_TYPES: frozenset[QT] = frozenset({QT.Q5_0, QT.Q5_1, QT.Q5_K, QT.Q8_0})

HAS_INT4_OPS: bool = (hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")
                      and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"))
HAS_INT8_OPS: bool = hasattr(torch.ops.aten, "_weight_int8pack_mm")

_N_ALIGN = 16          # _convert_weight_to_int4pack_for_cpu requires N % 16 == 0
_PACK_ROWS = 4096      # rows converted per call; a multiple of 64, the packer's row interleave
_CHUNK_ELEMENTS = 1 << 22


def _row_chunks(n_rows: int, n_cols: int, align: int = 1) -> list[tuple[int, int]]:
    step = max(align, (_CHUNK_ELEMENTS // max(n_cols, 1)) // align * align)
    return [(r, min(n_rows, r + step)) for r in range(0, n_rows, step)]


def int4_codes(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Express Q4_0/Q4_1/Q4_K rows in tinygemm's affine form, exactly (float32).

    raw: uint8 (N, row_bytes). Returns
      q     uint8   (N, K) codes 0..15 (the GGUF nibbles, in element order),
      scale float32 (N, K/32),
      zero  float32 (N, K/32),
    such that the reference weight is `(q - 8) * scale + zero` up to float32 rounding of `zero`.
    """
    if qtype not in INT4_TYPES:
        raise ModelFileError(f"Tensor type {QT(qtype).name} cannot be repacked to int4 (only Q4_0, Q4_1, Q4_K can).")
    block, type_size = block_dims(qtype)
    b = _as_uint8_tensor(raw)
    n = b.shape[0]
    blocks = b.reshape(-1, type_size)  # (N * K/block, type_size)
    if qtype == QT.Q4_0:
        d = _f16(blocks, 0)  # (B, 1)
        q = _nibbles(blocks[:, 2:18], 16).reshape(n, n_cols)
        scale, zero = d, torch.zeros_like(d)
    elif qtype == QT.Q4_1:
        d, m = _f16(blocks, 0), _f16(blocks, 2)
        q = _nibbles(blocks[:, 4:20], 16).reshape(n, n_cols)
        scale, zero = d, m + 8 * d
    else:  # Q4_K: 8 sub-blocks of 32 per 256-block
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
        sc, mn = _k_scale_min(blocks[:, 4:16])  # (B, 8)
        scale = d * sc.float()
        zero = 8 * scale - dmin * mn.float()
        q = _nibbles(blocks[:, 16:144], 32).reshape(n, n_cols)
    groups = n_cols // GROUP_SIZE
    return q, scale.reshape(n, groups), zero.reshape(n, groups)


def int4x2_codes(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Express Q8_0/Q5_0/Q5_1/Q5_K rows exactly as tinygemm int4 over a doubled K.

    A code q (5 or 8 bits) splits into lo = q & 15 and hi = q >> 4 (arithmetic), so
    w = (d*16)*hi + d*lo + c for a per-32 affine constant c. The first K columns hold lo with
    (scale d, zero 8d + c), the next K hold hi + 8 with (scale 16d, zero 0); the matmul then
    runs on x duplicated to [x, x]. Codes stay exact and 16d rounds to bf16 exactly as d does,
    so the only error is bf16 rounding of d and of the zero, as for the int4 types.

    Returns q uint8 (N, 2K), scale float32 (N, 2K/32), zero float32 (N, 2K/32).
    """
    if qtype not in INT4X2_TYPES:
        raise ModelFileError(f"Tensor type {QT(qtype).name} cannot be repacked to int4x2 (only Q5_0, Q5_1, Q5_K, Q8_0 can).")
    block, type_size = block_dims(qtype)
    b = _as_uint8_tensor(raw)
    n = b.shape[0]
    blocks = b.reshape(-1, type_size)
    if qtype == QT.Q8_0:
        d = _f16(blocks, 0)  # (B, 1)
        q = blocks[:, 2:34].contiguous().view(torch.int8)  # (B, 32)
        lo, hi = q & 15, q >> 4  # 0..15, -8..7
        zero_lo = 8 * d  # w = d*(16 hi + lo) = 16d*hi + (lo - 8)*d + 8d
    elif qtype in (QT.Q5_0, QT.Q5_1):
        d = _f16(blocks, 0)
        qh_off = 2 if qtype == QT.Q5_0 else 4
        hi = _bits_le32(blocks[:, qh_off:qh_off + 4]).to(torch.int8)  # (B, 32) 0..1
        lo = _nibbles(blocks[:, qh_off + 4:qh_off + 20], 16).reshape(-1, 32).to(torch.int8)
        # Q5_0: w = d*(q - 16) -> zero_lo = 8d - 16d;  Q5_1: w = d*q + m -> zero_lo = 8d + m
        zero_lo = 8 * d - 16 * d if qtype == QT.Q5_0 else 8 * d + _f16(blocks, 2)
    else:  # Q5_K: 8 sub-blocks of 32, w = (d*sc)*q - dmin*m
        dd, dmin = _f16(blocks, 0), _f16(blocks, 2)
        sc, mn = _k_scale_min(blocks[:, 4:16])  # (B, 8)
        d = (dd * sc.float()).reshape(-1, 1)  # one row per 32-element sub-block
        zero_lo = 8 * d - (dmin * mn.float()).reshape(-1, 1)
        lo = _nibbles(blocks[:, 48:176], 32).reshape(-1, 32).to(torch.int8)
        hi = _bits(blocks[:, 16:48], 32).reshape(-1, 32).to(torch.int8)
    groups = n_cols // GROUP_SIZE
    q = torch.cat([lo.reshape(n, n_cols), (hi + 8).reshape(n, n_cols)], dim=1).to(torch.uint8)
    scale = torch.cat([d.reshape(n, groups), 16 * d.reshape(n, groups)], dim=1)
    zero = torch.cat([zero_lo.reshape(n, groups), torch.zeros(n, groups)], dim=1)
    return q, scale, zero


def _codes(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return int4_codes(raw, qtype, n_cols) if qtype in INT4_TYPES else int4x2_codes(raw, qtype, n_cols)


@dataclass
class Int4Pack:
    """A weight in tinygemm CPU layout. `packed` may have padded rows (N rounded up to 16)."""

    packed: torch.Tensor            # uint8 (N_pad, K/2), opaque layout of the aten packer
    scales_and_zeros: torch.Tensor  # bf16 (K/32, N_pad, 2)
    out_features: int               # N, the real row count
    in_features: int                # K
    k_parts: int = 1                # 2 for int4x2: the kernel's K is 2K and x must be [x, x]


def pack_int4(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int) -> Int4Pack:
    """Repack a Q4_0/Q4_1/Q4_K tensor (uint8 (N, row_bytes), or gguf_file.FileRows: read in row
    slices) for `_weight_int4pack_mm_for_cpu`; Q8_0/Q5_0/Q5_1/Q5_K are packed exactly as int4x2
    (K doubled, see int4x2_codes).

    Rows are padded to a multiple of 16 (the packer's requirement) with zero weights; callers
    slice the output back to `out_features` columns.
    """
    if not HAS_INT4_OPS:
        raise RuntimeError("this torch build has no _convert_weight_to_int4pack_for_cpu op")
    if qtype not in INT4_TYPES and qtype not in INT4X2_TYPES:
        raise ModelFileError(f"Tensor type {QT(qtype).name} cannot be repacked to int4.")
    n = int(raw.shape[0])
    n_pad = -(-n // _N_ALIGN) * _N_ALIGN
    parts = 1 if qtype in INT4_TYPES else 2
    kk = n_cols * parts  # the kernel's K
    groups = kk // GROUP_SIZE
    packed = torch.empty(n_pad, kk // 2, dtype=torch.uint8)
    sz = torch.zeros(groups, n_pad, 2, dtype=torch.bfloat16)  # padding rows: scale 0, zero 0
    for r0, r1 in _row_chunks(n, kk, align=_PACK_ROWS):
        q, scale, zero = _codes(raw[r0:r1], qtype, n_cols)
        r1p = min(r1 + (n_pad - n if r1 == n else 0), n_pad)
        q32 = torch.full((r1p - r0, kk), 8, dtype=torch.int32)
        q32[: r1 - r0] = q
        packed[r0:r1p] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q32, 1)
        sz[:, r0:r1, 0] = scale.T.to(torch.bfloat16)
        sz[:, r0:r1, 1] = zero.T.to(torch.bfloat16)
    return Int4Pack(packed, sz, n, n_cols, parts)


def unpack_int4_weight(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int) -> torch.Tensor:
    """The float32 weight (N, K) that the int4 kernel effectively uses: the exact codes with
    bf16-rounded scale and zero. For error measurement and tests."""
    q, scale, zero = _codes(raw, qtype, n_cols)
    s = scale.to(torch.bfloat16).float().repeat_interleave(GROUP_SIZE, dim=1)
    z = zero.to(torch.bfloat16).float().repeat_interleave(GROUP_SIZE, dim=1)
    w = (q.float() - 8) * s + z  # (N, K * parts)
    return w[:, :n_cols] + w[:, n_cols:] if w.shape[1] > n_cols else w


def _requant_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 of a float32 (n, K) block: (int8 (n, K), bf16 scales (n,)).

    The scale is rounded to bf16 *before* the codes are computed, so the stored scale is the one
    the codes were fitted to (no systematic (up to 2^-8) per-row gain error on top of the rounding).
    """
    amax = w.abs().amax(dim=1)  # (n,)
    scale = (amax / 127).to(torch.bfloat16)
    s = scale.float()
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round(w / s[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def pack_int8(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Requantize any supported type (uint8 (N, row_bytes), or FileRows) to int8 per output channel for
    `_weight_int8pack_mm`: returns (int8 (N, K), bf16 scales (N,))."""
    n = int(raw.shape[0])
    w8 = torch.empty(n, n_cols, dtype=torch.int8)
    scales = torch.empty(n, dtype=torch.bfloat16)
    for r0, r1 in _row_chunks(n, n_cols):
        w8[r0:r1], scales[r0:r1] = _requant_int8(dequantize(raw[r0:r1], qtype, n_cols))
    return w8, scales


@dataclass
class RepackError:
    """How far a repacked weight is from the reference, over a whole tensor.

    rel_fro:   ||W' - W||_F / ||W||_F                 (what a matmul output feels, on average)
    rel_max:   max |W' - W| / max |W|                 (worst element against the tensor's range)
    rel_group: max over rows of max|W' - W| / max|W| of that row (worst row-relative error)
    """

    rel_fro: float
    rel_max: float
    rel_group: float


def repack_error(raw: np.ndarray | torch.Tensor, qtype: QT, n_cols: int, target: str) -> RepackError:
    """Measure the weight error of the `target` ("int4" (also int4x2), "int8" or "bf16") representation."""
    err2 = ref2 = 0.0
    emax = wmax = rowrel = 0.0
    for r0, r1 in _row_chunks(int(raw.shape[0]), n_cols):
        w = dequantize(raw[r0:r1], qtype, n_cols)
        if target == "int4":
            wq = unpack_int4_weight(raw[r0:r1], qtype, n_cols)
        elif target == "int8":
            q, s = _requant_int8(w)
            wq = q.float() * s.float()[:, None]
        elif target == "bf16":
            wq = w.to(torch.bfloat16).float()
        else:
            raise ValueError(f"unknown repack target {target!r}")
        e = (wq - w).double()
        err2 += float((e * e).sum())
        ref2 += float((w.double() ** 2).sum())
        emax = max(emax, float(e.abs().max()))
        wmax = max(wmax, float(w.abs().max()))
        row_amax = w.abs().amax(dim=1).double()
        row_rel = e.abs().amax(dim=1) / torch.where(row_amax > 0, row_amax, torch.ones_like(row_amax))
        rowrel = max(rowrel, float(row_rel.max()))
    return RepackError(
        rel_fro=(err2 / ref2) ** 0.5 if ref2 > 0 else 0.0,
        rel_max=emax / wmax if wmax > 0 else 0.0,
        rel_group=rowrel,
    )
