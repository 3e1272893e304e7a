"""Several linear layers over the same input as one matrix product: Q/K/V, gate/up.

At batch 1 every product is one aten call with ~10-20 µs of fixed cost (dispatch, thread
fork/join, bf16 conversion of the input and fp32 conversion of the output); stacking the
weights along N pays it once. A `FusedLinear` behaves like one `Linear` whose output is the
parts' outputs side by side, so a model slices q/k/v (or gate/up) out of one tensor.

Parts are stacked when their storage allows it: the same kind (int4 with int4, int8 with
int8 — the GGUF types may differ, e.g. gemma's Q5_0 Q/K with a Q8_0 V, all int8 per row),
the same K, and for int4 every part but the last a whole number of the packer's 64-row
blocks (tinygemm's packed layout interleaves rows within 64-row blocks, so packed blocks
concatenate exactly). Parts that cannot stack run as separate products, consecutive ones
grouped (qwen2.5's layers with a Q6_K V: one int4 product for Q+K, one int8 for V).
Each output row is computed exactly as in the separate layer (same kernel, same K order),
so fusing changes no number (tests/test_cpu_fastpaths.py).

TALLOW_FUSE=0 (read at construction) keeps every part its own product.
"""

from __future__ import annotations


import torch

from .linear import DenseLinear, Int4Linear, Int8Linear, Linear, ReferenceLinear
from ... import switches

__all__ = ["FusedLinear", "fusion_enabled"]

_PACK_BLOCK_ROWS = 64  # _convert_weight_to_int4pack_for_cpu interleaves rows within 64-row blocks


def fusion_enabled() -> bool:
    return switches.enabled("TALLOW_FUSE")


def _can_follow(run: list[Linear], nxt: Linear) -> bool:
    """Whether `nxt` can be stacked below the layers of `run` in one weight."""
    prev = run[-1]
    from .ggml_dot import GgmlDotLinear

    if type(prev) is GgmlDotLinear and type(nxt) is GgmlDotLinear:
        return len(run) < 8 and bool(prev.fallback) == bool(nxt.fallback)  # ggml_dot.MAX_PARTS
    if type(prev) is not type(nxt) or prev.kind != nxt.kind or prev.in_features != nxt.in_features:
        return False
    if isinstance(prev, Int4Linear):
        return (not prev._padded and prev.packed.shape[0] % _PACK_BLOCK_ROWS == 0
                and prev.k_parts == nxt.k_parts)
    if isinstance(prev, (DenseLinear, ReferenceLinear)):
        return prev.weight.dtype == nxt.weight.dtype
    return isinstance(prev, Int8Linear)


def _stacked_bias(parts: list[Linear]) -> torch.Tensor | None:
    if all(p.bias is None for p in parts):
        return None
    return torch.cat([p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts]).contiguous()


def _stack(parts: list[Linear]) -> Linear:
    """One layer equal to `parts` stacked along N (parts already checked with `_can_follow`)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    from .ggml_dot import GgmlDotGroup, GgmlDotLinear

    if isinstance(first, GgmlDotLinear):
        return GgmlDotGroup(parts)  # one C call: the input quantized once, one parallel region
    out = object.__new__(type(first))
    n = sum(p.out_features for p in parts)
    Linear.__init__(out, "+".join(p.name for p in parts), first.in_features, n, _stacked_bias(parts))
    out.kind = first.kind
    if isinstance(first, Int4Linear):
        out.packed = torch.cat([p.packed for p in parts], dim=0).contiguous()  # (N_pad, K*parts/2)
        out.scales_and_zeros = torch.cat([p.scales_and_zeros for p in parts], dim=1).contiguous()  # (G, N_pad, 2)
        out.k_parts = first.k_parts
        out._padded = out.packed.shape[0] != n
    elif isinstance(first, Int8Linear):
        out.weight = torch.cat([p.weight for p in parts], dim=0).contiguous()  # int8 (N, K)
        out.scales = torch.cat([p.scales for p in parts], dim=0).contiguous()  # bf16 (N,)
    else:  # DenseLinear / ReferenceLinear
        out.weight = torch.cat([p.weight for p in parts], dim=0).contiguous()
        if isinstance(first, DenseLinear):
            out.dtype = first.dtype
            out.compute_dtype = first.compute_dtype
    return out


class FusedLinear(Linear):
    """The parts' outputs side by side: y = x @ [W_1; W_2; ...]^T (+ [b_1; b_2; ...])."""

    kind = "fused"

    def __init__(self, parts: list[Linear], fuse: bool | None = None):
        if not parts:
            raise ValueError("FusedLinear needs at least one part")
        k = parts[0].in_features
        if any(p.in_features != k for p in parts):
            raise ValueError("the parts of a FusedLinear must share their input size: "
                             + ", ".join(f"{p.name} {p.in_features}" for p in parts))
        fuse = fusion_enabled() if fuse is None else fuse
        runs: list[list[Linear]] = []
        for p in parts:
            if fuse and runs and _can_follow(runs[-1], p):
                runs[-1].append(p)
            else:
                runs.append([p])
        super().__init__("+".join(p.name for p in parts), k, sum(p.out_features for p in parts), None)
        self.part_sizes = [p.out_features for p in parts]
        self.runs: list[Linear] = [_stack(r) for r in runs]
        self.kind = "+".join(r.kind for r in self.runs) if len(self.runs) > 1 else self.runs[0].kind
        # Several runs with one input dtype share its conversion; their biases are added once.
        self._shared = len(self.runs) > 1 and len({r.compute_dtype for r in self.runs}) == 1
        self._bias_all = _stacked_bias(self.runs) if self._shared else None

    def _tensors(self) -> list[torch.Tensor]:
        shared_bias = [self._bias_all] if self._bias_all is not None else []
        return [t for r in self.runs for t in r._tensors()] + shared_bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.runs) == 1:
            return self.runs[0](x)
        lead = x.shape[:-1]
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)  # (M, K)
        if self._shared:
            xc = x2.to(self.runs[0].compute_dtype).contiguous()
            y = torch.cat([r._mm_native(xc) for r in self.runs], dim=-1).float()  # (M, N)
            if self._bias_all is not None:
                y = y + self._bias_all
        else:
            y = torch.cat([r(x2) for r in self.runs], dim=-1)
        return y if x.dim() == 2 else y.reshape(*lead, self.out_features)
