"""TALLOW_NORM_ADD_Q8 on a GPU: the norm after a residual join writing its output's Q8_1 blocks
(mmvq.rmsnorm_add_q8) against the two launches it replaces (rmsnorm.rmsnorm_add with next_weight,
then mmvq.quantize_q8_1 of its output).

    python scripts/gpu_norm_add_q8.py

check: fresh random rows per shape; the stream, the normed row and every field of the Q8_1 blocks
bit for bit the two launches' (the fused launch allocates its blocks, so equality with the
reference is what shows every byte written); each of 8 rows bit for bit its one-row call.
time: 50 launches (or 50 pairs) in one CUDA graph with PDL as the decode step launches them,
median of 15 replays, µs per launch (pair).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tallow.kernels.triton.mmvq import quantize_q8_1, rmsnorm_add_q8  # noqa: E402
from tallow.kernels.triton.rmsnorm import rmsnorm_add  # noqa: E402
from gpu_bench_kernels import graph_time_us  # noqa: E402

FIELDS = ("qs", "d", "s", "isum")


def check(m: int, k: int, seed: int, reload: bool) -> bool:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g) * 3.0
    res = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(k, device="cuda", generator=g)
    w2 = torch.rand(k, device="cuda", generator=g) + 0.5
    scale = torch.rand(1, device="cuda", generator=g) + 0.5
    ok = True
    for sc in (None, scale):
        out, h = rmsnorm_add(x, w, 1e-6, res, sc, next_weight=w2)
        want = quantize_q8_1(h)
        got_out, got_h, got = rmsnorm_add_q8(x, w, 1e-6, res, w2, sc, reload=reload)
        torch.cuda.synchronize()
        same = torch.equal(out, got_out) and torch.equal(h, got_h) and all(
            torch.equal(getattr(got, f), getattr(want, f)) for f in FIELDS)
        rows = all(all(torch.equal(getattr(rmsnorm_add_q8(x[r:r + 1], w, 1e-6, res[r:r + 1], w2, sc, reload=reload)[2], f)[0],
                                   getattr(got, f)[r]) for f in FIELDS) for r in range(m))
        diff = int((got.qs.int() - want.qs.int()).abs().max())
        print(f"check reload={reload} m={m} k={k} scale={sc is not None}: bit-identical {same}, rows = one-row calls {rows}, "
              f"max |dcode| {diff}")
        ok &= same and rows
    return ok


def timing(m: int, k: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(k)
    x = torch.randn(m, k, device="cuda", generator=g)
    res = torch.randn(m, k, device="cuda", generator=g)
    w, w2 = torch.randn(k, device="cuda", generator=g), torch.rand(k, device="cuda", generator=g) + 0.5
    out = torch.empty_like(x)

    def pair():
        _, h = rmsnorm_add(x, w, 1e-6, res, out=out, next_weight=w2)
        quantize_q8_1(h)

    def norm_only():
        rmsnorm_add(x, w, 1e-6, res, out=out, next_weight=w2)

    def fused():
        rmsnorm_add_q8(x, w, 1e-6, res, w2, out=out, reload=False)

    def fused_reload():
        rmsnorm_add_q8(x, w, 1e-6, res, w2, out=out, reload=True)

    t_pair, t_norm, t_fused, t_reload = (graph_time_us([f] * 50) for f in (pair, norm_only, fused, fused_reload))
    print(f"time m={m} k={k}: norm + Q8_1 {t_pair:.2f} us/pair, norm alone {t_norm:.2f}, fused {t_fused:.2f} "
          f"(reshape in registers), {t_reload:.2f} (h re-read)")


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    for reload in (False, True):
        ok = True
        for i, (m, k) in enumerate([(1, 1536), (8, 1536), (1, 2048), (1, 2560), (3, 640), (1, 4096)]):
            ok &= check(m, k, 100 + i, reload)
        print(f"reload={reload}: " + ("ALL BIT-IDENTICAL" if ok else "MISMATCH"))
    for m, k in [(1, 1536), (1, 2560), (8, 1536)]:
        timing(m, k)


if __name__ == "__main__":
    main()
