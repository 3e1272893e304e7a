"""Experiment (issue 14): is smollm2's forward pass bit-identical to llama.cpp once its Q4_1 (and
its Q8_0 output) products sum in ggml's order? A slow torch transcription of ggml_vec_dot_q4_1_q8_1 as this
machine runs it (arch/x86/quants.c, AVX2 form with AVX512-VNNI: per block, 8 float lanes each
holding the integer sum of 4 adjacent code products, acc = fma(d_w*d_x, lane, acc) block by
block; the min term summs = fma(m_w, s_x, summs); then hsum_float_8(acc) + summs) replaces
GgmlLinear's product for the Q4_1 weights (and Q8_0's, see q0_dot_exact). The product's real home is the C kernel of
tallow/kernels/cpu (issue 14's `cpudot` half); this only measures what it buys. Measured (docs/performance.md,
session 8): every smollm2 linear bit-identical, and with them the whole model's logits over 32 tokens equal
llama.cpp b11434's bit for bit.

  PYTHONPATH=$PWD python scripts/numerics_exact_q4_1.py [--layers] [--teacher] [--bits N]

--layers: numerics_layers.py's op-by-op table for layer 0 with the exact product;
--teacher: the whole-model teacher-forced comparison (numerics_conformance.py) with it;
--bits N: the logits of the first N conformance-text tokens against the reference harness's,
  bit for bit (measured, session 8: N = 32, all 1,572,864 logits identical).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["TALLOW_NUMERICS"] = "ggml"

from tallow.kernels.cpu import ggml_linear  # noqa: E402
from tallow.kernels.cpu.q8_activations import quantize_q8_0, quantize_q8_1  # noqa: E402
from tallow.numerics import fma  # noqa: E402


def hsum_float_8(acc: torch.Tensor) -> torch.Tensor:
    """hsum_float_8 over the last axis: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))."""
    r = acc[..., 4:8] + acc[..., 0:4]
    r = r[..., 0:2] + r[..., 2:4]
    return r[..., 0] + r[..., 1]


def q0_dot_exact(x: torch.Tensor, raw: torch.Tensor, qtype: QT, n_rows: int, k: int) -> torch.Tensor:
    """x (M, K) float32 against the Q4_1 or Q8_0 weight bytes raw (N, row bytes): (M, N) as ggml
    sums it. Q8_0 x Q8_0 takes the same order in ggml_vec_dot_q8_0_q8_0 (one row) and in
    llamafile's tinyBLAS_Q0_AVX (prompts): 8 lanes, fma per block, hsum_float_8; no min term."""
    nb = k // 32
    if qtype == QT.Q4_1:
        codes, dy, sy = quantize_q8_1(x)  # (M, nb, 32), (M, nb) fp16 d, (M, nb) fp16 s
        blocks = raw.reshape(n_rows, nb, 20)
        mx = blocks[..., 2:4].contiguous().view(torch.float16).float()[..., 0]
        qs = blocks[..., 4:20].to(torch.int32)
        q = torch.cat((qs & 15, qs >> 4), dim=-1).double()  # (N, nb, 32): low nibbles are elements 0..15
    else:
        codes, dy = quantize_q8_0(x)
        sy = mx = None
        blocks = raw.reshape(n_rows, nb, 34)
        q = blocks[..., 2:34].contiguous().view(torch.int8).double()
    dx = blocks[..., 0:2].contiguous().view(torch.float16).float()[..., 0]
    out = torch.empty(x.shape[0], n_rows, dtype=torch.float32)
    step = max(1, (1 << 24) // (n_rows * nb * 8))
    for m0 in range(0, x.shape[0], step):
        c = codes[m0 : m0 + step].double()
        lanes = torch.einsum("nbli,mbli->mnbl", q.reshape(n_rows, nb, 8, 4), c.reshape(-1, nb, 8, 4)).float()
        d0d1 = dx[None] * dy[m0 : m0 + step, None]  # (m, N, nb) float32
        acc = torch.zeros(lanes.shape[0], n_rows, 8)
        summs = torch.zeros(lanes.shape[0], n_rows)
        for b in range(nb):
            if mx is not None:
                summs = fma(mx[None, :, b], sy[m0 : m0 + step, None, b].expand(-1, n_rows), summs)
            acc = fma(d0d1[..., b, None].expand_as(acc), lanes[..., b, :], acc)
        out[m0 : m0 + step] = hsum_float_8(acc) + summs if mx is not None else hsum_float_8(acc)
    return out


def install() -> None:
    """GgmlLinear's product for Q4_1 and Q8_0 weights becomes q0_dot_exact (reading the file's bytes)."""
    base_init, base_mm = ggml_linear.GgmlLinear.__init__, ggml_linear.GgmlLinear._mm

    def init(self, tensor, bias=None):
        base_init(self, tensor, bias)
        exact = self.qtype in (QT.Q4_1, QT.Q8_0)
        self.raw = torch.from_numpy(tensor.data.reshape(tensor.n_rows, -1).copy()) if exact else None

    def mm(self, x2):
        if getattr(self, "raw", None) is None:
            return base_mm(self, x2)
        return q0_dot_exact(x2.float(), self.raw, self.qtype, self.out_features, self.in_features)

    ggml_linear.GgmlLinear.__init__ = init
    ggml_linear.GgmlLinear._mm = mm


def bits(n: int) -> None:
    import json

    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "scripts"))
    from model_paths import require_model
    from numerics_reference import Reference

    import tallow

    path = require_model("smollm2-135m")
    ids = json.loads((ROOT / "tests" / "fixtures" / "conformance_smollm2-135m.json").read_text())["teacher_forced"]["ids"][:n]
    ref = Reference(path)
    theirs = ref.logits(ids)
    ref.close()
    llm = tallow.LLM(path, ctx=256)
    llm.engine.reset()
    ours = llm.model.forward(ids, 0, llm.engine.kv, all_logits=True).numpy()
    same = ours == theirs
    print(f"{n} tokens: {int(same.sum())} of {same.size} logits bit-identical to llama.cpp, max |d| {np.abs(ours - theirs).max():.3e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", action="store_true")
    ap.add_argument("--teacher", action="store_true")
    ap.add_argument("--bits", type=int, default=0)
    args = ap.parse_args()
    install()
    if args.layers:
        sys.argv = ["numerics_layers.py", "smollm2-135m", "--layers", "0,29"]
        runpy.run_path(str(ROOT / "scripts" / "numerics_layers.py"), run_name="__main__")
    if args.bits:
        bits(args.bits)
    if args.teacher:
        sys.argv = ["numerics_conformance.py", "smollm2-135m", "--greedy", "0"]
        runpy.run_path(str(ROOT / "scripts" / "numerics_conformance.py"), run_name="__main__")


if __name__ == "__main__":
    main()
