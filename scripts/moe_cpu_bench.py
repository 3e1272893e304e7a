"""One routed-expert FFN at decode (1 token) on the CPU: per-expert linears (kernels/cpu/moe.py)
against one dense FFN reading the same bytes, and against a gather-then-batched-matmul form.

    python scripts/moe_cpu_bench.py [--dim 2048] [--width 768] [--experts 32] [--used 8] [--qtype Q4_0]

The Qwen3-30B-A3B shape is dim 2048, width 768, 8 of 128 experts; fewer experts (default 32)
keep the packing quick and change nothing per token (only k experts are read); each step routes
afresh (random logits drawn before timing). Prints ms per token, median of --reps, for:
  experts   ExpertBank: k gate/up + k down products, each its expert's packed int4/int8 weight
  dense     one gate/up + one down product of width k * width (the same bytes, 2 calls), cycling
            through n / k such FFNs so their weights stream as the experts' do
  gathered  the k experts' bf16 weights gathered (index_select) then two batched bf16 matmuls
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from median_ms import median_ms  # noqa: E402  (scripts/, the running script's folder)
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf.quants import quantize  # noqa: E402

from tallow.gguf_file import TensorInfo  # noqa: E402
from tallow.kernels.cpu.linear import make_linear  # noqa: E402
from tallow.kernels.cpu.moe import ExpertBank, expert_slice, route_softmax  # noqa: E402
from tallow.layers import swiglu  # noqa: E402


def _tensor(name: str, arr: np.ndarray, qt: QT) -> TensorInfo:
    raw = quantize(arr, qt) if qt != QT.F32 else arr.view(np.uint8)
    raw = raw.reshape(-1, raw.shape[-1])
    shape = tuple(reversed(arr.shape))
    return TensorInfo(name, qt, shape, 0, raw.nbytes, raw)


def _glu(gu: torch.Tensor) -> torch.Tensor:
    f = gu.shape[-1] // 2
    return swiglu(gu[:, :f], gu[:, f:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--qtype", default="Q4_0")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1: steadier on a busy machine)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    qt, rng = QT[a.qtype], np.random.default_rng(0)
    n, k, dim, width = a.experts, a.used, a.dim, a.width
    gate_up = _tensor("gu", (rng.standard_normal((n, 2 * width, dim)) * dim**-0.5).astype(np.float32), qt)
    down = _tensor("d", (rng.standard_normal((n, dim, width)) * width**-0.5).astype(np.float32), qt)
    bank = ExpertBank([make_linear(expert_slice(gate_up, e, n)) for e in range(n)],
                      [make_linear(expert_slice(down, e, n)) for e in range(n)])
    # n / k distinct dense FFNs, cycled: as many weight bytes as the experts, streamed the same way.
    dense = []
    for _ in range(max(1, n // k)):
        gu = _tensor("dgu", (rng.standard_normal((2 * k * width, dim)) * dim**-0.5).astype(np.float32), qt)
        d = _tensor("dd", (rng.standard_normal((dim, k * width)) * width**-0.5).astype(np.float32), qt)
        dense.append((make_linear(gu), make_linear(d)))
    # The gathered form keeps every expert's weight dense in bf16 (4x the int4 bytes resident).
    w_gu = torch.stack([make_linear(expert_slice(gate_up, e, n), mode="dense").weight for e in range(n)])
    w_d = torch.stack([make_linear(expert_slice(down, e, n), mode="dense").weight for e in range(n)])
    x = torch.randn(1, dim)
    # A fresh routing each step (as tokens pick different experts), drawn before timing.
    routes = [route_softmax(torch.randn(1, n), k) for _ in range(a.reps + 1)]
    step = {"i": 0}

    def route():
        step["i"] = (step["i"] + 1) % len(routes)
        return routes[step["i"]]

    def experts():
        weights, ids = route()
        return bank(x, ids, weights, _glu)

    def dense_ffn():
        gu, d = dense[step["i"] % len(dense)]
        step["i"] += 1
        return d(_glu(gu(x)))

    def gathered():
        weights, ids = route()
        sel = ids[0]
        h = x.to(torch.bfloat16).expand(k, 1, dim)
        gu = torch.bmm(h, w_gu.index_select(0, sel).transpose(1, 2)).float()[:, 0]  # (k, 2w)
        y = torch.bmm(_glu(gu).to(torch.bfloat16).unsqueeze(1), w_d.index_select(0, sel).transpose(1, 2)).float()[:, 0]
        return (y * weights[0].unsqueeze(-1)).sum(0, keepdim=True)

    results = {
        "experts": median_ms(experts, a.reps),
        "dense": median_ms(dense_ffn, a.reps),
        "gathered": median_ms(gathered, a.reps),
    }
    active = bank.gate_up[0].nbytes * k + bank.down[0].nbytes * k
    print(f"{a.qtype} dim {dim} width {width} {k} of {n} experts, {bank.kind}; active packed weights {active / 2**20:.2f} MiB, "
          f"threads {torch.get_num_threads()}")
    for name, ms in results.items():
        print(f"  {name:9s} {ms:7.3f} ms/token")


if __name__ == "__main__":
    main()
