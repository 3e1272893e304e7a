"""The router of a mixture-of-experts layer in one launch: softmax over the experts' logits, the
k most probable experts, their weights renormalized to sum to one.

In torch that is five to seven small kernels per layer (softmax, top-k with its sort, the sum,
the division, the casts), ~15 µs of a ~90 µs decode layer on the H200; here one program per
token row holds its n_experts logits in registers. The top k are found by k passes of
max-then-lowest-index, so ties go to the lower expert id, most probable first — the order of
kernels/cpu/moe.py's route_softmax (torch.topk, sorted), whose arithmetic this follows:
exp(x - max) / sum, then w / max(sum of the k, min_sum).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl

@triton.jit
def _route_kernel(logits_ptr, w_ptr, ids_ptr, E, stride_l, min_sum,
                  K: tl.constexpr, KP: tl.constexpr, BLOCK_E: tl.constexpr, NORMALIZE: tl.constexpr,
                  PDL: tl.constexpr):
    row = tl.program_id(0)
    pdl.wait(PDL)
    offs = tl.arange(0, BLOCK_E)
    ok = offs < E
    x = tl.load(logits_ptr + row * stride_l + offs, mask=ok, other=float("-inf")).to(tl.float32)
    e = tl.where(ok, tl.exp(x - tl.max(x, 0)), 0.0)
    p = e / tl.sum(e, 0)
    # probabilities are >= 0: a padded lane (-1) is never chosen. A NaN (an inf or NaN logit)
    # ranks above every number, as in torch.topk: the chosen ids stay experts of the layer (a
    # NaN maximum would otherwise match no lane and give id BLOCK_E, which the expert GEMVs
    # would read past their weights), and its weight stays NaN.
    cand = tl.where(ok, tl.where(p != p, 2.0, p), -1.0)
    slot = tl.arange(0, KP)
    w = tl.zeros([KP], dtype=tl.float32)
    ids = tl.zeros([KP], dtype=tl.int64)
    for s in tl.static_range(K):
        best = tl.max(cand, 0)
        idx = tl.min(tl.where(cand == best, offs, BLOCK_E), 0)
        w = tl.where(slot == s, tl.where(best > 1.5, float("nan"), best), w)
        ids = tl.where(slot == s, idx.to(tl.int64), ids)
        cand = tl.where(offs == idx, -1.0, cand)
    if NORMALIZE:
        w = w / tl.maximum(tl.sum(w, 0), min_sum)
    keep = slot < K
    tl.store(w_ptr + row * K + slot, w, mask=keep)
    tl.store(ids_ptr + row * K + slot, ids, mask=keep)


def moe_route(logits: torch.Tensor, k: int, normalize: bool, min_sum: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (n, k) fp32, ids (n, k) int64) for router logits (n, n_experts), as route_softmax."""
    if logits.ndim != 2 or not 1 <= k <= logits.shape[1]:
        raise ValueError(f"moe_route: logits of shape {tuple(logits.shape)} cannot give the top {k}.")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    n, n_experts = logits.shape
    weights = torch.empty((n, k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((n, k), dtype=torch.int64, device=logits.device)
    if n:
        _route_kernel[(n,)](logits, weights, ids, n_experts, logits.stride(0), min_sum,
                            K=k, KP=triton.next_power_of_2(k), BLOCK_E=triton.next_power_of_2(n_experts),
                            NORMALIZE=normalize, num_warps=1 if n_experts <= 256 else 4, **pdl.launch(logits.device))
    return weights, ids
