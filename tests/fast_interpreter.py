"""Triton's CPU interpreter (TRITON_INTERPRET=1) without its repeated language patching.

To run a kernel the interpreter swaps triton.language's builtins (tl.load, tl.sum, ...) for NumPy
versions, launches the grid, and swaps them back. It also re-does the whole swap on every call of
a @triton.jit helper inside the kernel (and never undoes that one): `inspect.getmembers` over
triton.language, its tensor class and tl.math, each time. Our kernels call helpers in their inner
loops (pdl.wait, the dequantizers, RoPE's pair loads), so most of an interpreted decode step went
to re-patching what was already patched (a profile of the shared-scratch fused-step test:
~30,000 patchings for ~2,500 launches).

Here a helper's call skips the swap when the launch around it has already patched every
triton.language module the helper sees; anything else (a helper seeing a module the kernel does
not) takes the interpreter's own path. The kernels' arithmetic is untouched: same NumPy ops, same
results. Also, the interpreter's dtype lookup (`_get_np_dtype`, on every cast, splat and masked
load) rebuilt its 19-entry table at each call; here the table is built once. Test-only: compiled kernels on a GPU never reach the interpreter. If a Triton release
renames the internals this relies on, apply() leaves the interpreter as it is.
"""

from __future__ import annotations

_applied = False
_launch_langs: frozenset[int] | None = None  # inside a launch: ids of the modules it patched
real_patch_lang = None  # the interpreter's own _patch_lang
real_np_dtype = None  # and its own _get_np_dtype


def apply() -> None:
    global _applied, real_patch_lang, real_np_dtype
    if _applied:
        return
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    real_patch_lang = getattr(interpreter, "_patch_lang", None)
    scope_class = getattr(interpreter, "_LangPatchScope", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if real_patch_lang is None or scope_class is None or executor is None:
        return
    real_launch = executor.__call__

    def langs_seen_by(fn) -> frozenset[int]:
        return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)

    def launch(self, *args, **kwargs):
        global _launch_langs
        _launch_langs = frozenset()  # the launch's own patching (its first) fills this in
        try:
            return real_launch(self, *args, **kwargs)
        finally:
            _launch_langs = None

    def patch_lang(fn):
        global _launch_langs
        langs = langs_seen_by(fn)
        if _launch_langs and langs <= _launch_langs:
            return scope_class()  # a helper inside a launch that already patched what it sees
        scope = real_patch_lang(fn)
        if _launch_langs is not None:
            _launch_langs = _launch_langs | langs
        return scope

    real_np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if real_np_dtype is not None:
        table = {t: real_np_dtype(t) for t in (tl.int1, tl.float16, tl.float32, tl.float64, tl.int8, tl.uint8,
                                                tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64,
                                                tl.bfloat16, tl.float8e5, tl.float8e5b16, tl.float8e4nv,
                                                tl.float8e4b8, tl.float8e4b15)}
        pointer_np = real_np_dtype(tl.pointer_type(tl.float32))

        def np_dtype(tt_dtype):
            if isinstance(tt_dtype, tl.block_type):
                tt_dtype = tt_dtype.element_ty
            if isinstance(tt_dtype, tl.pointer_type):
                return pointer_np
            return table[tt_dtype] if tt_dtype in table else real_np_dtype(tt_dtype)

        interpreter._get_np_dtype = np_dtype
    executor.__call__ = launch
    interpreter._patch_lang = patch_lang
    _applied = True
