"""4-bit float weights: MXFP4 (GGUF type 39) and NVFP4 (type 40), reference dequantization.

Both store E2M1 codes (a sign bit and 3 magnitude bits: 0, 0.5, 1, 1.5, 2, 3, 4, 6), ggml keeps
them doubled as the integers of `kvalues_mxfp4` (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ...) and halves
the block scale instead (ggml-common.h, ggml-impl.h):

  MXFP4  blocks of 32 in 17 bytes: one E8M0 exponent e, then 16 bytes of codes; element j of the
         block is byte j's low nibble, element j + 16 its high nibble. scale = 2^(e - 128)
         (e < 2: the fp32 denormals 2^-128 and 2^-127).
  NVFP4  blocks of 64 in 36 bytes: four UE4M3 scales (one per 16 elements: 4 exponent bits with
         bias 7, 3 mantissa bits, bit 7 ignored; 0 and 0x7F mean 0), then 32 bytes of codes, 8
         per 16-element sub-block laid out as MXFP4's. scale = UE4M3 value / 2. A file's FP32
         per-tensor scale is a separate tensor (`<name>.scale`), applied to the product's output.

Every value is a code of at most 3 significant bits times a scale of at most 4, so the float32
(and bfloat16) results are exact: the reference matches gguf.quants' numpy bit for bit
(tests/test_fp4.py), and a bf16 copy of the weight holds it exactly.
"""

from __future__ import annotations

import torch

__all__ = ["KVALUES", "dequantize_mxfp4", "dequantize_nvfp4", "e8m0_half", "ue4m3_half", "mxfp4_group_codes"]

KVALUES = torch.tensor([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.float32)


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """uint8 E8M0 exponents -> float32 2^(e - 128), built from its bits as ggml does."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, torch.tensor(0x00200000, dtype=torch.int32) << e, (e - 1) << 23)
    return bits.view(torch.float32)


def ue4m3_half(x: torch.Tensor) -> torch.Tensor:
    """uint8 UE4M3 scales -> float32 value / 2 (ggml_ue4m3_to_fp32)."""
    x = x.to(torch.int32)
    exp, man = (x >> 3) & 0xF, (x & 7).float()
    normal = (1.0 + man / 8.0) * torch.exp2((exp - 7).float())
    raw = torch.where(exp == 0, man * 2.0**-9, normal)
    return torch.where((x == 0) | (x == 0x7F), torch.zeros_like(raw), raw * 0.5)


_KVALUES_ON: dict = {}  # device -> KVALUES there (copied once, outside any CUDA graph capture)


def _codes(qs: torch.Tensor, half: int) -> torch.Tensor:
    """Bytes (B, n) -> kvalues (B, n // half, 2 * half): per run of `half` bytes, the low nibbles
    then the high nibbles."""
    b = qs.reshape(qs.shape[0], -1, half).to(torch.int64)
    table = KVALUES if b.device.type == "cpu" else _KVALUES_ON.setdefault(b.device, KVALUES.to(b.device))
    return table[torch.cat((b & 15, b >> 4), dim=-1)]


def dequantize_mxfp4(b: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 17) -> float32 (B, 32)."""
    return e8m0_half(b[:, :1]) * _codes(b[:, 1:17], 16).reshape(-1, 32)


def dequantize_nvfp4(b: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 36) -> float32 (B, 64)."""
    d = ue4m3_half(b[:, :4]).unsqueeze(-1)  # (B, 4, 1)
    return (d * _codes(b[:, 4:36], 8)).reshape(-1, 64)


def mxfp4_group_codes(raw: torch.Tensor, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 rows (uint8 (n, row_bytes)) as exact group-32 int8: the doubled codes (int8 (n, K),
    -12..12) and each block's scale 2^(e - 128) (float32 (n, K / 32), a power of two, so exact in
    bf16). codes * scale is the reference dequantization exactly."""
    n = raw.shape[0]
    blocks = raw.reshape(-1, 17)
    codes = _codes(blocks[:, 1:17], 16).reshape(n, n_cols).to(torch.int8)
    return codes, e8m0_half(blocks[:, :1]).reshape(n, n_cols // 32)
