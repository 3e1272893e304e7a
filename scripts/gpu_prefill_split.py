"""The split prefill attention (TALLOW_PREFILL_SPLIT, kernels/triton/prefill_attention.py) on the GPU:
a 512-token chunk after a deep prefix on the study's attention shapes, split against the one-pass
kernel and an fp32 torch reference, and both timed (the start on the device, as the captured
prefill graphs run it, in a cache of 33280 slots as the study's).

    python scripts/gpu_prefill_split.py

One JSON line per (shape, depth). Times: CUDA events over 10 calls after 2.
"""

from __future__ import annotations

import json
import os

import torch
from gpu_timing import time_us

from tallow import switches
from tallow.kernels.triton.prefill_attention import prefill_attention

SHAPES = {  # query heads, KV heads, head_dim
    "falcon-h1-1.5b-deep": (6, 2, 128),
    "falcon-h1-1.5b": (8, 2, 128),
    "falcon-h1-3b": (10, 2, 128),
    "qwen25-1.5b": (12, 2, 128),
}
SLOTS, N = 33280, 512


def timed(fn):
    return time_us(fn, 10, 2)


def run(split: bool, *args):
    os.environ["TALLOW_PREFILL_SPLIT"] = "1" if split else "0"
    switches.refresh()
    return prefill_attention(*args)


def main() -> None:
    print(json.dumps({"device": torch.cuda.get_device_name(0)}), flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for name, (nh, nkv, d) in SHAPES.items():
        k = torch.randn(nkv, SLOTS, d, generator=g, device="cuda").half()
        v = torch.randn(nkv, SLOTS, d, generator=g, device="cuda").half()
        for depth in (0, 4096, 16384, 32256):
            q = torch.randn(N, nh, d, generator=g, device="cuda")
            args = (q, k, v, torch.tensor([depth], device="cuda"), 0, d ** -0.5)
            one, split = run(False, *args), run(True, *args)
            # fp32 reference over the visible keys
            kk = k[:, : depth + N].float().repeat_interleave(nh // nkv, 0)
            vv = v[:, : depth + N].float().repeat_interleave(nh // nkv, 0)
            s = torch.einsum("nhd,htd->hnt", q.half().float(), kk) * d ** -0.5
            vis = torch.arange(depth + N, device="cuda")[None, :] <= torch.arange(depth, depth + N, device="cuda")[:, None]
            ref = torch.einsum("hnt,htd->nhd", s.masked_fill(~vis, float("-inf")).softmax(-1), vv).reshape(N, -1)
            scale = ref.abs().max().item()
            row = {"shape": name, "depth": depth,
                   "split_vs_one_max_rel": (split - one).abs().max().item() / scale,
                   "split_vs_fp32_max_rel": (split - ref).abs().max().item() / scale,
                   "one_vs_fp32_max_rel": (one - ref).abs().max().item() / scale,
                   "equal": torch.equal(split, one),
                   "one_pass_us": round(run(False, *args) is not None and timed(lambda: prefill_attention(*args)), 1),
                   "split_us": round(run(True, *args) is not None and timed(lambda: prefill_attention(*args)), 1)}
            print(json.dumps({k_: (float(f"{v_:.3g}") if isinstance(v_, float) else v_) for k_, v_ in row.items()}), flush=True)
            del s, kk, vv, ref


if __name__ == "__main__":
    main()
