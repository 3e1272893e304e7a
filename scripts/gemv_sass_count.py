"""Instructions per weight in the K loop of the decode GEMVs, from their sm_90 SASS, with no GPU.

    python scripts/gemv_sass_count.py            the table below
    python scripts/gemv_sass_count.py --check    mmvq's row-exactness guard (exit 1 on a finding,
                                                 3 where nothing compiles for sm_90)

Compiles quant_gemv.py's and mmvq.py's kernels for an H200 (triton.compile with a GPUTarget, the
ptxas and cuobjdump Triton bundles), finds the K loop (the longest backward branch) and divides
its instruction count by the weights one thread handles per iteration. A static count, not a
timing: it says which kernel is instruction-bound (an H200 at its ~4 TB/s streams Q4_K weights
at ~7e12/s against ~3.3e13 thread-instructions/s: ~4.7 instructions per weight at most).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from tallow.kernels.triton import mmvq as MV  # noqa: E402
from tallow.kernels.triton import quant_gemv as QG  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
ALIGNED = [["tt.divisibility", 16]]  # what a launch with 16-byte aligned tensors specializes to


def _compile(fn, types: list[str], consts: dict, aligned: range, warps: int):
    names = list(inspect.signature(fn.fn).parameters)
    sig = dict(zip(names, types + ["constexpr"] * len(consts)))
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs={(i,): ALIGNED for i in aligned})
    return triton.compile(src, target=TARGET, options={"num_warps": warps})


def quant_gemv_kernel(qtype: str, bn: int, blocks: int, warps: int, stages: int):
    qt, bk, gper, j, terms, stride = QG._LAYOUT[qtype]
    planes = {"Q4_K": ["*u8", "*u8", "*fp16", "*u8"], "Q6_K": ["*u8", "*u8", "*i8", "*fp16"],
              "Q8_0": ["*i8", "*fp16", "*u8", "*u8"], "Q4_1": ["*u8", "*fp16", "*fp16", "*u8"],
              "Q5_0": ["*u8", "*fp16", "*i32", "*u8"]}[qtype]
    types = (["*fp32"] + planes + ["*fp32", "i32", "i32", "i32", "i32", "*fp32", "*fp32", "*fp32", "i32", "i32",
                                   "fp32", "*fp32", "*i32", "i32"])
    consts = dict(PRO=0, WRITE_SUM=False, QT=qt, ROWS=1, BLOCK_N=bn, BLOCKS=blocks, STAGES=stages, BLOCK_K=bk,
                  G=blocks * gper, J=j, T=terms, S=stride, SPLIT=1, PREFETCH=False, PDL=False)
    return _compile(QG._gemv_kernel, types, consts, range(16), warps), bn * blocks * bk


def mmvq_kernel(qtype: str, bn: int, blocks: int, warps: int, stages: int, dp4a: bool = True, rows: int = 1):
    planes = {"Q4_K": ["*i32", "*u8", "*fp16", "*i32"], "Q6_K": ["*i32", "*i32", "*i8", "*fp16"],
              "Q8_0": ["*i32", "*fp16", "*i32", "*i32"], "Q4_0": ["*i32", "*fp16", "*i32", "*i32"],
              "Q4_1": ["*i32", "*fp16", "*fp16", "*i32"], "Q5_0": ["*i32", "*fp16", "*i32", "*i32"]}[qtype]
    types = planes + ["*i32", "*fp16", "*i32", "*fp16", "*fp32", "i32", "i32", "i32", "*fp32", "*i32", "i32"]
    bk = MV._BLOCK[qtype]
    consts = dict(QT=MV.MMVQ_TYPES.index(qtype), ROWS=rows, BLOCK_N=bn, BLOCKS=blocks, STAGES=stages, BLOCK_K=bk,
                  G=blocks * MV._G_PER[qtype], SPLIT=1, DP4A=dp4a, WIDE=False, PDL=False)
    return _compile(MV._mmvq_kernel, types, consts, range(14), warps), bn * blocks * bk


def loop_instructions(kernel) -> int:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    lines = [(int(m.group(1), 16), text) for text in sass.splitlines()
             if (m := re.match(r"\s+/\*([0-9a-f]{4,})\*/", text))]
    best = 0
    for addr, text in lines:
        m = re.search(r"BRA.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            best = max(best, sum(1 for a, _ in lines if int(m.group(1), 16) <= a <= addr))
    return best


def sums_of_two_products(llir: str) -> list[str]:
    """fadd/fsub lines of LLVM IR whose two operands are both fmul results: fma contraction may
    fuse either product, and the choice can differ between kernels of different ROWS (it did for
    mmvq's Q4_K on the H200: row r of an M-row product then missed its one-row product)."""
    defs = dict(re.findall(r"(%\w+) = (\w+) ", llir))
    found = []
    for line in llir.splitlines():
        m = re.match(r"\s*%\w+ = f(?:add|sub) [^%]*(%\w+), (%\w+)", line)
        if m and defs.get(m.group(1)) == "fmul" and defs.get(m.group(2)) == "fmul":
            found.append(line.strip())
    return found


def check() -> int:
    """mmvq for every type at ROWS 2: no sum left to contraction. 0 clean, 1 a finding."""
    bad = 0
    for qtype in MV.MMVQ_TYPES:
        blocks = 2 if MV._BLOCK[qtype] == 256 else 16
        kernel, _ = mmvq_kernel(qtype, 8, blocks, 1, 1, rows=2)
        found = sums_of_two_products(kernel.asm["llir"])
        bad += len(found)
        print(f"{qtype}: {len(found)} sums of two products" + "".join(f"\n  {f}" for f in found[:3]), flush=True)
    return 1 if bad else 0


def main() -> None:
    if "--check" in sys.argv[1:]:
        try:
            sys.exit(check())
        except Exception as e:  # noqa: BLE001  (no offline compile here: not a finding)
            print(f"cannot compile for sm_90 here: {type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(3)
    rows = [("quant_gemv", "Q4_K", (8, 2, 4, 3)), ("quant_gemv", "Q6_K", (8, 2, 4, 3)), ("quant_gemv", "Q8_0", (8, 8, 4, 1)),
            ("quant_gemv", "Q4_1", (8, 8, 4, 1)), ("quant_gemv", "Q5_0", (8, 8, 4, 1)),
            ("mmvq", "Q4_K", (8, 2, 1, 1)), ("mmvq", "Q4_K", (8, 2, 4, 1)), ("mmvq", "Q4_K", (16, 2, 2, 1)),
            ("mmvq", "Q4_K", (32, 2, 4, 1)), ("mmvq", "Q6_K", (8, 2, 1, 1)), ("mmvq", "Q6_K", (16, 2, 2, 1)),
            ("mmvq", "Q8_0", (8, 16, 1, 1)), ("mmvq", "Q4_0", (8, 16, 1, 1)), ("mmvq", "Q4_1", (8, 16, 1, 1)),
            ("mmvq", "Q5_0", (8, 16, 1, 1)), ("mmvq int32-mul", "Q4_K", (8, 2, 1, 1))]
    print(f"triton {triton.__version__}, sm_90")
    for kind, qtype, (bn, blocks, warps, stages) in rows:
        if kind == "quant_gemv":
            kernel, weights = quant_gemv_kernel(qtype, bn, blocks, warps, stages)
        else:
            kernel, weights = mmvq_kernel(qtype, bn, blocks, warps, stages, dp4a=kind == "mmvq")
        n = loop_instructions(kernel)
        per_thread = weights / (32 * warps)
        print(f"{kind:15s} {qtype} BLOCK_N {bn:2d} BLOCKS {blocks:2d} warps {warps}: K loop {n:4d} SASS "
              f"instructions, {n / per_thread:5.2f} per weight", flush=True)


if __name__ == "__main__":
    main()
