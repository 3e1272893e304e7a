"""TALLOW_HYBRID_STACK_IN's products against the separate ones on a Falcon-H1 file's own weights (Q4_K_M), on the GPU.

    python scripts/gpu_stack_bits.py MODEL.gguf [--layers 0,5,-1]

The twins' logits are degenerate (all zero: their random activations overflow the final norm), so the
model-level bit check says nothing there; this compares the products themselves: for a few layers, the
stacked [ssm_in, q, k, v] product of one random normed row (a LazyInput, as the block passes it) against
the in-projection and Q/K/V built separately, column block by column block (torch.equal), and the
integer-dot configs each used.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from tallow.gguf_file import GGUFFile
    from tallow.kernels.dispatch import Placement
    from tallow.spec import spec_from_gguf

    gf = GGUFFile(sys.argv[1])
    spec = spec_from_gguf(gf)
    layers = [int(v) for v in (sys.argv[sys.argv.index("--layers") + 1] if "--layers" in sys.argv else "0,5,-1").split(",")]
    place = Placement("cuda")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    for i in layers:
        i = i % spec.n_layers
        names = [f"blk.{i}.{r}.weight" for r in ("ssm_in", "attn_q", "attn_k", "attn_v")]
        stacked = place.linear_group([place.linear(gf.tensors[n]) for n in names])
        parts = [place.linear(gf.tensors[n]) for n in names]
        qkv = place.linear_group(parts[1:])
        place.share_input([qkv, parts[0]])  # the separate form as the model builds it (TALLOW_HYBRID_STACK_IN=0)
        x = torch.randn(1, spec.dim, generator=g, device=dev)
        w = torch.ones(spec.dim, device=dev)
        res, h1 = place.ops.add_norm(x, torch.zeros_like(x), w, 1e-5)
        both = stacked(h1)
        res, h2 = place.ops.add_norm(x, torch.zeros_like(x), w, 1e-5)
        sep = torch.cat([parts[0](h2), qkv(h2)], dim=1)
        n_in = parts[0].out_features
        print(f"{Path(sys.argv[1]).name} layer {i}: stacked {stacked.kind} vs {parts[0].kind} + {qkv.kind}: "
              f"in-projection equal {torch.equal(both[:, :n_in], sep[:, :n_in])}, Q/K/V equal "
              f"{torch.equal(both[:, n_in:], sep[:, n_in:])}, max |d| {(both - sep).abs().max().item():.3g}")


if __name__ == "__main__":
    main()
