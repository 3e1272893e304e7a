"""The kernel test harness's registry: every kernel implementation under tallow/kernels/ with its
reference, shapes, dtypes and tolerance (tests/test_kernels.py runs them all and fails when a
kernel module defines an implementation that is neither registered here nor named below).

A case: `inputs(shape, dtype, generator)` builds the arguments, `run` and `reference` map them
to tensors, and the error bound is norm-wise relative (||y - ref|| / ||ref||), elementwise
(|y - ref| <= tol * |ref| + tol * 1e-3) or exact (tol 0). Triton cases run under Triton's
interpreter on the CPU (TRITON_INTERPRET=1), on small shapes.

Tolerances (moved here with their cases; the reasons are the old files'):
- rmsnorm, SwiGLU: a few fp32 operations per element in the reference's order: 1e-6 (a wrong
  index or a missed residual gives > 1e-2).
- GeGLU rounds to fp16 twice as ggml does, and the kernel's exp-based tanh may cross an fp16
  rounding boundary where torch's does not: one fp16 ulp (1e-3) per element.
- argmax, dequantize_to fp16: exact (the dense weight is the reference rounded to fp16).
- quant_gemv: fp32 accumulation of exactly dequantized weights: 2e-6.
- CPU linears: bf16 activations in and out (two roundings, ~3e-3 RMS): 1e-2; per-row int8 adds
  its requantization error of the weight (1.5x its relative Frobenius error).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Case:
    op: str
    impl: str  # "module:name" of the implementation under test
    run: Callable[[dict], torch.Tensor]
    reference: Callable[[dict], torch.Tensor]
    inputs: Callable[[tuple, torch.dtype, torch.Generator], dict]
    shapes: tuple[tuple, ...]
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    tol: float | Callable[[dict], float] = 0.0
    metric: str = "norm"  # "norm" | "elementwise" | "exact"
    needs: str = ""  # "triton": skipped without it; "int4ops"/"int8ops": without torch's packed-weight ops

    def params(self) -> list[tuple["Case", tuple, torch.dtype]]:
        return [(self, s, d) for s in self.shapes for d in self.dtypes]

    def seed(self, shape: tuple, dtype: torch.dtype) -> torch.Generator:
        return torch.Generator().manual_seed(zlib.crc32(f"{self.impl}{shape}{dtype}".encode()))


CASES: list[Case] = []


def register(**fields: Any) -> None:
    CASES.append(Case(**fields))


# ---------------------------------------------------------------- Triton (interpreter on the CPU)

def _triton(module: str, name: str):
    import importlib

    import tallow.kernels.triton  # noqa: F401  (applies the interpreter shim)

    return getattr(importlib.import_module(f"tallow.kernels.triton.{module}"), name)


def _rmsnorm_inputs(shape, dtype, g):
    m, d, residual = shape
    return {"x": torch.randn(m, d, generator=g, dtype=dtype), "w": torch.randn(d, generator=g, dtype=dtype),
            "r": torch.randn(m, d, generator=g, dtype=dtype) if residual else None}


register(op="rmsnorm", impl="tallow.kernels.triton.rmsnorm:rmsnorm", needs="triton",
         inputs=_rmsnorm_inputs, shapes=((1, 576, False), (2, 1536, True), (3, 2560, True)), tol=1e-6,
         run=lambda a: _triton("rmsnorm", "rmsnorm")(a["x"], a["w"], 1e-6, residual=a["r"]),
         reference=lambda a: _triton("rmsnorm", "rmsnorm_reference")(a["x"], a["w"], 1e-6, a["r"])[0])


def _rmsnorm_add_inputs(shape, dtype, g):
    m, d, scaled, norm2 = shape
    return {"x": torch.randn(m, d, generator=g, dtype=dtype), "w": torch.randn(d, generator=g, dtype=dtype),
            "r": torch.randn(m, d, generator=g, dtype=dtype), "s": torch.rand(1, generator=g, dtype=dtype) if scaled else None,
            "w2": torch.randn(d, generator=g, dtype=dtype) if norm2 else None}


def _cat(y):
    return torch.cat(y, -1) if isinstance(y, tuple) else y


register(op="rmsnorm_add", impl="tallow.kernels.triton.rmsnorm:rmsnorm_add", needs="triton",
         inputs=_rmsnorm_add_inputs, shapes=((1, 1536, True, False), (2, 640, False, False), (2, 1536, False, True)),
         tol=1e-6,
         run=lambda a: _cat(_triton("rmsnorm", "rmsnorm_add")(a["x"], a["w"], 1e-6, a["r"], a["s"], next_weight=a["w2"])),
         reference=lambda a: _cat(_triton("rmsnorm", "rmsnorm_add_reference")(a["x"], a["w"], 1e-6, a["r"], a["s"], a["w2"])))


def _glu_inputs(shape, dtype, g):
    m, f = shape
    gate_up = torch.randn(m, 2 * f, generator=g, dtype=dtype) * 3
    return {"gate": gate_up[:, :f], "up": gate_up[:, f:]}  # strided views of one gate_up output, as the model has them


for _kind, _tol, _metric in (("swiglu", 1e-6, "norm"), ("geglu", 1e-3, "elementwise")):
    register(op=f"glu:{_kind}", impl=f"tallow.kernels.triton.glu:{_kind}", needs="triton",
             inputs=_glu_inputs, shapes=((2, 1536), (1, 1000)), tol=_tol, metric=_metric,
             run=lambda a, k=_kind: _triton("glu", k)(a["gate"], a["up"]),
             reference=lambda a, k=_kind: _triton("glu", "glu_reference")(a["gate"], a["up"], k))
register(op="glu", impl="tallow.kernels.triton.glu:glu", needs="triton",
         inputs=_glu_inputs, shapes=((2, 256),), tol=1e-6,
         run=lambda a: _triton("glu", "glu")(a["gate"], a["up"], "swiglu"),
         reference=lambda a: _triton("glu", "glu_reference")(a["gate"], a["up"], "swiglu"))


def _argmax_inputs(shape, dtype, g):
    x = torch.randn(*shape, generator=g, dtype=dtype)
    x.view(-1, shape[-1])[0, shape[-1] // 3] = x.view(-1, shape[-1])[0, 7] = 50.0  # a tie: the lower index wins
    return {"x": x}


def _route_inputs(shape, dtype, g):
    """Router logits (tokens, n_experts). (Exact ties: the kernel puts the lower id first, torch.topk
    in an order of its own, so none here.)"""
    n, n_exp, k = shape
    return {"logits": torch.randn(n, n_exp, generator=g), "k": k}


def _routed(a, triton_kernel: bool):
    """weights then expert ids side by side: a different expert is an error of >= 1 in an id column."""
    from tallow.kernels.cpu.moe import MIN_WEIGHT_SUM, route_softmax

    if triton_kernel:
        weights, ids = _triton("moe_route", "moe_route")(a["logits"], a["k"], True, MIN_WEIGHT_SUM)
    else:
        weights, ids = route_softmax(a["logits"], a["k"])
    return torch.cat([weights, ids.float()], -1)


register(op="moe_route", impl="tallow.kernels.triton.moe_route:moe_route", needs="triton", tol=1e-6,
         metric="elementwise", inputs=_route_inputs, shapes=((3, 128, 8), (2, 8, 2), (1, 60, 4)),
         run=lambda a: _routed(a, True), reference=lambda a: _routed(a, False))

register(op="argmax", impl="tallow.kernels.triton.argmax:argmax", needs="triton", metric="exact",
         inputs=_argmax_inputs, shapes=((2, 4099), (1, 1000)),  # a vocabulary-sized row: tests/test_triton_ops.py
         run=lambda a: _triton("argmax", "argmax")(a["x"], parts=64),
         reference=lambda a: _triton("argmax", "argmax_reference")(a["x"]))

def _fp4_inputs(shape, dtype, g):
    """FP4 weight bytes (random codes; MXFP4 exponents 120-125, NVFP4 scale bytes over their whole
    range but 0x80+ (bit 7 ignored) and the zeros 0 / 0x7F included) and x (M, K)."""
    qtype, n, k, m = shape
    block, size = {39: (32, 17), 40: (64, 36)}[qtype]
    raw = torch.randint(0, 256, (n * k // block, size), generator=g, dtype=torch.uint8)
    if qtype == 39:
        raw[:, 0] = torch.randint(120, 126, (raw.shape[0],), generator=g, dtype=torch.uint8)
    else:
        raw[:, :4] = torch.randint(0, 0x58, (raw.shape[0], 4), generator=g, dtype=torch.uint8)
        raw[0, 0], raw[0, 1], raw[1 % raw.shape[0], 2] = 0x7F, 0, 0xB8  # zero scales; bit 7 set
    return {"raw": raw.reshape(n, -1), "qtype": qtype, "x": torch.randn(m, k, generator=g)}


# fp32 accumulation of exactly decoded weights, like quant_gemv: 2e-6.
register(op="fp4_gemv", impl="tallow.kernels.triton.fp4_gemv:fp4_gemv", needs="triton", tol=2e-6,
         inputs=_fp4_inputs, shapes=((39, 40, 96, 1), (39, 16, 256, 3), (40, 33, 128, 1), (40, 16, 256, 2)),
         run=lambda a: _triton("fp4_gemv", "fp4_gemv")(a["x"], a["raw"], a["qtype"]),
         reference=lambda a: _triton("fp4_gemv", "fp4_gemv_reference")(a["x"], a["raw"], a["qtype"]))

_PLANE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")


def _plane_inputs(shape, dtype, g):
    name, n, k, m = shape
    planes = _triton("planes", "pack_planes")
    return {"w": planes(_triton("planes", "random_raw")(name, n, k, g), name, k), "x": torch.randn(m, k, generator=g)}


register(op="quant_gemv", impl="tallow.kernels.triton.quant_gemv:quant_gemv", needs="triton", tol=2e-6,
         inputs=_plane_inputs, shapes=tuple((t, n, k, m) for t in _PLANE_TYPES for n, k, m in ((16, 256, 1), (48, 512, 3))),
         run=lambda a: _triton("quant_gemv", "quant_gemv")(a["x"], a["w"], out=torch.full((a["x"].shape[0], a["w"].n), float("nan"))),  # poisoned: every element written
         reference=lambda a: _triton("quant_gemv", "quant_gemv_reference")(a["x"], a["w"]))


# The integer-dot GEMV (x quantized to Q8_1): against the float64 transcription of the same integer
# arithmetic, 1e-6 (fp32 combination of exact integer dots; tests/test_triton_mmvq.py holds the
# exact, Q8_1 and fp32-product bounds).
register(op="mmvq", impl="tallow.kernels.triton.mmvq:mmvq", needs="triton", tol=1e-6,
         inputs=_plane_inputs, shapes=tuple((t, 12, 512, 2) for t in ("Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0")),
         run=lambda a: _triton("mmvq", "mmvq")(a["x"], a["w"], out=torch.full((a["x"].shape[0], a["w"].n), float("nan"))),
         reference=lambda a: _triton("mmvq", "mmvq_reference")(a["x"], a["w"]))


def _moe_inputs(shape, dtype, g):
    """A stacked expert weight (n_experts * rows, k) of one type (a plane type, or FP4 39/40), the
    pairs' expert ids (repeats included) and x: one row per token (x_div = k slots) or per pair."""
    qtype, n_exp, rows, k, pairs, x_div = shape
    ew = _triton("moe_gemv", "ExpertWeights")
    if qtype in (39, 40):
        raw = _fp4_inputs((qtype, n_exp * rows, k, 1), dtype, g)["raw"]
        w = ew(n_exp, rows, k, raw=raw, qtype=qtype)
    else:
        raw = _triton("planes", "random_raw")(qtype, n_exp * rows, k, g)
        w = ew(n_exp, rows, k, planes=_triton("planes", "pack_planes")(raw, qtype, k))
    ids = torch.randint(0, n_exp, (pairs,), generator=g)
    ids[-1] = ids[0]  # one expert twice
    return {"w": w, "ids": ids, "x_div": x_div, "x": torch.randn(pairs // x_div, k, generator=g)}


# Per pair quant_gemv's (or fp4_gemv's) fp32 accumulation of exactly decoded weights: 2e-6.
register(op="moe_gemv", impl="tallow.kernels.triton.moe_gemv:moe_gemv", needs="triton", tol=2e-6,
         inputs=_moe_inputs, shapes=tuple((t, 4, 24, 256, 4, x) for t in _PLANE_TYPES for x in (1, 2))
         + ((39, 3, 20, 64, 4, 2), (40, 3, 20, 128, 2, 1)),
         run=lambda a: _triton("moe_gemv", "moe_gemv")(a["x"], a["w"], a["ids"], a["x_div"],
                                                        out=torch.full((a["ids"].numel(), a["w"].rows), float("nan"))),
         reference=lambda a: _triton("moe_gemv", "moe_gemv_reference")(a["x"], a["w"], a["ids"], a["x_div"]))
# The routed experts' integer-dot GEMV: per pair against mmvq_reference of the chosen expert's
# matrix and the pair's x row (float64, exact integer dots), 1e-6 as the mmvq case.
# NVFP4 (40): the kernel reads x's codes in nv_order, the reference in natural order.
def _moe_q8_inputs(shape, dtype, g):
    a = _moe_inputs(shape, dtype, g)
    a["xq"] = _triton("mmvq", "quantize_q8_1_reference")(a["x"])
    a["xq_run"] = a["xq"]
    # gate and up side by side (x per token) with the files' per-expert scales, applied in the launch
    a["scale"] = torch.rand(shape[1], 2, generator=g) + 0.5 if shape[-1] > 1 else None
    if shape[0] == 40:
        q = a["xq"]
        a["xq_run"] = type(q)(_triton("mmvq", "nv_order_reference")(q.qs), q.d, q.s, q.isum)
    return a


register(op="moe_mmvq", impl="tallow.kernels.triton.moe_mmvq:moe_mmvq", needs="triton", tol=1e-6,
         inputs=_moe_q8_inputs, shapes=tuple((t, 4, 24, 512, 4, x) for t in ("Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "Q5_0")
                                             for x in (1, 2)) + ((40, 3, 20, 256, 4, 2), (40, 3, 12, 192, 2, 1)),
         run=lambda a: _triton("moe_mmvq", "moe_mmvq")(a["xq_run"], a["w"], a["ids"], a["x_div"],
                                                        out=torch.full((a["ids"].numel(), a["w"].rows), float("nan")),
                                                        scale=a["scale"]),
         reference=lambda a: _triton("moe_mmvq", "moe_mmvq_reference")(a["xq"], a["w"], a["ids"], a["x_div"], a["scale"]))
# The routed experts' grouped prefill product (pairs sorted by expert, bf16 tiles rebuilt in
# registers, tensor-core sums): x and each weight rounded to bf16 as the reference does, so only
# the fp32 summation order differs; x gathered by token and the output scattered back to pair
# order in one launch (the bank uses each side alone: tests/test_moe_gpu.py).
def _moe_grouped_run(a):
    gp = _triton("moe_grouped", "group_pairs")(a["ids"], a["w"].n_experts, 16)
    out = torch.full((a["ids"].numel(), a["w"].rows), float("nan"))
    return _triton("moe_grouped", "moe_grouped")(a["x"], a["w"], gp, a["x_div"], out, True, True, scale=a["scale"])


def _moe_grouped_inputs(shape, dtype, g):
    a = _moe_inputs(shape, dtype, g)
    a["scale"] = torch.rand(shape[1], 2, generator=g) + 0.5 if shape[-1] > 1 else None
    return a


register(op="moe_grouped", impl="tallow.kernels.triton.moe_grouped:moe_grouped", needs="triton", tol=1e-6,
         inputs=_moe_grouped_inputs, shapes=(("Q4_K", 4, 24, 512, 21, 3), ("Q6_K", 3, 20, 256, 18, 1),
                                             ("Q8_0", 4, 24, 64, 40, 2), (40, 3, 20, 128, 20, 2)),
         run=_moe_grouped_run,
         reference=lambda a: _triton("moe_grouped", "moe_grouped_reference")(a["x"], a["w"], a["ids"], a["x_div"], a["scale"]))
# Every FP4 value times its scale is a bf16 number: exact.
register(op="fp4_dequantize_to", impl="tallow.kernels.triton.moe_gemv:fp4_dequantize_to", needs="triton",
         metric="exact", inputs=_fp4_inputs, shapes=((39, 20, 96, 1), (40, 17, 128, 1)),
         run=lambda a: _triton("moe_gemv", "fp4_dequantize_to")(a["raw"], a["qtype"], a["x"].shape[1],
                                                                 torch.full((a["raw"].shape[0], a["x"].shape[1]), float("nan"), dtype=torch.bfloat16)),
         reference=lambda a: _triton("moe_gemv", "fp4_dequantize_reference")(a["raw"], a["qtype"], a["x"].shape[1]).bfloat16())
register(op="dequantize_to", impl="tallow.kernels.triton.dequant:dequantize_to", needs="triton", metric="exact",
         inputs=_plane_inputs, shapes=tuple((t, 20, 512, 1) for t in _PLANE_TYPES),
         run=lambda a: _triton("dequant", "dequantize_to")(a["w"], torch.float16, block_n=8),
         reference=lambda a: _triton("planes", "dequantize_planes")(a["w"]).to(torch.float16))
register(op="scratch_matmul", impl="tallow.kernels.triton.dequant:scratch_matmul", needs="triton", tol=1e-5,
         inputs=_plane_inputs, shapes=(("Q4_K", 24, 256, 5),),
         run=lambda a: _triton("dequant", "scratch_matmul")(a["x"], a["w"], torch.empty(24 * 256 + 100)),
         reference=lambda a: a["x"] @ _triton("planes", "dequantize_planes")(a["w"]).T)


def _decode_attention_inputs(shape, dtype, g):
    n_heads, n_kv, d, n_slots, seq_len, window = shape
    return {"q": torch.randn(n_heads, d, generator=g), "k": torch.randn(n_kv, n_slots, d, generator=g).to(dtype),
            "v": torch.randn(n_kv, n_slots, d, generator=g).to(dtype), "seq_len": seq_len, "window": window,
            "scale": d ** -0.5}


register(op="decode_attention", impl="tallow.kernels.triton.decode_attention:decode_attention", needs="triton",
         inputs=_decode_attention_inputs, dtypes=(torch.float16,), tol=2e-3,  # the kernel rounds q to fp16
         # GQA 2:1 plain cache; MQA over a ring of 32 slots; gemma4 global heads of 512 (16 keys per step)
         shapes=((4, 2, 64, 96, 70, 0), (8, 1, 64, 32, 75, 24), (2, 1, 512, 48, 40, 0)),
         run=lambda a: _triton("decode_attention", "decode_attention")(
             a["q"], a["k"], a["v"], torch.tensor([a["seq_len"]], dtype=torch.int32), a["scale"], a["window"], n_splits=2),
         reference=lambda a: _triton("decode_attention", "decode_attention_reference")(
             a["q"], a["k"], a["v"], a["seq_len"], a["scale"], a["window"]))


# ---------------------------------------------------------------- CPU linears (torch's packed-weight ops)

def _linear_inputs(shape, dtype, g):
    from gguf import GGMLQuantizationType as QT

    from test_quant_reference import random_rows
    from tallow.gguf_file import TensorInfo

    qtype, mode, n, k, m = shape
    qt = QT[qtype]
    raw = random_rows(qt, n, k, zlib.crc32(f"{qtype}{n}{k}".encode()))
    return {"t": TensorInfo("w", qt, (k, n), 0, raw.nbytes, raw), "mode": mode, "x": torch.randn(m, k, generator=g)}


def _linear(a):
    from tallow.kernels.cpu.linear import make_linear

    return make_linear(a["t"], mode=a["mode"])


def _linear_tol(a) -> float:
    from tallow.quant.pack import repack_error

    if a["mode"] != "int8":
        return 1e-2
    return 1e-2 + 1.5 * repack_error(a["t"].data, a["t"].qtype, a["t"].n_cols, "int8").rel_fro


def _linear_reference(a):
    from tallow.kernels.cpu.linear import make_linear

    return make_linear(a["t"], mode="reference")(a["x"])


for _impl, _mode, _types, _needs in (("Int4Linear", "int4", ("Q4_0", "Q4_K"), "int4ops"),
                                     ("GroupInt8Linear", "int8g", ("Q6_K",), "int4ops"),
                                     ("Int8Linear", "int8", ("Q6_K", "Q8_0"), "int8ops"),
                                     ("DenseLinear", "dense", ("Q4_K",), "")):
    # decode rows (1, 3); prefill (>= dequant_matmul.MIN_ROWS rows) is the *_dequant_mm cases below
    register(op=f"linear:{_mode}", impl=f"tallow.kernels.cpu.linear:{_impl}", needs=_needs, tol=_linear_tol,
             inputs=_linear_inputs, shapes=tuple((t, _mode, 64, 256, m) for t, m in zip(_types, (1, 3))),
             run=lambda a, cls=_impl: _checked_kind(_linear(a), cls)(a["x"]), reference=_linear_reference)


# The C kernel (ggml_dot.c) against GgmlLinear: the same arithmetic over fp32 dequantized weights,
# differing only in float summation order (measured ~2e-7 relative); libggml-cpu's own outputs, bit
# for bit, are tests/test_ggml_dot.py's.
def _ggml_dot(a):
    from tallow.kernels.cpu.ggml_dot import GgmlDotLinear

    return GgmlDotLinear(a["t"])(a["x"])


def _ggml_fp32(a):
    from tallow.kernels.cpu.ggml_linear import GgmlLinear

    return GgmlLinear(a["t"])(a["x"])


register(op="linear:ggml_dot", impl="tallow.kernels.cpu.ggml_dot:GgmlDotLinear", needs="ggml_dot", tol=2e-6,
         inputs=_linear_inputs, shapes=(("Q4_K", "auto", 48, 512, 1), ("Q6_K", "auto", 40, 256, 2),
                                        ("Q4_1", "auto", 64, 256, 1), ("Q5_0", "auto", 64, 128, 3),
                                        ("Q8_0", "auto", 80, 64, 1)),
         run=_ggml_dot, reference=_ggml_fp32)


# Decode attention over an f16 cache in C (decode_attention.c) against torch's SDPA on the window copied
# to fp32 (the path it replaces): fp32 throughout in another order, ~1e-6 relative; shapes: (n_kv, heads,
# head_dim, positions, begin, end, softcap) — GQA, a window's begin, a softcap, E2B's 512-wide global heads.
def _f16_attention_inputs(shape, dtype, g):
    n_kv, heads, dim, n_ctx, begin, end, softcap = shape
    return {"q": torch.randn(1, heads, dim, generator=g), "k": torch.randn(n_kv, n_ctx, dim, generator=g).half(),
            "v": torch.randn(n_kv, n_ctx, dim, generator=g).half(), "begin": begin, "end": end, "softcap": softcap}


def _f16_attention_reference(a):
    from tallow.layers import attend_keys

    b, e = a["begin"], a["end"]
    return attend_keys(a["q"], a["k"][:, b:e].float(), a["v"][:, b:e].float(), 0.125, a["softcap"])


def _f16_attention(a):
    from tallow.kernels.cpu.c_attention import attend_f16

    return attend_f16(a["q"], a["k"], a["v"], a["begin"], a["end"], 0.125, a["softcap"])


register(op="attend_f16", impl="tallow.kernels.cpu.c_attention:attend_f16", needs="ggml_dot", tol=2e-5,
         inputs=_f16_attention_inputs, shapes=((2, 8, 64, 100, 3, 97, None), (4, 8, 128, 700, 0, 700, 30.0),
                                               (1, 8, 512, 2048, 1000, 2048, None), (1, 4, 256, 5, 0, 5, None)),
         run=_f16_attention, reference=_f16_attention_reference)


# TALLOW_NUMERICS=ggml's elementwise ops in C (ggml_ops.c) against their torch emulations in
# tallow/numerics.py, bit for bit (tests/test_ggml_numerics.py runs the portable C too).
def _ggml_ops():
    from tallow.kernels.cpu import ggml_ops

    return ggml_ops


def _ggml_norm_inputs(shape, dtype, g):
    rows, heads, n, add = shape  # heads > 0: a per-head weight (heads, n) over (rows, heads, n); add: x + delta first
    dims, w = ((rows, heads, n), torch.randn(heads, n, generator=g)) if heads else ((rows, n), torch.randn(n, generator=g))
    return {"x": torch.randn(*dims, generator=g) * 3, "w": w, "delta": torch.randn(*dims, generator=g) if add else None}


def _ggml_norm(a, c_ops: bool):
    """the norm, or with a delta the sum and the norm side by side"""
    if c_ops:
        out = _ggml_ops().rms_norm(a["x"], a["w"], 1e-6, a["delta"])
    else:
        from tallow.numerics import ggml_rms_norm

        x = a["x"] if a["delta"] is None else a["x"] + a["delta"]
        out = ggml_rms_norm(x, a["w"], 1e-6) if a["delta"] is None else (x, ggml_rms_norm(x, a["w"], 1e-6))
    return torch.cat(out, dim=-1) if isinstance(out, tuple) else out


register(op="ggml_rms_norm", impl="tallow.kernels.cpu.ggml_ops:rms_norm", needs="ggml_dot", metric="exact",
         inputs=_ggml_norm_inputs, shapes=((1, 0, 576, False), (5, 0, 1536, False), (3, 12, 64, False), (1, 0, 640, True),
                                           (4, 0, 1536, True)),
         run=lambda a: _ggml_norm(a, True), reference=lambda a: _ggml_norm(a, False))


def _ggml_rope_inputs(shape, dtype, g):
    from tallow.layers import RotaryTables

    n, heads, head_dim, rope_dim, style, at = shape
    table = RotaryTables(rope_dim, 10000.0, style)
    table.ggml = True  # ggml's angles and libm's cosf/sinf, whatever the environment
    table.ensure(at + n)
    qkv = torch.randn(n, (heads + 2) * head_dim, generator=g) * 4  # Q/K heads as a strided view, as in a block
    return {"x": qkv[:, : heads * head_dim].view(n, heads, head_dim), "table": table, "at": at}


def _ggml_rope(a, c_ops: bool):
    t, at, n = a["table"], a["at"], a["x"].shape[0]
    cos, sin = t.cos_full[at : at + n], t.sin_signed[at : at + n]
    if c_ops:
        return _ggml_ops().rope(a["x"], cos, sin, t.rope_dim, t.style == "neox")
    from tallow.numerics import ggml_rope_rotate

    rd = t.rope_dim
    rot = a["x"][..., :rd]
    pairs = (2, rd // 2) if t.style == "neox" else (rd // 2, 2)
    swapped = rot.unflatten(-1, pairs).flip(-2 if t.style == "neox" else -1).reshape(rot.shape)
    second = torch.arange(rd) >= rd // 2 if t.style == "neox" else torch.arange(rd) % 2 == 1
    return torch.cat((ggml_rope_rotate(rot, swapped, cos, sin, second), a["x"][..., rd:]), dim=-1)


register(op="ggml_rope", impl="tallow.kernels.cpu.ggml_ops:rope", needs="ggml_dot", metric="exact",
         inputs=_ggml_rope_inputs, shapes=((1, 12, 64, 64, "norm", 300), (4, 16, 128, 128, "neox", 5), (3, 4, 256, 256, "neox", 1000),
                                          (2, 8, 64, 32, "norm", 77)),
         run=lambda a: _ggml_rope(a, True), reference=lambda a: _ggml_rope(a, False))


def _cos_sin_inputs(shape, dtype, g):
    positions, rope_dim, base = shape
    from tallow.numerics import ggml_rope_angles

    return {"angles": ggml_rope_angles(positions, rope_dim, base)}


def _libm_cos_sin(a):
    from tallow.numerics import libm_map

    return torch.stack([libm_map("cosf", a["angles"]), libm_map("sinf", a["angles"])])


# RoPE's tables under ggml's arithmetic: libm's cosf/sinf in one C call against one ctypes call per value.
register(op="ggml_cos_sin", impl="tallow.kernels.cpu.ggml_ops:cos_sin", needs="ggml_dot", metric="exact",
         inputs=_cos_sin_inputs, shapes=((300, 64, 10000.0), (4096, 128, 1000000.0), (64, 256, 10000.0)),
         run=lambda a: torch.stack(_ggml_ops().cos_sin(a["angles"])), reference=_libm_cos_sin)


def _ggml_glu_inputs(shape, dtype, g):
    rows, f, spread = shape
    gate_up = torch.randn(rows, 2 * f, generator=g) * spread  # gate and up side by side, as the fused product gives them
    return {"gate": gate_up[:, :f], "up": gate_up[:, f:]}


register(op="ggml_swiglu", impl="tallow.kernels.cpu.ggml_ops:swiglu", needs="ggml_dot", metric="exact",
         inputs=_ggml_glu_inputs, shapes=((1, 1536, 4.0), (3, 8960, 8.0), (2, 64, 60.0)),
         run=lambda a: _ggml_ops().swiglu(a["gate"], a["up"]),
         reference=lambda a: __import__("tallow.numerics", fromlist=["x"]).ggml_swiglu(a["gate"], a["up"]))
# The C decode step's SwiGLU (decode_layer.c): torch's own SiLU, so the reference is F.silu itself, exactly.
register(op="c_layer_swiglu", impl="tallow.kernels.cpu.decode_layer:swiglu", needs="c_layer", metric="exact",
         inputs=_ggml_glu_inputs, shapes=((1, 1536, 4.0), (3, 8960, 8.0), (2, 100, 60.0)),
         run=lambda a: __import__("tallow.kernels.cpu.decode_layer", fromlist=["x"]).swiglu(a["gate"], a["up"]),
         reference=lambda a: torch.nn.functional.silu(a["gate"]) * a["up"])
register(op="ggml_geglu", impl="tallow.kernels.cpu.ggml_ops:geglu", needs="ggml_dot", metric="exact",
         inputs=_ggml_glu_inputs, shapes=((1, 2048, 4.0), (3, 640, 12.0)),
         run=lambda a: _ggml_ops().geglu(a["gate"], a["up"]),
         reference=lambda a: __import__("tallow.numerics", fromlist=["x"]).ggml_geglu(a["gate"], a["up"]))


def _ggml_attention_inputs(shape, dtype, g):
    n_kv, heads, dim, cap, lo, start, n_q, window, scale = shape
    qk = torch.randn(n_q, heads + 1, dim, generator=g) * 2  # Q as a strided view, as the rotated Q/K heads give it
    return {"q": qk[:, :heads], "k": (torch.randn(n_kv, cap, dim, generator=g) * 2).half(),
            "v": torch.randn(n_kv, cap, dim, generator=g).half(), "lo": lo, "start": start, "window": window, "scale": scale}


def _ggml_attention_reference(a):
    from tallow.layers import attention_mask
    from tallow.numerics import ggml_attention

    end = a["start"] + a["q"].shape[0]
    slots = torch.arange(a["lo"], end) % a["k"].shape[1]  # a ring's slots, in position order
    mask = attention_mask(torch.arange(a["start"], end), end - a["lo"], a["window"], a["lo"])
    return ggml_attention(a["q"].transpose(0, 1), a["k"][:, slots], a["v"][:, slots], mask, a["scale"])


# shapes: (n_kv, heads, head_dim, slots, lo, start, query rows, window, scale) — one-token steps with
# smollm2's and qwen2.5's heads, gemma3's 256-wide ones under a window, a ring that wraps, a head_dim
# not a multiple of 16; prompt rows (tinyBLAS's 16 lanes), causal, with a window, and a head_dim of 48 (the AVX2
# prompt code's 32-column V blocks and a 16-column tail)
register(op="ggml_attend", impl="tallow.kernels.cpu.ggml_ops:attend", needs="ggml_dot", metric="exact",
         inputs=_ggml_attention_inputs,
         shapes=((3, 9, 64, 200, 0, 36, 1, None, 0.125), (2, 12, 128, 1000, 0, 699, 1, None, 0.088),
                 (1, 4, 256, 600, 0, 519, 1, 510, 1.0), (1, 4, 256, 40, 30, 64, 1, 32, 0.0625), (2, 4, 40, 50, 0, 4, 1, None, 0.3),
                 (3, 9, 64, 200, 0, 0, 40, None, 0.125), (2, 4, 128, 300, 0, 100, 37, None, 0.088), (1, 4, 256, 600, 0, 30, 70, 50, 1.0),
                 (1, 2, 64, 100, 20, 60, 21, 40, 0.5), (2, 6, 48, 100, 0, 40, 9, None, 0.2)),
         run=lambda a: _ggml_ops().attend(a["q"], a["k"], a["v"], a["lo"], a["start"], a["window"], a["scale"]),
         reference=_ggml_attention_reference)


def _experts_inputs(shape, dtype, g):
    """Routed experts: (type, n_experts, k, dim, width, rows); gate/up as one 3-D tensor."""
    from gguf import GGMLQuantizationType as QT

    from test_quant_reference import random_rows
    from tallow.gguf_file import TensorInfo
    from tallow.kernels.cpu.moe import route_softmax

    qtype, n_exp, k, dim, width, m = shape
    qt = QT[qtype]
    gate_up = random_rows(qt, n_exp * 2 * width, dim, zlib.crc32(f"gu{shape}".encode()))
    down = random_rows(qt, n_exp * dim, width, zlib.crc32(f"d{shape}".encode()))
    weights, ids = route_softmax(torch.randn(m, n_exp, generator=g), k)
    return {"gate_up": TensorInfo("gu", qt, (dim, 2 * width, n_exp), 0, gate_up.nbytes, gate_up),
            "down": TensorInfo("d", qt, (width, dim, n_exp), 0, down.nbytes, down), "n": n_exp,
            "scale": torch.rand(n_exp, generator=g) + 0.5, "x": torch.randn(m, dim, generator=g),
            "ids": ids, "weights": weights}


def _experts(a, mode=None):
    from tallow.families.tensors import EXPERT
    from tallow.kernels.cpu.linear import make_linear
    from tallow.kernels.cpu.moe import ExpertBank, expert_slice

    n = a["n"]  # (role EXPERT, as models/qwen3moe.py builds them: the torch kernels, never the C one)
    return ExpertBank([make_linear(expert_slice(a["gate_up"], e, n), mode=mode, role=EXPERT) for e in range(n)],
                      [make_linear(expert_slice(a["down"], e, n), mode=mode, role=EXPERT) for e in range(n)], a["scale"])


def _glu(gu):
    from tallow.layers import swiglu

    f = gu.shape[-1] // 2
    return swiglu(gu[:, :f], gu[:, f:])


def _experts_reference(a):
    """Token by token, slot by slot: fp32 dequantized weights, weighted and scaled sum."""
    bank = _experts(a, "reference")
    rows = []
    for t in range(a["x"].shape[0]):
        acc = torch.zeros(a["x"].shape[1])
        for s, e in enumerate(a["ids"][t].tolist()):
            y = bank.down[e](_glu(bank.gate_up[e](a["x"][t : t + 1])))[0]
            acc += a["weights"][t, s] * a["scale"][e] * y
        rows.append(acc)
    return torch.stack(rows)


# One expert's products are the dense layers' kernels (their error: the linear cases above); the
# bank adds only the routing arithmetic. F32: fp32 rounding; Q4_0: two chained int4 products (bf16
# activations twice), 2e-2.
register(op="moe_experts", impl="tallow.kernels.cpu.moe:ExpertBank", needs="int4ops",
         tol=lambda a: 1e-5 if a["gate_up"].qtype == 0 else 2e-2, inputs=_experts_inputs,
         shapes=(("F32", 8, 2, 64, 32, 1), ("F32", 8, 3, 64, 32, 5), ("Q4_0", 8, 2, 64, 32, 1), ("Q4_0", 16, 4, 64, 32, 7)),
         run=lambda a: _experts(a)(a["x"], a["ids"], a["weights"], _glu), reference=_experts_reference)


def _checked_kind(layer, cls: str):
    if type(layer).__name__ != cls:
        raise AssertionError(f"make_linear built a {type(layer).__name__}, the case is for {cls}")
    return layer


def _embedding_inputs(shape, dtype, g):
    a = _linear_inputs(shape, dtype, g)
    return {**a, "ids": torch.tensor([0, 17, shape[2] - 1])}


register(op="embedding", impl="tallow.kernels.cpu.linear:Embedding", metric="exact",  # rows read exactly from the map
         inputs=_embedding_inputs, shapes=(("Q4_K", "auto", 64, 256, 1), ("Q6_K", "auto", 64, 256, 1)),
         run=lambda a: _checked_kind(_embedding(a), "Embedding")(a["ids"]),
         reference=lambda a: _reference_rows(a))


def _embedding(a):
    from tallow.kernels.cpu.linear import make_embedding

    return make_embedding(a["t"])


def _reference_rows(a):
    from tallow.quant.reference import dequantize

    t = a["t"]
    return dequantize(t.data, t.qtype, t.n_cols)[a["ids"]]


def _packed_inputs(shape, dtype, g):
    a = _linear_inputs(shape, dtype, g)
    return {**a, "layer": _linear(a), "xb": a["x"].to(torch.bfloat16)}


# The prefill tiles (dense bf16 GEMM on dequantized rows) against torch's packed-weight ops on the
# same packed weights: both round the output to bf16, the tiles also each weight (1e-2).
register(op="int4_dequant_mm", impl="tallow.kernels.cpu.dequant_matmul:int4_dequant_mm", needs="int4ops", tol=1e-2,
         inputs=_packed_inputs, shapes=(("Q4_K", "int4", 128, 256, 80), ("Q8_0", "int4x2", 64, 256, 64)),
         run=lambda a: _dequant_mm("int4_dequant_mm")(
             a["xb"], a["layer"].packed, a["layer"].scales_and_zeros, a["layer"].out_features, a["layer"].k_parts),
         reference=lambda a: torch.ops.aten._weight_int4pack_mm_for_cpu(
             torch.cat([a["xb"]] * a["layer"].k_parts, dim=1), a["layer"].packed, 32, a["layer"].scales_and_zeros))
register(op="int8_dequant_mm", impl="tallow.kernels.cpu.dequant_matmul:int8_dequant_mm", needs="int8ops", tol=1e-2,
         inputs=_packed_inputs, shapes=(("Q6_K", "int8", 64, 256, 80),),
         run=lambda a: _dequant_mm("int8_dequant_mm")(a["xb"], a["layer"].weight, a["layer"].scales),
         reference=lambda a: torch.ops.aten._weight_int8pack_mm(a["xb"], a["layer"].weight, a["layer"].scales))


def _dequant_mm(name: str):
    from tallow.kernels.cpu import dequant_matmul

    return getattr(dequant_matmul, name)


# ---------------------------------------------------------------- CPU: the Mamba ops (kernels/cpu/ssm.py)

# The references recompute the recurrences element by element in float64 (a missed tap, decay or
# group gives errors of order 1); the kernels run float32, so 1e-5 norm-wise.

def _conv_inputs(shape, dtype, g):
    n, ch, d_conv = shape
    return {"x": torch.randn(n, ch, generator=g), "state": torch.randn(d_conv - 1, ch, generator=g),
            "w": torch.randn(ch, d_conv, generator=g), "b": torch.randn(ch, generator=g)}


def _conv_reference(a):
    window = torch.cat([a["state"], a["x"]]).double()
    n, d_conv = a["x"].shape[0], a["w"].shape[1]
    return torch.stack([(window[t : t + d_conv].T * a["w"].double()).sum(1) for t in range(n)]) + a["b"].double()


def _scan_inputs(shape, dtype, g):
    n, heads, head_dim, groups, d_state, version = shape
    A = -torch.rand(heads, d_state, generator=g) * 4 if version == 1 else -torch.rand(heads, generator=g) * 4
    return {"state": torch.randn(heads, head_dim, d_state, generator=g), "x": torch.randn(n, heads, head_dim, generator=g),
            "dt": torch.randn(n, heads, generator=g) * 3, "A": A, "B": torch.randn(n, groups, d_state, generator=g),
            "C": torch.randn(n, groups, d_state, generator=g)}


def _scan_reference(a):
    s = a["state"].double().clone()
    n, heads = a["dt"].shape
    per_group = heads // a["B"].shape[1]
    y = torch.zeros(a["x"].shape, dtype=torch.float64)
    for t in range(n):
        for h in range(heads):
            dt = float(a["dt"][t, h])
            dt = dt if dt > 20 else float(torch.log1p(torch.exp(torch.tensor(dt, dtype=torch.float64))))
            A = a["A"][h].double()
            decay = torch.exp(dt * A)  # (d_state,) or a scalar
            b, c = a["B"][t, h // per_group].double(), a["C"][t, h // per_group].double()
            s[h] = s[h] * decay + b * (a["x"][t, h].double() * dt).unsqueeze(-1)
            y[t, h] = (s[h] * c).sum(-1)
    return y


def _ssm(name: str):
    from tallow.kernels.cpu import ssm

    return getattr(ssm, name)


register(op="ssm_conv", impl="tallow.kernels.cpu.ssm:causal_conv", tol=1e-5, inputs=_conv_inputs,
         shapes=((1, 32, 4), (7, 48, 4), (3, 16, 2)),
         run=lambda a: _ssm("causal_conv")(a["x"], a["state"].clone(), a["w"], a["b"]), reference=_conv_reference)
register(op="ssm_scan", impl="tallow.kernels.cpu.ssm:selective_scan", tol=1e-5, inputs=_scan_inputs,
         shapes=((1, 16, 1, 1, 8, 1), (9, 32, 1, 1, 16, 1), (1, 4, 8, 2, 16, 2), (9, 8, 4, 2, 16, 2)),
         run=lambda a: _ssm("selective_scan")(a["state"].clone(), a["x"], a["dt"], a["A"], a["B"], a["C"]),
         reference=_scan_reference)
register(op="ssm_scan", impl="tallow.kernels.cpu.ssm:blocked_scan", tol=1e-5, inputs=_scan_inputs,
         shapes=((1, 16, 1, 1, 8, 1), (9, 32, 1, 1, 16, 1), (1, 4, 8, 2, 16, 2), (9, 8, 4, 2, 16, 2)),
         run=lambda a: _ssm("blocked_scan")(a["state"].clone(), a["x"], a["dt"], a["A"], a["B"], a["C"]),
         reference=_scan_reference)


# ---------------------------------------------------------------- Triton: the Mamba ops (kernels/triton/ssm.py)

# Against the torch references the CPU runs (kernels/ssm_ops.TorchMixerOps: cpu/ssm.py's conv and
# scan, then SiLU, the D skip and the gate), the updated state checked with the output (a case
# returns both, flattened). Float32 in both, the sums in another order: 1e-5 norm-wise. n_valid
# shorter than n (a graph's padding, read from a device tensor): the state must stop at row
# n_valid - 1, so only the valid rows' outputs are compared.

def _mixer_ops(kind: str):
    from tallow.kernels import ssm_ops

    return ssm_ops.TritonMixerOps() if kind == "triton" else ssm_ops.TorchMixerOps()


def _triton_conv_inputs(shape, dtype, g):
    n, ch, d_conv, n_valid = shape
    x = torch.randn(n, 2 * ch, generator=g)[:, :ch]  # a strided view, as the in-projection's output is
    return {"x": x, "state": torch.randn(d_conv - 1, ch, generator=g), "w": torch.randn(ch, d_conv, generator=g),
            "b": torch.randn(ch, generator=g), "n_valid": n_valid}


def _conv_run(a, kind):
    state, nv = a["state"].clone(), a["n_valid"]
    y = _mixer_ops(kind).conv(a["x"], state, a["w"], a["b"], torch.tensor([nv]) if nv and kind == "triton" else nv)
    return torch.cat([y[: nv or len(y)].reshape(-1), state.reshape(-1)])


register(op="ssm_conv", impl="tallow.kernels.triton.ssm:ssm_conv", needs="triton", tol=1e-5, inputs=_triton_conv_inputs,
         # decode; one tile of rows; 3 row tiles (the state written by its own launch), padded
         shapes=((1, 40, 4, None), (7, 48, 4, None), (9, 33, 4, 5), (2, 16, 4, 1), (3, 16, 2, None), (40, 300, 4, 37)),
         run=lambda a: _conv_run(a, "triton"), reference=lambda a: _conv_run(a, "torch"))


def _triton_scan_inputs(shape, dtype, g):
    n, heads, head_dim, groups, d_state, version, n_valid = shape
    A = -torch.rand(heads, d_state, generator=g) * 4 if version == 1 else -torch.rand(heads, generator=g) * 4
    dt = torch.randn(n, heads, generator=g) * 3
    dt[0, 0], dt[-1, -1] = 25.0, -30.0  # softplus's two far ends: x itself, and log1p of a tiny exp
    bc = torch.randn(n, 3 * groups * d_state, generator=g)  # B and C as views of one row, as xBC holds them
    return {"state": torch.randn(heads, head_dim, d_state, generator=g), "x": torch.randn(n, heads * head_dim, generator=g),
            "dt": dt, "A": A, "B": bc[:, : groups * d_state], "C": bc[:, groups * d_state : 2 * groups * d_state],
            "D": torch.randn(heads, generator=g), "z": torch.randn(n, heads * head_dim, generator=g),
            "dt_bias": torch.randn(heads, generator=g) if version == 2 else None, "n_valid": n_valid}


def _scan_run(a, kind):
    state, nv = a["state"].clone(), a["n_valid"]
    y = _mixer_ops(kind).scan(state, a["x"], a["dt"], a["A"], a["B"], a["C"],
                              torch.tensor([nv]) if nv and kind == "triton" else nv, a["dt_bias"], a["D"], a["z"])
    return torch.cat([y[: nv or len(y)].reshape(-1), state.reshape(-1)])


# Mamba-1 (head_dim 1, a decay per state), Mamba-2 (heads of head_dim, groups, a decay per head,
# dt bias); decode (n 1) and chunks, with padding rows after n_valid; d_state not a power of two.
register(op="ssm_scan", impl="tallow.kernels.triton.ssm:ssm_scan", needs="triton", tol=1e-5, inputs=_triton_scan_inputs,
         shapes=((1, 16, 1, 1, 8, 1, None), (9, 48, 1, 1, 16, 1, 6), (1, 4, 8, 2, 16, 2, None), (9, 8, 4, 2, 16, 2, 6),
                 (5, 6, 4, 3, 12, 2, None)),
         run=lambda a: _scan_run(a, "triton"), reference=lambda a: _scan_run(a, "torch"))


def _ssd_run(a):
    from tallow.kernels.triton.ssd import ssd_scan

    state, nv = a["state"].clone(), a["n_valid"]
    y = ssd_scan(state, a["x"], a["dt"], a["A"], a["B"], a["C"], torch.tensor([nv]) if nv else None, a["dt_bias"],
                 a["D"], a["z"], chunk=16)  # 16-token chunks: the state passed between several
    return torch.cat([y[: nv or len(y)].reshape(-1), state.reshape(-1)])


# The chunked SSD form of the Mamba-2 scan (TALLOW_SSD_CHUNKED, prefill): the same sums re-associated
# into per-chunk products; against the token-by-token torch reference, padding rows after n_valid.
register(op="ssm_scan", impl="tallow.kernels.triton.ssd:ssd_scan", needs="triton", tol=1e-5, inputs=_triton_scan_inputs,
         shapes=((40, 3, 4, 1, 12, 2, None), (37, 4, 8, 2, 16, 2, 29)),
         run=_ssd_run, reference=lambda a: _scan_run(a, "torch"))


# ---------------------------------------------------------------- not here (yet), and not kernels

# Implementations whose checks need more than a reference on random inputs (rings, CUDA graphs,
# fused decode steps, the int4 pack layout): each is tested against its reference in the file named.
ELSEWHERE: dict[str, str] = {
    "tallow.kernels.triton.rope:rope": "tests/test_triton_ops.py",
    "tallow.kernels.triton.prefill_attention:prefill_attention": "tests/test_triton_prefill_attention.py",
    "tallow.kernels.cpu.fused_linear:FusedLinear": "tests/test_cpu_fastpaths.py",
    # bf16 products widened to fp32 where the CPU has no native bf16 GEMM (and the switch reading it)
    "tallow.kernels.cpu.dequant_matmul:bf16_mm": "tests/test_cpu_fastpaths.py",
    "tallow.kernels.cpu.dequant_matmul:bf16_linear": "tests/test_cpu_fastpaths.py",
    "tallow.kernels.cpu.dequant_matmul:widens_bf16": "tests/test_cpu_fastpaths.py",
    "tallow.kernels.block_ops:TritonOps": "tests/test_fused_step.py",
    "tallow.kernels.gpu.linear:GPULinear": "tests/test_gpu_layers.py",
    "tallow.kernels.gpu.linear:GPUEmbedding": "tests/test_gpu_layers.py",
    "tallow.kernels.triton.mmvq:quantize_q8_1": "tests/test_triton_mmvq.py",
    "tallow.kernels.triton.mmvq:mmvq_q8": "tests/test_triton_mmvq.py",
    # the norm after a residual join writing its output's Q8_1 blocks: bytes against the two launches
    "tallow.kernels.triton.mmvq:rmsnorm_add_q8": "tests/test_triton_mmvq.py",
    "tallow.kernels.gpu.linear:norm_add_norm_q8": "tests/test_fused_step.py",  # gemma4 logits on vs off
    # TALLOW_NUMERICS=ggml: checked against libggml-cpu's own outputs (tests/fixtures/ggml_ops.json)
    "tallow.kernels.cpu.ggml_linear:GgmlLinear": "tests/test_ggml_numerics.py",
    "tallow.kernels.cpu.ggml_linear:block_mins": "tests/test_ggml_numerics.py",
    "tallow.kernels.cpu.q8_activations:quantize_q8_0": "tests/test_ggml_numerics.py",
    "tallow.kernels.cpu.q8_activations:quantize_q8_1": "tests/test_ggml_numerics.py",
    "tallow.kernels.cpu.q8_activations:quantize_q8_k": "tests/test_ggml_numerics.py",
    "tallow.kernels.cpu.q8_activations:round_activations": "tests/test_ggml_numerics.py",
    "tallow.kernels.gpu.moe:GPUExpertBank": "tests/test_moe_gpu.py",
    # the C kernel's entry points: bit for bit against libggml-cpu's recorded outputs
    "tallow.kernels.cpu.ggml_dot:quantize": "tests/test_ggml_dot.py",
    "tallow.kernels.cpu.ggml_dot:gemv_quantized": "tests/test_ggml_dot.py",
    "tallow.kernels.cpu.ggml_dot:linear": "tests/test_ggml_dot.py",
    "tallow.kernels.cpu.ggml_dot:GgmlDotGroup": "tests/test_ggml_dot.py",  # each part's own bits, mixed types
    # the whole decode step in C: logits and K/V bit for bit the composed blocks' (tiny and real models)
    "tallow.kernels.cpu.decode_layer:DecodeLayers": "tests/test_decode_layer.py",
    # the recurrent step in C: bit for bit an op-by-op emulation of its arithmetic, within 2e-6 of cpu/ssm.py
    "tallow.kernels.cpu.c_ssm:conv": "tests/test_c_ssm.py",
    "tallow.kernels.cpu.c_ssm:scan": "tests/test_c_ssm.py",
    "tallow.kernels.ssm_ops:CMixerOps": "tests/test_c_ssm.py",
    # a layer's whole mixer in one C call at decode: logits and states bit for bit the composed mixer's
    "tallow.kernels.cpu.c_ssm:MixerStep": "tests/test_c_ssm.py",
}

# Public names in kernel modules that compute nothing to compare: references, switches, configs,
# containers, factories of the implementations above, scratch helpers.
NOT_KERNELS: frozenset[str] = frozenset({
    # routed experts' helpers: a view of the file map, the router's softmax/top-k (checked against
    # llama.cpp's chosen experts in tests/test_moe.py), a switch
    "tallow.kernels.cpu.moe:expert_slice", "tallow.kernels.cpu.moe:route_softmax", "tallow.kernels.cpu.moe:grouped_enabled",
    "tallow.kernels.cpu.ssm:softplus_ggml",  # an elementwise helper of selective_scan, covered by its case
    # the mixer's ops by device: the torch references (cpu/ssm.py) or the Triton kernels, both in the ssm cases
    "tallow.kernels.ssm_ops:TorchMixerOps", "tallow.kernels.ssm_ops:TritonMixerOps", "tallow.kernels.ssm_ops:mixer_ops",
    "tallow.kernels.ssm_ops:ssm_triton_enabled", "tallow.kernels.ssm_ops:ssd_chunked",
    "tallow.kernels.cpu.c_ssm:usable", "tallow.kernels.cpu.c_ssm:fits",
    "tallow.kernels.triton.ssm:scan_shapes",  # the scans' argument check, run by both scans' cases
    "tallow.kernels.cpu.c_ssm:mixer_usable", "tallow.kernels.cpu.c_ssm:mixer_on",
    "tallow.kernels.cpu.c_ssm:products",  # the C product plan of existing layers (ggml_dot's own), a container
    "tallow.kernels.triton.argmax:argmax_reference", "tallow.kernels.triton.argmax:make_argmax_scratch",
    "tallow.kernels.triton.glu:glu_reference", "tallow.kernels.triton.fp4_gemv:fp4_gemv_reference",
    # routed experts on the GPU: the stacked weight's container, its references, a switch
    "tallow.kernels.triton.moe_gemv:ExpertWeights", "tallow.kernels.triton.moe_gemv:moe_gemv_reference",
    "tallow.kernels.triton.moe_gemv:expert_matrices", "tallow.kernels.triton.moe_gemv:fp4_dequantize_reference",
    "tallow.kernels.gpu.moe:triton_enabled", "tallow.kernels.gpu.moe:stackable", "tallow.kernels.gpu.moe:stack_experts",
    "tallow.kernels.triton.rmsnorm:rmsnorm_reference", "tallow.kernels.triton.rmsnorm:rmsnorm_add_reference",
    "tallow.kernels.triton.rope:rope_reference",
    # programmatic dependent launch: the launch options and the in-kernel wait every decode kernel calls
    "tallow.kernels.triton.pdl:enabled", "tallow.kernels.triton.pdl:launch",
    "tallow.kernels.triton.decode_attention:decode_attention_reference",
    "tallow.kernels.triton.decode_attention:default_splits", "tallow.kernels.triton.decode_attention:make_scratch",
    "tallow.kernels.triton.prefill_attention:prefill_attention_enabled",
    "tallow.kernels.triton.quant_gemv:quant_gemv_reference", "tallow.kernels.triton.quant_gemv:gemv_config",
    "tallow.kernels.triton.quant_gemv:Prologue", "tallow.kernels.triton.quant_gemv:small_grid_split",
    "tallow.kernels.triton.quant_gemv:epilogue_addend",  # a launch's addend arguments (tests/test_gpu_layers.py's epilogue cases)
    "tallow.kernels.triton.mmvq:Q8Act", "tallow.kernels.triton.mmvq:quantize_q8_1_reference",
    "tallow.kernels.triton.mmvq:mmvq_reference", "tallow.kernels.triton.mmvq:mmvq_config",
    "tallow.kernels.triton.moe_mmvq:moe_mmvq_reference", "tallow.kernels.triton.moe_grouped:moe_grouped_reference",
    "tallow.kernels.triton.moe_grouped:group_pairs", "tallow.kernels.triton.moe_grouped:moe_grouped_ok",
    "tallow.kernels.triton.moe_grouped:grouped_block_m", "tallow.kernels.triton.moe_grouped:moe_grouped_config",
    "tallow.kernels.triton.moe_grouped:GroupedPairs", "tallow.kernels.triton.moe_mmvq:moe_mmvq_config",
    "tallow.kernels.triton.moe_mmvq:moe_mmvq_ok", "tallow.kernels.triton.mmvq:nv_order_reference",
    # NVML/CPU readings printed beside bench figures, not kernels
    "tallow.kernels.gpu.machine_state:cpu_state", "tallow.kernels.gpu.machine_state:describe",
    "tallow.kernels.gpu.machine_state:gpu_state", "tallow.kernels.gpu.machine_state:machine_state",
    "tallow.kernels.triton.planes:qtype_name", "tallow.kernels.triton.planes:PlaneWeight",
    "tallow.kernels.triton.planes:pack_planes", "tallow.kernels.triton.planes:unpack_planes",
    "tallow.kernels.triton.planes:dequantize_planes", "tallow.kernels.triton.planes:random_raw",
    "tallow.kernels.triton.interpreter_compat:apply",
    "tallow.kernels.cpu.dequant_matmul:enabled", "tallow.kernels.cpu.dequant_matmul:int4_weight_t", "tallow.kernels.cpu.dequant_matmul:scratch_bytes",
    "tallow.kernels.cpu.fused_linear:fusion_enabled",
    "tallow.kernels.cpu.c_attention:usable", "tallow.kernels.cpu.c_attention:set_simd",
    "tallow.kernels.cpu.ggml_ops:usable", "tallow.kernels.cpu.ggml_ops:set_simd",
    "tallow.kernels.cpu.ggml_ops:built", "tallow.kernels.cpu.ggml_ops:norm_fits",
    "tallow.kernels.cpu.ggml_dot:wanted", "tallow.kernels.cpu.ggml_dot:available", "tallow.kernels.cpu.ggml_dot:usable", "tallow.kernels.cpu.ggml_dot:unavailable_reason",
    "tallow.kernels.cpu.ggml_dot:simd", "tallow.kernels.cpu.ggml_dot:set_simd", "tallow.kernels.cpu.ggml_dot:status",
    "tallow.kernels.cpu.ggml_dot:in_use_status", "tallow.kernels.cpu.ggml_dot:bound",  # the library for one C file
    "tallow.kernels.cpu.ggml_dot:products_of",  # a layer's cached C plan (a container; the products are tested through the layers)
    "tallow.kernels.cpu.decode_layer:usable", "tallow.kernels.cpu.decode_layer:unavailable_reason",
    "tallow.kernels.cpu.decode_layer:silu_rows_match",  # when torch's SiLU splits rows as the C step does (a rule)
    "tallow.kernels.cpu.decode_layer:vector_lanes",  # torch's vector width here, which fixes that rule's blocks
    "tallow.kernels.cpu.ggml_dot:gemm", "tallow.kernels.cpu.ggml_dot:gemm_takes",  # the prefill product's flag and types (test_ggml_gemm.py: same bits on and off)
    "tallow.kernels.cpu.ggml_dot:prefills",  # whether a type prefills in C with no torch copy (test_ggml_gemm.py, the memory plan tests)
    "tallow.kernels.cpu.ggml_dot:parallel_min_bytes",  # the two-thread threshold, a setting
    "tallow.kernels.cpu.ggml_dot:row_pairs",  # the two-row Q4_1 form's flag (test_ggml_dot.py: same bits on and off)
    "tallow.kernels.cpu.ggml_dot:prefetch_bytes",  # the weight-row prefetch distance, a setting (test_ggml_dot checks it changes no bit)
    "tallow.kernels.cpu.linear:Linear", "tallow.kernels.cpu.linear:ReferenceLinear",
    "tallow.kernels.cpu.linear:make_linear", "tallow.kernels.cpu.linear:make_embedding",
    "tallow.kernels.cpu.linear:group_int8_codes", "tallow.kernels.cpu.linear:pack_group_int8",
    "tallow.kernels.block_ops:TorchOps", "tallow.kernels.block_ops:LazyInput", "tallow.kernels.block_ops:block_ops",
    "tallow.kernels.block_ops:triton_ops_enabled", "tallow.kernels.block_ops:gemv_prologue_enabled",
    "tallow.kernels.gpu.linear:Scratch", "tallow.kernels.gpu.linear:mmvq_wins",  # a shape rule (test_gpu_layers.py)
    # the integer-dot GEMVs' shared Q8_1 input: dispatch, checked through the decode step (test_fused_step.py)
    "tallow.kernels.gpu.linear:join_q8", "tallow.kernels.gpu.linear:SharedQ8", "tallow.kernels.gpu.linear:q8_of",
    "tallow.kernels.dispatch:LinearGroup", "tallow.kernels.dispatch:Placement",
})
