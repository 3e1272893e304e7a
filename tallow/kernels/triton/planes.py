"""Raw GGUF blocks -> separate byte planes, the layout every Triton kernel here reads.

Why planes. A GGUF row is a run of blocks (Q8_0: 34 bytes, Q6_K: 210, Q4_0: 18, Q5_0: 22) whose
sizes are not multiples of 16 (or even 4), so a kernel reading the raw bytes cannot issue
16-byte vector loads: the quant bytes of consecutive blocks sit at odd offsets between fp16
scales. Splitting each field of the block into its own row-major plane keeps every byte (the
total size is unchanged, each byte is still read once) and makes the big plane -- the quant
codes -- a contiguous, 16-byte aligned run per row, so a warp reads it in full sectors.

`pack_planes` is a pure byte shuffle (`unpack_planes` inverts it, tested), run once at load,
on any device (it is plain torch slicing, so it can run on the GPU after the raw upload).
`dequantize_planes` is a self-contained torch dequantization of the planes, bit-exact with
`tallow.quant.reference` (tested), for machines without the `gguf` package (the GPU machine)
and as the reference of the kernels there.

Planes per type (N rows, nb = K / block elements):

  Q4_0  d fp16 (N, nb)                       qs uint8 (N, nb*16)
  Q4_1  d fp16 (N, nb)   m fp16 (N, nb)      qs uint8 (N, nb*16)
  Q5_0  d fp16 (N, nb)   qh int32 (N, nb)    qs uint8 (N, nb*16)
  Q8_0  d fp16 (N, nb)                       qs int8  (N, nb*32)
  Q4_K  dm fp16 (N, nb*2) [d, dmin]   scales uint8 (N, nb*12)   qs uint8 (N, nb*128)
  Q6_K  d fp16 (N, nb)   sc int8 (N, nb*16)  ql uint8 (N, nb*128)   qh uint8 (N, nb*64)

Within each plane the bytes keep GGUF's order, so the nibble/bit arrangement documented in
tallow/quant/reference.py applies unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["QTYPES", "PlaneWeight", "pack_planes", "unpack_planes", "dequantize_planes", "qtype_name", "random_raw"]

# ggml type id -> (name, elements per block, bytes per block)
QTYPES: dict[int, tuple[str, int, int]] = {
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    8: ("Q8_0", 32, 34),
    12: ("Q4_K", 256, 144),
    14: ("Q6_K", 256, 210),
}
_BY_NAME = {v[0]: k for k, v in QTYPES.items()}

# field name -> (byte start, byte length, dtype) inside one block
_FIELDS: dict[str, list[tuple[str, int, int, torch.dtype]]] = {
    "Q4_0": [("d", 0, 2, torch.float16), ("qs", 2, 16, torch.uint8)],
    "Q4_1": [("d", 0, 2, torch.float16), ("m", 2, 2, torch.float16), ("qs", 4, 16, torch.uint8)],
    "Q5_0": [("d", 0, 2, torch.float16), ("qh", 2, 4, torch.int32), ("qs", 6, 16, torch.uint8)],
    "Q8_0": [("d", 0, 2, torch.float16), ("qs", 2, 32, torch.int8)],
    "Q4_K": [("dm", 0, 4, torch.float16), ("scales", 4, 12, torch.uint8), ("qs", 16, 128, torch.uint8)],
    "Q6_K": [("ql", 0, 128, torch.uint8), ("qh", 128, 64, torch.uint8), ("sc", 192, 16, torch.int8),
             ("d", 208, 2, torch.float16)],
}


def qtype_name(qtype: int | str) -> str:
    """'Q4_K' for 12, 'Q4_K', or gguf's GGMLQuantizationType.Q4_K (an IntEnum)."""
    if isinstance(qtype, str):
        if qtype.upper() not in _BY_NAME:
            raise ValueError(f"Quant type {qtype!r} has no Triton kernel (have: {', '.join(_BY_NAME)}).")
        return qtype.upper()
    if int(qtype) not in QTYPES:
        raise ValueError(f"Quant type id {int(qtype)} has no Triton kernel (have: {', '.join(_BY_NAME)}).")
    return QTYPES[int(qtype)][0]


@dataclass
class PlaneWeight:
    """A quantized (N, K) weight as byte planes (see the module docstring)."""

    qtype: str
    n: int  # output rows
    k: int  # input columns (elements)
    planes: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.planes.values())

    @property
    def device(self) -> torch.device:
        return next(iter(self.planes.values())).device

    def to(self, device: torch.device | str) -> "PlaneWeight":
        return PlaneWeight(self.qtype, self.n, self.k, {k: v.to(device) for k, v in self.planes.items()})


def _block_dims(name: str) -> tuple[int, int]:
    _, block, size = QTYPES[_BY_NAME[name]]
    return block, size


def pack_planes(raw: torch.Tensor, qtype: int | str, k: int) -> PlaneWeight:
    """raw: uint8 (N, row_bytes) GGUF rows of `k` elements -> PlaneWeight (same bytes, split)."""
    name = qtype_name(qtype)
    block, size = _block_dims(name)
    if raw.dtype != torch.uint8 or raw.ndim != 2:
        raise ValueError(f"pack_planes wants uint8 (N, row_bytes), got {raw.dtype} {tuple(raw.shape)}.")
    if k % block or raw.shape[1] != k // block * size:
        raise ValueError(f"A {name} row of {k} elements is {k // block * size} bytes in blocks of {block}, "
                         f"not {raw.shape[1]}.")
    n, nb = raw.shape[0], k // block
    blocks = raw.reshape(n, nb, size)
    planes = {}
    for field, start, length, dtype in _FIELDS[name]:
        part = blocks[:, :, start:start + length].contiguous().reshape(n, nb * length)
        planes[field] = part.view(dtype)
    return PlaneWeight(name, n, k, planes)


def unpack_planes(w: PlaneWeight) -> torch.Tensor:
    """The inverse of pack_planes: uint8 (N, row_bytes)."""
    block, size = _block_dims(w.qtype)
    nb = w.k // block
    parts = []
    for field, _, length, _ in _FIELDS[w.qtype]:
        parts.append(w.planes[field].view(torch.uint8).reshape(w.n, nb, length))
    return torch.cat(parts, dim=2).reshape(w.n, nb * size)


# --- the self-contained reference: planes -> float32 (N, K), same float op order as reference.py --

_SHIFT_0_4 = (0, 4)
_CONSTS: dict = {}  # (values, device) -> int32 tensor: made once, so a CUDA graph capture copies nothing


def _int32s(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    key = (values, device)
    t = _CONSTS.get(key)
    if t is None:
        t = _CONSTS[key] = torch.tensor(values, dtype=torch.int32, device=device)
    return t


def _nib(qs: torch.Tensor, n: int, nb: int, chunk: int) -> torch.Tensor:
    """Bytes (N, nb*bytes) -> nibbles laid out as ggml: per `chunk` bytes, all low then all high.
    Returns int32 (N, nb, bytes // chunk, 2, chunk)."""
    b = qs.view(torch.uint8).to(torch.int32).reshape(n, nb, -1, 1, chunk)
    shifts = _int32s(_SHIFT_0_4, qs.device).view(1, 1, 1, 2, 1)
    return (b >> shifts) & 15


def dequantize_planes(w: PlaneWeight) -> torch.Tensor:
    """float32 (N, K), bit-exact with tallow.quant.reference.dequantize of the raw rows."""
    n, k, p = w.n, w.k, w.planes
    block, _ = _block_dims(w.qtype)
    nb = k // block
    dev = next(iter(p.values())).device
    if w.qtype in ("Q4_0", "Q4_1", "Q5_0", "Q8_0"):
        d = p["d"].float().reshape(n, nb, 1)
        if w.qtype == "Q8_0":
            return (p["qs"].reshape(n, nb, 32).float() * d).reshape(n, k)
        q = _nib(p["qs"], n, nb, 16).reshape(n, nb, 32)
        if w.qtype == "Q4_0":
            return (d * (q - 8).float()).reshape(n, k)
        if w.qtype == "Q4_1":
            return (d * q.float() + p["m"].float().reshape(n, nb, 1)).reshape(n, k)
        bits = torch.arange(32, dtype=torch.int32, device=dev)
        hi = (p["qh"].reshape(n, nb, 1) >> bits) & 1
        return (d * ((q | (hi << 4)) - 16).float()).reshape(n, k)
    if w.qtype == "Q4_K":
        dm = p["dm"].float().reshape(n, nb, 2)
        s = p["scales"].to(torch.int32).reshape(n, nb, 12)
        a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
        sc = torch.cat([a & 63, (c & 15) | ((a >> 2) & 48)], dim=2)  # (n, nb, 8)
        mn = torch.cat([b & 63, (c >> 4) | ((b >> 2) & 48)], dim=2)
        dl = (dm[..., 0:1] * sc.float()).unsqueeze(-1)  # (n, nb, 8, 1)
        ml = (dm[..., 1:2] * mn.float()).unsqueeze(-1)
        q = _nib(p["qs"], n, nb, 32).reshape(n, nb, 8, 32).float()
        return (dl * q - ml).reshape(n, k)
    if w.qtype == "Q6_K":
        d = p["d"].float().reshape(n, nb, 1)
        dl = (d * p["sc"].reshape(n, nb, 16).float()).unsqueeze(-1)  # (n, nb, 16, 1)
        lo = _nib(p["ql"], n, nb, 64).reshape(n, nb, 8, 32)
        qh = p["qh"].to(torch.int32).reshape(n, nb, 2, 1, 32)
        shifts = _int32s((0, 2, 4, 6), dev).view(1, 1, 1, 4, 1)
        hi = ((qh >> shifts) & 3).reshape(n, nb, 8, 32)
        q = ((lo | (hi << 4)) - 32).reshape(n, nb, 16, 16).float()
        return (dl * q).reshape(n, k)
    raise ValueError(f"No plane dequantization for {w.qtype}.")


def random_raw(qtype: int | str, n: int, k: int, generator: torch.Generator | None = None,
               scale: float = 0.02, device: str | torch.device = "cpu") -> torch.Tensor:
    """uint8 (N, row_bytes) of random blocks whose fp16 scale fields are finite and sane
    (|d| ~ `scale`), for tests and benchmarks that have no model file. Every other byte is random,
    so every code and sub-scale bit pattern is exercised."""
    name = qtype_name(qtype)
    block, size = _block_dims(name)
    nb = k // block
    raw = torch.randint(0, 256, (n, nb, size), dtype=torch.uint8, generator=generator)
    for field, start, length, dtype in _FIELDS[name]:
        if dtype == torch.float16:
            cnt = length // 2
            vals = (torch.rand((n, nb, cnt), generator=generator) * 0.75 + 0.25) * scale
            if name in ("Q4_0", "Q5_0", "Q8_0", "Q6_K"):  # symmetric types: signed scales
                sign = torch.randint(0, 2, (n, nb, cnt), generator=generator) * 2 - 1
                vals = vals * sign
            raw[:, :, start:start + length] = vals.to(torch.float16).view(torch.uint8).reshape(n, nb, length)
    return raw.reshape(n, nb * size).to(device)
