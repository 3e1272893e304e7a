"""Whether a refactor of kernels/triton/prefill_attention.py changes what an H100/H200 runs, checked on a machine
without a GPU: Triton compiles a kernel ahead of time for a named target (sm_90, its own ptxas) from the source
alone, so the kernels of REV and of the working tree can be compiled for every constexpr combination the wrapper
launches and their PTX compared, debug sections and names left out.

    python scripts/triton_ptx_same.py REV        # e.g. the commit before the refactor

Prints one line a variant: "same PTX", "same length" (the same instructions in another order or with other
register numbers: read the diff the script prints for the first such variant), or "DIFFERENT"."""
import difflib
import importlib.util
import itertools
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tallow.kernels.triton import prefill_attention as new

PATH = "tallow/kernels/triton/prefill_attention.py"


def load_old(rev: str):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(subprocess.run(["git", "show", f"{rev}:{PATH}"], capture_output=True, text=True, check=True).stdout)
    spec = importlib.util.spec_from_file_location("tallow.kernels.triton._prefill_attention_old", f.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ptx(kernel, constexprs: dict, pointers: dict, floats=()) -> str:
    names = kernel.arg_names
    sig = {n: "constexpr" if n in constexprs else pointers.get(n, "*fp16") if n.endswith("_ptr")
           else "fp32" if n in floats else "i32" for n in names}
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(n),): v for n, v in constexprs.items()})
    text = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    text = text.split(".section\t.debug")[0]  # the DWARF sections name inlined helpers
    text = re.sub(r"\.loc.*|\.file.*|//.*|_kernel\w*|\$L__\w+:?", "", text)
    return "\n".join(line for line in text.split("\n") if line.strip())


def variants():
    for split, on_device, scaled, softcap in itertools.product((True, False), repeat=4):
        yield (f"_prefill_kernel split={split} start_on_device={on_device} int8_kv={scaled} softcap={softcap}",
               "_prefill_kernel",
               ({"GROUP": 6, "D": 128, "BLOCK_D": 128, "BLOCK_M": 64, "BLOCK_N": 64, "SCALED": scaled,
                 "SOFTCAP": softcap, "START_ON_DEVICE": on_device, "SPLIT": split},
                {"start_ptr": "*i32", "part_ptr": "*fp32", "ml_ptr": "*fp32", "ks_ptr": "*fp32", "vs_ptr": "*fp32",
                 "k_ptr": "*i8" if scaled else "*fp16", "v_ptr": "*i8" if scaled else "*fp16"},
                ("qk_scale", "softcap")))
    for on_device in (True, False):
        yield (f"_merge_kernel start_on_device={on_device}", "_merge_kernel",
               ({"D": 128, "BLOCK_D": 128, "BLOCK_M": 64, "START_ON_DEVICE": on_device},
                {"start_ptr": "*i32", "part_ptr": "*fp32", "ml_ptr": "*fp32"}))


def main() -> None:
    old = load_old(sys.argv[1])
    shown = False
    for label, name, args in variants():
        a, b = ptx(getattr(old, name), *args), ptx(getattr(new, name), *args)
        verdict = "same PTX" if a == b else "same length" if len(a) == len(b) else "DIFFERENT"
        print(f"{label}: {verdict}")
        if a != b and not shown:
            print("\n".join(difflib.unified_diff(a.split("\n"), b.split("\n"), lineterm="", n=0)))
            shown = True


if __name__ == "__main__":
    main()
