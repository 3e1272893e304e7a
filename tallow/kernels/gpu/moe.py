"""Routed experts on an NVIDIA GPU: each projection of a layer's experts kept stacked as the GGUF
stores it, the chosen experts found on the device.

Decode and short chunks (at most GEMV_MAX_ROWS tokens): one Triton launch per projection over all
(token, slot) pairs (kernels/triton/moe_gemv.py); routing, the per-expert scales and the weighted
sum are device ops, so nothing waits for the host and the step is captured in the decode graph.

Prefill: the pairs sorted by expert on the device; each projection's stacked weight dequantized
to bf16 in one launch into the shared scratch, and one grouped tensor-core product over all
experts (torch._grouped_mm, rows of expert e between offsets[e-1] and offsets[e]): no host sync,
so a prefill chunk is captured in its CUDA graph too (engine/graphs.PrefillGraphs). Where torch
lacks it, or the weight is a dense float type, one product per chosen expert (a host sync), or,
inside a graph capture, the decode path 8 tokens at a time.

The combination is the CPU bank's (kernels/cpu/moe.py): expert outputs scaled by the per-expert
output scale and the routing weight, summed over the slots (one batched product here).

By default the plane types and NVFP4 take the integer-dot GEMV instead
(kernels/triton/moe_mmvq.py): x quantized to Q8_1 once per projection -- the GLU before down
folded into that quantization -- and llama.cpp's MMVQ arithmetic over the chosen experts.

Switches: TALLOW_MOE_MMVQ=0 takes the fp32 expert GEMV for every type; TALLOW_MOE_SCALE_FOLD=0 applies
the per-expert scales by torch ops instead of in the integer-dot launches; TALLOW_MOE_TRITON=0 replaces the Triton GEMV by the torch reference (the chosen experts'
matrices gathered and dequantized in torch, fp32 products), for every chunk size;
TALLOW_MOE_GROUPED=0 runs a prefill chunk through the decode path, GEMV_MAX_ROWS tokens at a time.

Since session 17 the prefill of Q4_K / Q6_K / Q8_0 / NVFP4 experts takes moe_grouped
(kernels/triton/moe_grouped.py) instead: one launch per projection over the pairs sorted by
expert, each touched expert's quantized bytes read once and its bf16 tiles rebuilt in registers for
the tensor cores (the same bf16 weights and activations as the dequantize-all path, fp32 sums);
TALLOW_MOE_GROUPED_PREFILL=0 takes the dequantize-all path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ... import switches
from ...gguf_file import TensorInfo
from ...quant.reference import dequantize
from ..block_ops import LazyInput
from ..triton.dequant import dequantize_to
from ..cpu import moe as cpu_moe
from ..triton.mmvq import quantize_q8_1
from ..triton.moe_gemv import ExpertWeights, fp4_dequantize_to, moe_gemv, moe_gemv_reference
from ..triton.moe_grouped import group_pairs, grouped_block_m, moe_grouped, moe_grouped_ok
from ..triton.moe_mmvq import moe_mmvq, moe_mmvq_ok
from ..triton.moe_route import moe_route
from ..triton.planes import QTYPES, pack_planes
from ..triton.quant_gemv import SUPPORTED as GEMV_TYPES

__all__ = ["stack_experts", "GPUExpertBank", "triton_enabled"]

GEMV_MAX_ROWS = 8  # tokens per chunk of the pair path (as gpu/linear.py's GEMV)
FP4_TYPES = (39, 40)


def triton_enabled() -> bool:
    return switches.enabled("TALLOW_MOE_TRITON")


def stackable(tensors: list[TensorInfo]) -> bool:
    """Whether these expert tensors (gate and up) can be one stacked weight: one type with a kernel."""
    q = {int(t.qtype) for t in tensors}
    return len(q) == 1 and (next(iter(q)) in FP4_TYPES or (next(iter(q)) in QTYPES and QTYPES[next(iter(q))][0] in GEMV_TYPES))


def stack_experts(tensors: list[TensorInfo], n_experts: int, device: torch.device) -> ExpertWeights:
    """The tensors (3-D, [K, rows_i, n_experts], one quant type) as one weight whose expert e is
    the rows of every tensor's expert e in turn (gate then up), uploaded to `device`."""
    k = tensors[0].n_cols
    rows = sum(t.shape[1] for t in tensors)
    qtype = int(tensors[0].qtype)
    if stackable(tensors):
        parts = [np.asarray(t.data).reshape(n_experts, t.shape[1], -1) for t in tensors]
        raw = np.concatenate(parts, axis=1) if len(parts) > 1 else np.array(parts[0])  # a writable copy
        raw = torch.from_numpy(raw.reshape(n_experts * rows, -1)).to(device)
        if qtype in FP4_TYPES:
            return ExpertWeights(n_experts, rows, k, raw=raw, qtype=qtype)
        return ExpertWeights(n_experts, rows, k, planes=pack_planes(raw, qtype, k), qtype=qtype)
    dtype = torch.float32 if qtype in (0, 1) else torch.bfloat16  # as GPULinear's dense fallback
    dense = [dequantize(t.data, t.qtype, k).reshape(n_experts, t.shape[1], k).to(dtype) for t in tensors]
    return ExpertWeights(n_experts, rows, k, dense=torch.cat(dense, dim=1).to(device), qtype=qtype)


_GROUPED_MM: dict = {}  # device -> whether torch._grouped_mm ran there (a private op: checked once)


def _grouped_mm_available(device: torch.device) -> bool:
    """torch._grouped_mm exists and runs on this device (bf16, offsets int32): tried once on a tiny
    product against a per-group matmul; otherwise the per-expert loop."""
    ok = _GROUPED_MM.get(device)
    if ok is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False  # not probed yet, and no probe can run inside a capture: the safe path
        ok = False
        if hasattr(torch, "_grouped_mm"):
            try:
                a = torch.randn(5, 16, device=device).bfloat16()
                b = torch.randn(2, 16, 16, device=device).bfloat16()
                offs = torch.tensor([2, 5], dtype=torch.int32, device=device)
                y = torch._grouped_mm(a, b.transpose(1, 2), offs=offs)
                ref = torch.cat([a[:2] @ b[0].T, a[2:] @ b[1].T]).float()
                ok = bool(torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2))
                if ok and device.type == "cuda":  # and it must be capturable (prefill graphs)
                    stream = torch.cuda.Stream(device)
                    stream.wait_stream(torch.cuda.current_stream(device))
                    with torch.cuda.stream(stream):
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph, stream=stream):
                            torch._grouped_mm(a, b.transpose(1, 2), offs=offs)
                    torch.cuda.current_stream(device).wait_stream(stream)
            except (RuntimeError, NotImplementedError, TypeError):
                ok = False
        _GROUPED_MM[device] = ok
    return ok


class GPUExpertBank:
    """The routed experts of one layer on the GPU: gate/up as one or two stacked weights (outputs
    side by side, (pairs, 2 * width)), down as one; per-expert scales as the CPU bank's."""

    def __init__(self, gate_up: list[ExpertWeights], down: ExpertWeights, out_scale: torch.Tensor | None,
                 gate_up_scale: torch.Tensor | None, scratch):
        self.gate_up, self.down = gate_up, down
        self.out_scale, self.gate_up_scale = out_scale, gate_up_scale
        self.n_experts = down.n_experts
        self.dim = down.rows
        self.width2 = sum(w.rows for w in gate_up)
        self.scratch = scratch
        for w in (*gate_up, down):
            if w.has_kernel:
                scratch.reserve(w.n_experts * w.rows * w.k)  # the grouped prefill's dequantized stack
        self.kind = "+".join(["routed", *sorted({w.kind for w in (*gate_up, down)})])
        # the per-expert scales as the integer-dot launches take them (n_experts, parts): applied
        # there, they cost no gather-and-multiply launches of their own
        self._gate_up_scales = None
        if gate_up_scale is not None:
            self._gate_up_scales = ([gate_up_scale.float().contiguous()] if len(gate_up) == 1 else
                                    [gate_up_scale[:, i : i + 1].float().contiguous() for i in range(len(gate_up))])
        self._out_scale = None if out_scale is None else out_scale.float().reshape(-1, 1).contiguous()

    @property
    def nbytes(self) -> int:
        scale = sum(t.numel() * t.element_size() for t in (self.out_scale, self.gate_up_scale) if t is not None)
        return sum(w.nbytes for w in self.gate_up) + self.down.nbytes + scale

    def linears(self) -> list:
        return []

    # -- the pair path (decode) ---------------------------------------------------------------
    def _project(self, w: ExpertWeights, x: torch.Tensor, ids: torch.Tensor, x_div: int, out: torch.Tensor) -> None:
        if w.has_kernel and triton_enabled():
            moe_gemv(x, w, ids, x_div, out=out)
        else:
            out.copy_(moe_gemv_reference(x, w, ids, x_div))

    def _scale_gate_up(self, gu: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.gate_up_scale is None:  # llama.cpp scales the product's output, before the GLU
            return gu
        m, parts = gu.shape[0], self.gate_up_scale.shape[1]
        return (gu.view(m, parts, -1) * self.gate_up_scale[ids].view(m, parts, 1)).view(m, -1)

    def _mmvq(self, w: ExpertWeights) -> bool:
        return moe_mmvq_ok(w) and triton_enabled() and switches.enabled("TALLOW_MOE_MMVQ")

    def _pairs(self, h: torch.Tensor, ids: torch.Tensor, glu: Callable) -> tuple[torch.Tensor, bool]:
        """(n * k, dim) fp32: every (token, slot) pair's expert output, in pair order; and whether
        the per-expert output scale is already applied (by the integer-dot down launch)."""
        n, k = ids.shape
        flat = ids.reshape(-1)
        gu = torch.empty((n * k, self.width2), dtype=torch.float32, device=h.device)
        col = 0
        hq = {}  # h's Q8_1 blocks by code order (NVFP4's or natural), quantized once
        fold_on = switches.enabled("TALLOW_MOE_SCALE_FOLD")
        fold = fold_on and self._gate_up_scales is not None and all(self._mmvq(w) for w in self.gate_up)
        for i, w in enumerate(self.gate_up):
            if self._mmvq(w):
                nv = w.raw is not None
                if nv not in hq:
                    hq[nv] = quantize_q8_1(h, nv_order=nv)
                moe_mmvq(hq[nv], w, flat, k, out=gu[:, col : col + w.rows], scale=self._gate_up_scales[i] if fold else None)
            else:
                self._project(w, h, flat, k, gu[:, col : col + w.rows])
            col += w.rows
        a = glu(gu if fold else self._scale_gate_up(gu, flat))
        y = torch.empty((n * k, self.dim), dtype=torch.float32, device=h.device)
        if self._mmvq(self.down):
            # a lazy GLU is applied by the quantization itself: no GLU launch
            nv = self.down.raw is not None
            aq = (quantize_q8_1(a.x, prologue=a.take(), nv_order=nv) if isinstance(a, LazyInput)
                  else quantize_q8_1(a, nv_order=nv))
            out_scale = self._out_scale if fold_on else None
            moe_mmvq(aq, self.down, flat, 1, out=y, scale=out_scale)
            return y, out_scale is not None
        if isinstance(a, LazyInput):
            a = a.materialize()
        self._project(self.down, a, flat, 1, y)
        return y, False

    # -- the grouped path (prefill) -----------------------------------------------------------
    def _dense_stack(self, w: ExpertWeights) -> torch.Tensor:
        """(n_experts, rows, k) bf16: the stacked weight dequantized into the scratch (or its dense copy)."""
        if w.dense is not None:
            return w.dense
        out = self.scratch.view(w.n_experts * w.rows, w.k)
        if w.planes is not None:
            dequantize_to(w.planes, torch.bfloat16, out=out)
        else:
            fp4_dequantize_to(w.raw, w.qtype, w.k, out)
        return out.view(w.n_experts, w.rows, w.k)

    def _grouped_product(self, w: ExpertWeights, xs: torch.Tensor, offsets: torch.Tensor, counts: list[int] | None,
                         out: torch.Tensor) -> None:
        """out (pairs sorted by expert, rows) = each pair's row of xs times its expert's matrix."""
        stack = self._dense_stack(w)
        if counts is None:
            out.copy_(torch._grouped_mm(xs.to(stack.dtype), stack.transpose(1, 2), offs=offsets))
            return
        start = 0
        for e, c in enumerate(counts):
            if c:
                out[start : start + c] = torch.matmul(xs[start : start + c].to(stack.dtype), stack[e].T).float()
            start += c

    def _grouped_on_device(self, device: torch.device) -> bool:
        """Whether the grouped path runs without a host sync: the grouped tensor-core kernel for
        every weight, or every weight dequantizable in one launch and torch._grouped_mm working here."""
        return self._fused() or (all(w.has_kernel for w in (*self.gate_up, self.down)) and _grouped_mm_available(device))

    def _fused(self) -> bool:
        """Whether the prefill takes moe_grouped (only the touched experts' quantized bytes, read once)."""
        return (all(moe_grouped_ok(w) for w in (*self.gate_up, self.down)) and triton_enabled()
                and switches.enabled("TALLOW_MOE_GROUPED_PREFILL"))

    def _grouped_fused(self, h: torch.Tensor, ids: torch.Tensor, glu: Callable) -> tuple[torch.Tensor, bool]:
        """The grouped prefill through moe_grouped: x gathered in expert order and rounded to bf16
        (one launch), gate/up rows in that order, the GLU on them, down's rows written back in pair
        order. Returns (pairs' outputs in pair order, whether the per-expert output scale is applied)."""
        n, k = ids.shape
        flat = ids.reshape(-1)
        plans: dict[int, object] = {}  # pairs a block -> the block table (the sort is the same for every size)

        def plan(w):
            bm = grouped_block_m(w, n * k, self.n_experts)
            if bm not in plans:
                plans[bm] = group_pairs(flat, self.n_experts, bm)
            return plans[bm]

        gp = plan(self.gate_up[0])
        xs = h.index_select(0, gp.order // k).bfloat16()
        fold = switches.enabled("TALLOW_MOE_SCALE_FOLD")
        gu = torch.empty((n * k, self.width2), dtype=torch.float32, device=h.device)
        col = 0
        for i, w in enumerate(self.gate_up):
            scale = self._gate_up_scales[i] if fold and self._gate_up_scales is not None else None
            moe_grouped(xs, w, plan(w), 1, gu[:, col : col + w.rows], gather=False, scatter=False, scale=scale)
            col += w.rows
        a = glu(gu if fold else self._scale_gate_up(gu, flat[gp.order]))
        if isinstance(a, LazyInput):
            a = a.materialize()
        y = torch.empty((n * k, self.dim), dtype=torch.float32, device=h.device)
        out_scale = self._out_scale if fold else None
        moe_grouped(a.bfloat16(), self.down, plan(self.down), 1, y, gather=False, scatter=True, scale=out_scale)
        return y, out_scale is not None

    def _grouped(self, h: torch.Tensor, ids: torch.Tensor, glu: Callable) -> torch.Tensor:
        n, k = ids.shape
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # pairs grouped by expert, in pair order within one
        sorted_ids = flat[order]
        # (torch.bincount reads its input's max on the host: a sync a prefill graph cannot capture)
        counts_t = torch.zeros(self.n_experts, dtype=torch.int64, device=h.device).index_add_(0, flat, torch.ones_like(flat))
        offsets = torch.cumsum(counts_t, 0).to(torch.int32)
        counts = None if self._grouped_on_device(h.device) else counts_t.tolist()  # a host sync
        xs = h.index_select(0, order // k).bfloat16()
        gu = torch.empty((n * k, self.width2), dtype=torch.float32, device=h.device)
        col = 0
        for w in self.gate_up:
            self._grouped_product(w, xs, offsets, counts, gu[:, col : col + w.rows])
            col += w.rows
        a = glu(self._scale_gate_up(gu, sorted_ids))
        if isinstance(a, LazyInput):
            a = a.materialize()
        y_sorted = torch.empty((n * k, self.dim), dtype=torch.float32, device=h.device)
        self._grouped_product(self.down, a.bfloat16(), offsets, counts, y_sorted)
        return torch.empty_like(y_sorted).index_copy_(0, order, y_sorted)

    def route(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """route_softmax's (weights, ids) in one launch (TALLOW_MOE_ROUTE_TRITON=0: in torch)."""
        if logits.is_cuda and switches.enabled("TALLOW_MOE_ROUTE_TRITON"):
            return moe_route(logits.float(), k, True, cpu_moe.MIN_WEIGHT_SUM)
        return cpu_moe.route_softmax(logits, k)

    def __call__(self, h: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, glu: Callable) -> torch.Tensor:
        """sum over slots s of weights[:, s] * scale[e] * expert_e(h) for e = ids[:, s]; h (n, dim)
        fp32, ids/weights (n, k) on the device. Returns (n, dim) fp32."""
        if isinstance(h, LazyInput):
            h = h.materialize()
        n, k = ids.shape
        grouped = n > GEMV_MAX_ROWS and switches.enabled("TALLOW_MOE_GROUPED") and triton_enabled()
        if grouped and not self._grouped_on_device(h.device) and h.is_cuda and torch.cuda.is_current_stream_capturing():
            grouped = False  # a prefill graph cannot wait for the per-expert loop's host sync: the pair path
        scaled = False
        if not grouped:
            if n <= GEMV_MAX_ROWS:
                out, scaled = self._pairs(h, ids, glu)
            else:
                parts = [self._pairs(h[t : t + GEMV_MAX_ROWS], ids[t : t + GEMV_MAX_ROWS], glu) for t in range(0, n, GEMV_MAX_ROWS)]
                out, scaled = torch.cat([p[0] for p in parts]), parts[0][1]
        elif self._fused():
            out, scaled = self._grouped_fused(h.contiguous(), ids, glu)
        else:
            out = self._grouped(h, ids, glu)
        out = out.view(n, k, self.dim)
        if self.out_scale is not None and not scaled:  # llama.cpp scales the expert's output, then weights it
            weights = weights * self.out_scale[ids]
        # The weighted sum over the k slots as one batched (1 x k) @ (k x dim) product: one launch
        # where the CPU bank's slot-order adds are 2k (a decode step is launch-bound); fp32 (no
        # TF32), so only the order of the k additions differs.
        return torch.bmm(weights.unsqueeze(1).float(), out).squeeze(1)
