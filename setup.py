"""The optional C kernel (tallow/kernels/cpu/ggml_dot.c, decode_attention.c, ggml_ops.c, decode_layer.c, ssm_step.c, ggml_gemm.c): everything else is in pyproject.toml.

A failed build never fails the install: without OpenMP the library is built single-threaded,
without a C compiler it is skipped, and tallow runs its torch paths (`tallow info` says which).
No -march flag: the AVX-512 and AVX2 code is chosen at run time, so the same build runs on any x86-64.
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPENMP = ["-fopenmp"]


class OptionalBuild(build_ext):
    def build_extension(self, ext):
        try:
            super().build_extension(ext)
            return
        except Exception as exc:  # noqa: BLE001 - any compiler or linker failure
            first = exc
        if OPENMP[0] in ext.extra_compile_args:
            ext.extra_compile_args = [a for a in ext.extra_compile_args if a not in OPENMP]
            ext.extra_link_args = [a for a in ext.extra_link_args if a not in OPENMP]
            try:
                super().build_extension(ext)
                print("tallow: the C kernel was built without OpenMP (one thread)", file=sys.stderr)
                return
            except Exception:  # noqa: BLE001
                pass
        print(f"tallow: the optional C kernel was not built ({first}); the torch paths will run", file=sys.stderr)


unix = sys.platform != "win32"
setup(
    ext_modules=[Extension(
        "tallow.kernels.cpu._ggml_dot",
        sources=["tallow/kernels/cpu/ggml_dot.c", "tallow/kernels/cpu/decode_attention.c",
                 "tallow/kernels/cpu/ggml_ops.c", "tallow/kernels/cpu/decode_layer.c", "tallow/kernels/cpu/ssm_step.c",
                 "tallow/kernels/cpu/ggml_gemm.c"],
        depends=["tallow/kernels/cpu/ggml_dot.h", "tallow/kernels/cpu/ggml_math.h"],
        # -falign-functions=64: a hot loop's speed no longer moves with the size of unrelated code linked before it
        # (ggml's one-row attention read 1.1-1.3x slower after an edit elsewhere shifted it; docs/performance.md, session 24)
        extra_compile_args=["-O2", "-ffp-contract=off", "-fno-math-errno", "-falign-functions=64", *OPENMP] if unix else [],
        extra_link_args=list(OPENMP) if unix else [],
        libraries=["m"] if unix else [],
    )],
    cmdclass={"build_ext": OptionalBuild},
)
