"""Which arithmetic is in force: llama.cpp's ("ggml": numerics.py and the C kernels) or the torch paths'
("default"), as a model chose it (numerics_choice.py) or TALLOW_NUMERICS forces it.

The choice belongs to the model (DecoderModel.numerics). Code running on a model's behalf asks
`ggml_enabled()`, which answers for the model whose construction or forward pass is running (`scope`);
outside one, only TALLOW_NUMERICS=ggml turns it on. Torch-free: the kernels and the memory plan read it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from . import switches
from .errors import UsageError

GGML, DEFAULT, AUTO = "ggml", "default", "auto"

_in_force: contextvars.ContextVar[str | None] = contextvars.ContextVar("tallow_numerics", default=None)


def requested() -> str:
    """TALLOW_NUMERICS as asked: ggml, default or auto (unset). A UsageError for anything else."""
    text = str(switches.value("TALLOW_NUMERICS") or AUTO).strip().lower()
    if text not in (GGML, DEFAULT, AUTO):
        raise UsageError(f"TALLOW_NUMERICS={text!r} is not one of ggml, default or auto.")
    return text


def in_force() -> str:
    """The arithmetic of the model being built or run (`scope`); outside one, TALLOW_NUMERICS=ggml's
    or the default."""
    mode = _in_force.get()
    if mode is not None:
        return mode
    return GGML if requested() == GGML else DEFAULT


def ggml_enabled() -> bool:
    return in_force() == GGML


@contextlib.contextmanager
def scope(mode: str) -> Iterator[None]:
    """Run the body in `mode`'s arithmetic (a model's construction and each of its forward passes)."""
    token = _in_force.set(mode)
    try:
        yield
    finally:
        _in_force.reset(token)
