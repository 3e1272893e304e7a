"""How the KV cache stores one element: the one table the memory plan, the pool, the persistent
store and the attention kernels share.

A scaled format (int8, fp8) stores codes plus one float32 scale per (position, head) for K and
one for V: code = round(x / scale), scale = absmax / qmax. The others store the values rounded
to their float dtype. f16 is what llama.cpp stores by default; f32 exists for tests against
llama.cpp's F32 KV and is not offered to users.

Imports no torch: memory/budget.py plans before torch is loaded. `torch_dtype` imports it on use.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


class KVFormatError(UsageError, ValueError):
    """A KV dtype tallow does not store (a ValueError too, for callers below the CLI)."""


@dataclass(frozen=True)
class KVFormat:
    name: str
    aliases: tuple[str, ...]
    torch_name: str  # attribute of the torch module holding the storage dtype
    element_bytes: int  # per stored K or V element
    scale_bytes: int  # per (position, head) for K, and again for V; 0 when unscaled
    qmax: float | None = None  # the largest code magnitude of a scaled format

    @property
    def scaled(self) -> bool:
        """Whether the cache holds codes with per-(position, head) scales beside them."""
        return self.qmax is not None

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.torch_name)

    def bytes_per_position(self, n_kv_heads: int, k_dim: int, v_dim: int) -> int:
        """K and V of one position of one layer, scales included."""
        return n_kv_heads * ((k_dim + v_dim) * self.element_bytes + 2 * self.scale_bytes)


KV_FORMATS: tuple[KVFormat, ...] = (
    KVFormat("f16", ("fp16", "float16", "half"), "float16", 2, 0),
    KVFormat("bf16", ("bfloat16",), "bfloat16", 2, 0),
    KVFormat("int8", ("q8", "i8"), "int8", 1, 4, qmax=127.0),
    KVFormat("fp8", ("f8", "e4m3", "fp8_e4m3", "float8_e4m3fn"), "float8_e4m3fn", 1, 4, qmax=448.0),
    KVFormat("f32", ("fp32", "float32"), "float32", 4, 0),
)
USER_FORMATS = ("f16", "bf16", "int8", "fp8")  # the ones --kv-dtype offers
_BY_NAME = {alias: f for f in KV_FORMATS for alias in (f.name, *f.aliases)}


def kv_format(dtype: "str | KVFormat | object | None") -> KVFormat:
    """The format for a name, an alias, a KVFormat or a torch storage dtype (None: f16).
    UsageError for anything else."""
    if dtype is None:
        return _BY_NAME["f16"]
    if isinstance(dtype, KVFormat):
        return dtype
    if not isinstance(dtype, str):  # a torch.dtype: only the float ones name a format by themselves
        name = str(dtype).removeprefix("torch.")
        fmt = _BY_NAME.get(name)
        if fmt is None or fmt.scaled:
            raise KVFormatError(f"KV dtype {dtype} is not supported (use one of {', '.join(USER_FORMATS)}).")
        return fmt
    fmt = _BY_NAME.get(dtype.strip().lower())
    if fmt is None:
        raise KVFormatError(f"--kv-dtype must be one of {', '.join(USER_FORMATS)}, not {dtype!r}.")
    return fmt


def user_kv_format(name: str) -> KVFormat:
    """A --kv-dtype / kv_dtype= value: one of USER_FORMATS or its aliases (f32 is for tests)."""
    fmt = kv_format(str(name))
    if fmt.name not in USER_FORMATS:
        raise KVFormatError(f"--kv-dtype must be one of {', '.join(USER_FORMATS)}, not {name!r}.")
    return fmt


def storage_is_scaled(storage_dtype) -> bool:
    """Whether tensors of this torch dtype hold a scaled format's codes (a kernel's question)."""
    fmt = _BY_NAME.get(str(storage_dtype).removeprefix("torch."))
    return fmt is not None and fmt.scaled
