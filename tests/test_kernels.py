"""Every registered kernel implementation against its reference (tests/kernel_cases.py), and no
kernel module under tallow/kernels/ with an implementation the registry does not know."""

from __future__ import annotations

import ast
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from kernel_cases import CASES, ELSEWHERE, NOT_KERNELS

ROOT = Path(__file__).resolve().parent.parent


def _available(needs: str) -> bool:
    if needs == "triton":
        try:
            import triton  # noqa: F401
        except ImportError:
            return False
        return True
    if needs in ("int4ops", "int8ops"):
        from tallow.quant import pack

        return pack.HAS_INT4_OPS if needs == "int4ops" else pack.HAS_INT8_OPS
    if needs == "ggml_dot":  # the optional C library, built at install
        from tallow.kernels.cpu import ggml_dot

        return ggml_dot.available()
    if needs == "c_layer":  # the library, and torch's AVX-512 SiLU matched (kernels/cpu/decode_layer.py)
        from tallow.kernels.cpu import decode_layer

        return decode_layer.usable()
    return True


@pytest.mark.parametrize("case, shape, dtype", [p for c in CASES for p in c.params()],
                         ids=lambda v: v.op if hasattr(v, "op") else str(v).removeprefix("torch.").replace(" ", ""))
def test_kernel_matches_its_reference(case, shape, dtype) -> None:
    if not _available(case.needs):
        pytest.skip(f"needs {case.needs}")
    args = case.inputs(shape, dtype, case.seed(shape, dtype))
    y, ref = case.run(args).float(), case.reference(args).float()
    assert y.shape == ref.shape and torch.isfinite(y).all()
    tol = case.tol(args) if callable(case.tol) else case.tol
    if case.metric == "exact":
        assert torch.equal(y, ref)
    elif case.metric == "elementwise":
        assert ((y - ref).abs() <= tol * ref.abs() + tol * 1e-3).all()
    else:
        err = float((y.double() - ref.double()).norm() / ref.double().norm())
        assert err < tol, f"{case.impl}: relative error {err:.2e} over {tol:.1e}"


def _implementations() -> set[str]:
    """module:name of every public top-level function and class defined in tallow/kernels/."""
    found = set()
    for path in sorted((ROOT / "tallow" / "kernels").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                if not any(_is_jit(d) for d in getattr(node, "decorator_list", [])):  # @triton.jit bodies run inside their wrapper
                    found.add(f"{module}:{node.name}")
    return found


def _is_jit(decorator: ast.expr) -> bool:
    return "jit" in ast.unparse(decorator) or "autotune" in ast.unparse(decorator)


def test_every_kernel_implementation_has_a_case() -> None:
    known = {c.impl for c in CASES} | set(ELSEWHERE) | NOT_KERNELS
    implementations = _implementations()
    missing = sorted(implementations - known)
    assert not missing, "register these in tests/kernel_cases.py (a reference, shapes, dtypes, tolerance):\n" + "\n".join(missing)
    stale = sorted(known - implementations)
    assert not stale, "tests/kernel_cases.py names what tallow/kernels/ no longer defines:\n" + "\n".join(stale)


def test_kernels_tested_elsewhere_are_tested_there() -> None:
    for impl, test_file in ELSEWHERE.items():
        text = (ROOT / test_file).read_text()
        assert impl.split(":")[1] in text, f"{test_file} does not exercise {impl}"
