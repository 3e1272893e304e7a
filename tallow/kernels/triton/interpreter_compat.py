"""A shim for Triton 3.6's CPU interpreter (TRITON_INTERPRET=1) under NumPy >= 2.4.

The interpreter turns a scalar kernel argument into a one-element 1-D array and implements
`tensor.__index__` as `int(array)`; NumPy 2.4 made int() of a 1-D array an error, so every
`for i in range(0, n, step)` with a run-time bound fails with "only 0-dimensional arrays can be
converted to Python scalars". We wrap the interpreter's tensor patching so `__index__` uses
`.item()`, which accepts any one-element array. Applied only in interpreter mode (the tests and
CPU CI); compiled kernels on a GPU never go through this code.
"""

from __future__ import annotations

_APPLIED = False


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    _APPLIED = True
