"""Whether a refactor of Triton kernels changes what an H100/H200 runs, checked on a machine without a GPU: Triton
compiles a kernel ahead of time for a named target (sm_90, its own ptxas) from the source alone. The wrappers run
here with each kernel's launch recorded instead of made (arguments, constexprs, num_warps), and the kernel of REV
and of the working tree are compiled for every recorded launch and their PTX compared, debug sections and names
left out. The kernel's parameters must be the same at REV.

    python scripts/triton_ptx_same.py REV prefill_attention     # or: gemv (quant_gemv and mmvq), fp4 (the FP4 GEMV and
                                                                #     the expert dequantization)

Prints one line a launch: "same PTX", "same length" (the same instructions in another order or with other
register numbers: the script prints the diff of the first such launch), or "DIFFERENT"."""
import difflib
import importlib
import importlib.util
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

POINTER = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int64: "*i64",
           torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8", torch.uint8: "*u8"}
OPTIONS = ("num_warps", "num_stages", "launch_pdl")


def modules_at(rev: str, names: list[str]) -> dict:
    """Modules `names` (e.g. tallow.kernels.triton.mmvq) as they were at `rev`, each under a name of its own; a
    kernel helper one of them imports from another (mmvq's _finish_rows from quant_gemv) is the other's at `rev`."""
    old = {}
    for name in names:
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            path = name.replace(".", "/") + ".py"
            f.write(subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout)
        spec = importlib.util.spec_from_file_location(name + "_at_rev", f.name)
        mod = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        mod.__package__ = name.rsplit(".", 1)[0]
        spec.loader.exec_module(mod)
        old[name] = mod
    for mod in old.values():
        for attr, value in list(vars(mod).items()):
            source = getattr(getattr(value, "fn", None), "__module__", None)
            if isinstance(value, triton.runtime.JITFunction) and source in old and source != mod.__name__:
                setattr(mod, attr, getattr(old[source], attr))
    return old


def recorded(module, kernels: tuple[str, ...], call) -> list[tuple[str, dict]]:
    """The launches of module's `kernels` that call() makes, as (kernel, {parameter: value}); nothing runs."""
    real, launches = {k: getattr(module, k) for k in kernels}, []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((self.name, dict(zip(real[self.name].arg_names, args)) | kwargs))
            return launch

    for k in kernels:
        setattr(module, k, Recorder(k))
    try:
        call()
    finally:
        for k in kernels:
            setattr(module, k, real[k])
    return launches


def ptx(kernel, launch: dict) -> str:
    sig, constexprs = {}, {}
    for i, p in enumerate(kernel.params):
        v = launch[p.name]
        if p.is_constexpr:
            sig[p.name], constexprs[(i,)] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = POINTER[v.dtype]
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            sig[p.name] = "i32" if -2**31 <= int(v) < 2**31 else "i64"
    options = {k: launch[k] for k in OPTIONS if k in launch and k != "launch_pdl"}
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs)
    text = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    text = text.split(".section\t.debug")[0]  # the DWARF sections name inlined helpers
    text = re.sub(r"\.loc.*|\.file.*|//.*|_kernel\w*|\$L__\w+:?", "", text)
    return "\n".join(line for line in text.split("\n") if line.strip())


def prefill_attention_launches():
    """The split and one-pass prefill attention (f16 and int8 K/V, softcap, start on the device) and the merge."""
    from tallow.kernels.triton import prefill_attention as pa

    out = []
    for int8 in (False, True):
        for softcap in (None, 30.0):
            for n_keys in (300, 5000):  # one pass; 2048-key ranges and their merge
                for on_device in (False, True):
                    n, heads, kv_heads, d = 64, 4, 2, 64
                    q = torch.zeros(n, heads, d)
                    dtype = torch.int8 if int8 else torch.float16
                    k = torch.zeros(kv_heads, n_keys + n, d, dtype=dtype)
                    scales = (torch.ones(kv_heads, n_keys + n), torch.ones(kv_heads, n_keys + n)) if int8 else (None, None)
                    start = torch.tensor([n_keys], dtype=torch.int32) if on_device else n_keys
                    call = lambda: pa.prefill_attention(q, k, k, start, 0, 0.125, softcap=softcap,
                                                        k_scale=scales[0], v_scale=scales[1])
                    out += recorded(pa, ("_prefill_kernel", "_merge_kernel"), call)
    return "tallow.kernels.triton.prefill_attention", out


def gemv_launches():
    """quant_gemv and mmvq on Q4_K, Q6_K and Q8_0 weights: 1 and 3 rows, K split 1 and 2, with and without an addend."""
    sys.path.insert(0, "tests")
    from test_quant_reference import random_rows

    from gguf import GGMLQuantizationType as QT
    from tallow.kernels.triton import mmvq, quant_gemv
    from tallow.kernels.triton.planes import pack_planes

    out = []
    for qt in (QT.Q4_K, QT.Q6_K, QT.Q8_0):
        raw = random_rows(qt, 8, 512, seed=1)
        w = pack_planes(torch.from_numpy(raw.copy()), qt, 512)
        for rows in (1, 3):
            x = torch.zeros(rows, 512)
            for split in (1, 2):
                for add in (None, torch.zeros(8)):
                    g = lambda: quant_gemv.quant_gemv(x, w, config=(4, 1, 1, 1, split), add=add)
                    m = lambda: mmvq.mmvq_q8(mmvq.quantize_q8_1_reference(x), w, config=(4, 1, 1, 1, split, True), add=add)
                    out += [("quant_gemv", *r) for r in recorded(quant_gemv, ("_gemv_kernel",), g)]
                    out += [("mmvq", *r) for r in recorded(mmvq, ("_mmvq_kernel",), m)]
    # as the H200 launches them (here the wrappers pick the portable dot and no PDL): PDL, and mmvq's dp4a
    out += [(mod, k, l | {"PDL": True} | ({"DP4A": True} if k == "_mmvq_kernel" else {})) for mod, k, l in out]
    return "tallow.kernels.triton", out


def fp4_launches():
    """fp4_gemv on NVFP4 and MXFP4 weights, and moe_gemv's FP4 dequantization (the expert prefill's old path)."""
    from gguf import GGMLQuantizationType as QT
    from tallow.kernels.triton import fp4_gemv, moe_gemv

    out = []
    for qt, block in ((QT.NVFP4, 36), (QT.MXFP4, 17)):
        per = 64 if qt == QT.NVFP4 else 32
        raw = torch.zeros(8, 512 // per * block, dtype=torch.uint8)
        out += [("fp4_gemv", *r) for r in recorded(fp4_gemv, ("_fp4_gemv_kernel",),
                                                    lambda: fp4_gemv.fp4_gemv(torch.zeros(1, 512), raw, int(qt)))]
        out += [("moe_gemv", *r) for r in recorded(moe_gemv, ("_fp4_dequant_kernel",),
                                                    lambda: moe_gemv.fp4_dequantize_to(raw, int(qt), 512, torch.empty(8, 512)))]
    return "tallow.kernels.triton", out


def main() -> None:
    rev, which = sys.argv[1], sys.argv[2]
    shown = False
    if which == "prefill_attention":
        name, launches = prefill_attention_launches()
        launches = [(name, k, l) for k, l in launches]
    else:
        package, launches = fp4_launches() if which == "fp4" else gemv_launches()
        launches = [(f"{package}.{mod}", k, l) for mod, k, l in launches]
    old = modules_at(rev, sorted({name for name, _, _ in launches}))
    for name, kernel, launch in launches:
        a = ptx(getattr(old[name], kernel), launch)
        b = ptx(getattr(importlib.import_module(name), kernel), launch)
        verdict = "same PTX" if a == b else "same length" if len(a) == len(b) else "DIFFERENT"
        keys = {k: v for k, v in launch.items() if isinstance(v, (bool, int)) and k.isupper()}
        print(f"{kernel} {keys}: {verdict}")
        if a != b and not shown:
            print("\n".join(difflib.unified_diff(a.split("\n"), b.split("\n"), lineterm="", n=0)))
            shown = True


if __name__ == "__main__":
    main()
