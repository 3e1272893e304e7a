"""Multi-token products through a dequantized bf16 weight: the prefill path for packed weights.

On this CPU the low-bit aten kernels are slow for many rows: `_weight_int4pack_mm_for_cpu`
and `_weight_int8pack_mm` reach ~180 GFLOP/s per core at M=512, a dense bf16 GEMM (oneDNN,
AVX-512 BF16) ~480. Dequantizing a weight costs a few passes over it; from a few dozen rows
on, the dense GEMM's saving pays for that (docs/performance.md, 2026-11-29 CPU fast paths).

So for M >= MIN_ROWS a packed layer writes its weight, transposed, into one shared bf16
scratch buffer (N tiled so that the buffer never exceeds SCRATCH_ELEMENTS, whatever the
matrix) and runs torch.mm; nothing but the packed weight stays resident.

Numerics: int8 codes are exact in bf16, so the int8 path keeps its weights exactly (and
applies the row scale to the output as the kernel does). int4 weights `(q - 8) * s + z`
are computed in fp32 and rounded once to bf16 (one multiply-add), a 2^-9 relative rounding
per weight the int4 kernel does not have: the same rounding the dense bf16 fallback has.

The tinygemm CPU layout (checked in tests/test_cpu_fastpaths.py): `packed` (N, K/2) uint8
viewed as (N/B, K, B/2); byte [b, k, d] holds row Bb+d in its low nibble and row Bb+B/2+d
in its high nibble, both at column k. Scales and zeros (K/32, N, 2) bf16. The row block B is
the one torch's packer uses on this CPU: 64 with AVX-512, 32 with AVX2 (PACK_BLOCK, read off
a probe that torch packs at import).

TALLOW_PREFILL_DEQUANT=0 (read at call time) keeps every product in the low-bit kernels.

oneDNN multiplies bf16 natively only with AVX-512 BF16 or AMX. Elsewhere (an AVX2-only CPU)
torch's bf16 GEMM falls back to a loop ~75x slower than fp32, so there the bf16 operands are
widened to fp32 (exactly) and multiplied in fp32: the same exact products and fp32 sums as
oneDNN's bf16 GEMM, rounded once to bf16 (`bf16_mm`, `bf16_linear`; TALLOW_BF16_WIDEN=0 keeps
torch's fallback). The tile then shrinks by 3 so that it and its fp32 copy fit the same bytes.
"""

from __future__ import annotations


import torch

from ... import switches

__all__ = ["MIN_ROWS", "SCRATCH_ELEMENTS", "bf16_linear", "bf16_mm", "enabled", "int4_weight_t", "int4_dequant_mm",
           "int8_dequant_mm", "scratch_bytes", "widens_bf16"]

MIN_ROWS = 64                  # fewer rows: the low-bit kernel is faster (measured crossover ~32-64)
SCRATCH_ELEMENTS = 1 << 23     # 8 M bf16 = 16 MiB (+ 8 MiB of nibbles) at most, shared by all layers


def _pack_block() -> int:
    """Rows per block of torch's int4 CPU packing here: the row paired with row 0 in byte 0."""
    if not hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"):
        return 64
    rows = torch.arange(64, dtype=torch.int32).unsqueeze(1).expand(64, 64) // 16  # row r holds r // 16
    first = int(torch.ops.aten._convert_weight_to_int4pack_for_cpu(rows.contiguous(), 1)[0, 0])
    return 2 * 16 * (first >> 4)  # the high nibble holds row B/2, whose code is B/32


PACK_BLOCK = _pack_block()
_BLOCK_N = PACK_BLOCK

_scratch = torch.empty(0, dtype=torch.bfloat16)
_nibbles = torch.empty(0, dtype=torch.uint8)
_NATIVE_BF16_GEMM = torch.ops.mkldnn._is_mkldnn_bf16_supported()


def enabled() -> bool:
    return switches.enabled("TALLOW_PREFILL_DEQUANT")


def widens_bf16() -> bool:
    """Whether multi-row bf16 products run widened to fp32 (no native bf16 GEMM on this CPU)."""
    return not _NATIVE_BF16_GEMM and switches.enabled("TALLOW_BF16_WIDEN")


def bf16_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b (K, N), bf16 (a may come already widened) -> bf16, with fp32 sums of the exact products."""
    if not widens_bf16():
        return torch.mm(a, b)
    return torch.mm(a.float(), b.float()).to(torch.bfloat16)


def bf16_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T, both bf16 -> bf16. Widened, w goes in row tiles of at most
    SCRATCH_ELEMENTS fp32 values, never a whole fp32 copy of a large table."""
    if not widens_bf16() or x.shape[0] <= 1:  # one row: torch's bf16 GEMV is fast everywhere
        return torch.nn.functional.linear(x, w)
    xf, n = x.float(), w.shape[0]
    step = max(_BLOCK_N, SCRATCH_ELEMENTS // max(w.shape[1], 1))
    if step >= n:
        return torch.nn.functional.linear(xf, w.float()).to(torch.bfloat16)
    y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
    for r0 in range(0, n, step):
        y[:, r0:r0 + step] = torch.nn.functional.linear(xf, w[r0:r0 + step].float())
    return y


def scratch_bytes() -> int:
    """Bytes the shared scratch buffers hold now (they grow to the largest tile used)."""
    return _scratch.numel() * 2 + _nibbles.numel()


def _buffers(n_weight: int, n_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    global _scratch, _nibbles
    # Normal tensors even when grown inside a forward pass (inference mode): an inference
    # tensor could not be written again by a later call made outside inference mode.
    with torch.inference_mode(False):
        if _scratch.numel() < n_weight:
            _scratch = torch.empty(n_weight, dtype=torch.bfloat16)
        if _nibbles.numel() < n_bytes:
            _nibbles = torch.empty(n_bytes, dtype=torch.uint8)
    return _scratch[:n_weight], _nibbles[:n_bytes]


def _tile_rows(n: int, k: int) -> int:
    elements = SCRATCH_ELEMENTS // 3 if widens_bf16() else SCRATCH_ELEMENTS  # the tile + its fp32 copy
    return max(_BLOCK_N, (elements // max(k, 1)) // _BLOCK_N * _BLOCK_N) if n > 0 else n


def int4_weight_t(packed: torch.Tensor, scales_and_zeros: torch.Tensor, k_parts: int = 1,
                  rows: tuple[int, int] | None = None) -> torch.Tensor:
    """The weight rows [r0, r1) of a tinygemm-packed int4 matrix as bf16, transposed: (K, r1 - r0),
    a view of the shared scratch buffer (valid until the next call). With k_parts == 2 (int4x2,
    K doubled) the two halves are added, giving the (K/2, rows) weight the layer computes with.
    r0 and r1 - r0 must be multiples of PACK_BLOCK (the packer's row block)."""
    n_pad, half_k = packed.shape
    kk = 2 * half_k
    r0, r1 = rows if rows is not None else (0, n_pad)
    nb, n, half = (r1 - r0) // _BLOCK_N, r1 - r0, _BLOCK_N // 2
    wt, nib = _buffers(kk * n, nb * kk * half)
    blocks = packed[r0:r1].view(nb, kk, half)  # (row blocks, K, B/2)
    nib = nib.view(nb, kk, half)
    out = wt.view(kk, nb, 2, half)  # column Bb + (B/2)h + d of W^T
    torch.bitwise_and(blocks, 15, out=nib)
    out[:, :, 0].copy_(nib.transpose(0, 1))
    torch.bitwise_right_shift(blocks, 4, out=nib)
    out[:, :, 1].copy_(nib.transpose(0, 1))
    groups = kk // 32
    w = wt.view(groups, 32, n)
    # Contiguous copies (1/32 of the tile): broadcasting the interleaved (scale, zero) pairs
    # directly makes addcmul take a strided path ~6x slower.
    s = scales_and_zeros[:, r0:r1, 0].unsqueeze(1).contiguous()  # (groups, 1, n)
    z = scales_and_zeros[:, r0:r1, 1].unsqueeze(1).contiguous()
    w.sub_(8)  # exact: small integers
    torch.addcmul(z, w, s, out=w)  # (q - 8) * s + z in fp32, rounded once to bf16
    wt = wt.view(kk, n)
    if k_parts == 2:
        k = kk // 2
        wt[:k].add_(wt[k:])
        wt = wt[:k]
    return wt


def int4_dequant_mm(xb: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, n_out: int,
                    k_parts: int = 1) -> torch.Tensor:
    """xb bf16 (M, K) contiguous -> bf16 (M, n_out): x @ W^T through dequantized tiles of W."""
    n_pad, half_k = packed.shape
    tile = _tile_rows(n_pad, 2 * half_k)
    xb = xb.float() if widens_bf16() else xb  # widened once, not per tile (bf16_mm's .float() is then a no-op)
    if tile >= n_pad:
        y = bf16_mm(xb, int4_weight_t(packed, scales_and_zeros, k_parts))
        return y[:, :n_out] if n_pad != n_out else y
    y = torch.empty(xb.shape[0], n_pad, dtype=torch.bfloat16)
    for r0 in range(0, n_pad, tile):
        r1 = min(n_pad, r0 + tile)
        y[:, r0:r1] = bf16_mm(xb, int4_weight_t(packed, scales_and_zeros, k_parts, (r0, r1)))
    return y[:, :n_out] if n_pad != n_out else y


def int8_dequant_mm(xb: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """xb bf16 (M, K) -> bf16 (M, N) = x @ (W8 * scales)^T, W8 int8 (N, K), scales bf16 (N,).
    Each weight is rounded once to bf16 (code times row scale), as in the int4 path."""
    n, k = weight.shape
    tile = _tile_rows(n, k)
    xb = xb.float() if widens_bf16() else xb  # widened once, not per tile
    y = torch.empty(xb.shape[0], n, dtype=torch.bfloat16)
    for r0 in range(0, n, tile):
        r1 = min(n, r0 + tile)
        wb, _ = _buffers((r1 - r0) * k, 0)
        wb = wb.view(r1 - r0, k)
        torch.mul(weight[r0:r1], scales[r0:r1, None], out=wb)
        if tile >= n:
            return bf16_mm(xb, wb.t())
        y[:, r0:r1] = bf16_mm(xb, wb.t())
    return y
