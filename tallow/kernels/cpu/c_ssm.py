"""The Mamba mixer's conv1d and selective scan in C (ssm_step.c, built into the optional library with
ggml_dot.c): one call each per layer and token block, the states updated in place, instead of the
torch reference's small ops and state copies (kernels/cpu/ssm.py). Bits: ssm_step.c's header.

Switch (read at load, kernels/ssm_ops.mixer_ops): TALLOW_CPU_C_SSM=0 runs the torch reference; on by
default where the library is built. The calls take CPU float32 tensors whose last dimension is
contiguous (row strides are passed, so column slices of the in-projection go in without a copy).

`MixerStep` (TALLOW_CPU_C_MIXER, asked per step; session 13): a layer's whole mixer for one decode row in one
C call (ss_mixer_step) over the same C products, conv, scan and norm the composed mixer calls, so the same bits.
"""

from __future__ import annotations

import ctypes

import torch

from ... import switches
from . import ggml_dot


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.ss_conv.argtypes = [p, i64, i64, i64, i32, p, p, p, p]
    lib.ss_scan.argtypes = [p, i64, i64, i64, i64, p, i64, p, i64, p, p, i32, p, i64, p, i64, p, p, i64, i64, p, i32]
    lib.ss_conv.restype = None
    lib.ss_scan.restype = i32


def _lib() -> ctypes.CDLL | None:
    return ggml_dot.bound("ss_scan", _declare)


def usable() -> bool:
    """TALLOW_CPU_C_SSM (default on) and the library built with ssm_step.c."""
    return switches.enabled("TALLOW_CPU_C_SSM") and _lib() is not None


def fits(*tensors: torch.Tensor | None) -> bool:
    """CPU float32 tensors with a contiguous last dimension (None: an absent optional input). Asked
    of every call's inputs: a plain loop, the cheapest form (a layer's decode step is ~100 us)."""
    for t in tensors:
        if t is not None and (t.dtype is not torch.float32 or not t.is_cpu or t.stride(-1) != 1):
            return False
    return True


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def conv(x: torch.Tensor, state: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """SiLU(causal conv1d of x (n, C) after state (d_conv - 1, C), plus bias); state updated in place.
    weight_t (d_conv, C): the layer's (C, d_conv) kernel transposed, contiguous; bias (C,) contiguous."""
    n, channels = x.shape
    out = torch.empty((n, channels), dtype=torch.float32)
    _lib().ss_conv(x.data_ptr(), x.stride(0), n, channels, weight_t.shape[0], state.data_ptr(),
                                   weight_t.data_ptr(), bias.data_ptr(), out.data_ptr())
    return out


def scan(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
         dt_bias: torch.Tensor | None, D: torch.Tensor | None, z: torch.Tensor | None) -> torch.Tensor:
    """(selective scan + x D) * SiLU(z) over the rows of x (n, n_head * head_dim); dt (n, n_head); B, C
    (n, n_group * d_state); state (n_head, head_dim, d_state) contiguous, updated in place; A (n_head,
    d_state) (Mamba-1) or (n_head,); dt_bias, D (n_head,) or None; z (n, n_head * head_dim) or None."""
    n_head, head_dim, d_state = state.shape
    n = x.shape[0]
    n_group = B.shape[1] // d_state
    y = torch.empty((n, n_head * head_dim), dtype=torch.float32)
    zs = 0 if z is None else z.stride(0)
    rc = _lib().ss_scan(state.data_ptr(), n_head, head_dim, d_state, n_group, x.data_ptr(), x.stride(0), dt.data_ptr(),
                                        dt.stride(0), _ptr(dt_bias), A.data_ptr(), int(A.dim() == 2), B.data_ptr(), B.stride(0),
                                        C.data_ptr(), C.stride(0), _ptr(D), _ptr(z), zs, n, y.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise MemoryError("the C selective scan could not allocate its scratch.")
    return y


# ------------------------------------------------------------------ the whole mixer, one decode row

class _Mixer(ctypes.Structure):
    """ssm_step.c's ss_mixer_t."""

    _fields_ = [("version", ctypes.c_int32), ("n_norm_rows", ctypes.c_int32)] + [
        (f, ctypes.c_int64) for f in ("dim", "d_inner", "channels", "n_head", "head_dim", "d_state", "n_group", "dt_rank",
                                      "d_conv", "d_in_proj")] + [("eps", ctypes.c_float)] + [
        (f, ctypes.c_void_p) for f in ("in_plan", "x_plan", "dt_plan", "out_plan", "dt_lin_bias", "conv_wt", "conv_b", "A",
                                       "D", "dt_b", "norm_w")]


def _declare_mixer(lib: ctypes.CDLL) -> None:
    p = ctypes.c_void_p
    lib.ss_mixer_step.argtypes = [p, p, p, p, p, p, p, ctypes.c_int]
    lib.ss_mixer_step.restype = ctypes.c_int


def mixer_usable() -> bool:
    """The C scan and norm in use (TALLOW_CPU_C_SSM, TALLOW_CPU_C_NORM) and the library built with
    ss_mixer_step: asked at load. TALLOW_CPU_C_MIXER itself is asked per step (`mixer_on`)."""
    return (usable() and switches.enabled("TALLOW_CPU_C_NORM")
            and ggml_dot.bound("ss_mixer_step", _declare_mixer) is not None)


def mixer_on() -> bool:
    return switches.enabled("TALLOW_CPU_C_MIXER")


def _parts(layer) -> list:
    """The C-kernel layers a Linear runs: itself, or a FusedLinear's runs."""
    runs = getattr(layer, "runs", None)
    return [r for x in runs for r in _parts(x)] if runs else [layer]


def products(layer, bias_ok: bool = False):
    """The C plan of a Linear (a GgmlDotLinear or GgmlDotGroup, or a FusedLinear of them) or of several
    Linears over the same input (a list: their weights side by side, one call; each row's products are
    independent, so each part's bits are its own call's), as ggml_dot's own calls build it. None where
    a part is not a C-kernel layer, or has a bias (unless bias_ok: the caller adds it)."""
    layers = [p for x in (layer if isinstance(layer, list) else [layer]) for p in _parts(x)]
    if not all(getattr(x, "kind", None) == "ggml_dot" for x in layers):
        return None
    if not bias_ok and any(x.bias is not None for x in layers):
        return None
    if len(layers) == 1:
        return ggml_dot.products_of(layers[0])  # the plan the layer's own calls use
    from ...numerics_mode import ggml_enabled

    return ggml_dot._Products([wt for x in layers for wt in x._weights()], layers[0].in_features,
                              row_invariant=not ggml_enabled())


class MixerStep:
    """One layer's whole Mamba mixer for one decode row in one C call (ss_mixer_step): its in-projection
    (or the caller's), conv, [Mamba-1's x and dt projections], scan, [Mamba-2's norm], out-projection:
    models/mamba.py's mixer with its bits (the same C calls, in order), without its ~30 Python and torch
    calls a layer. `build` says None where a layer's weights or sizes are not what the C step takes."""

    def __init__(self, s: _Mixer, keep: list, act_bytes: int, dim: int):
        self.s, self.keep, self.act_bytes, self.dim = s, keep, act_bytes, dim
        self.addr = ctypes.addressof(s)

    @staticmethod
    def build(w, ssm, eps: float, conv_state: torch.Tensor, scan_state: torch.Tensor, in_plan=None):
        """w: the layer's LayerWeights (models/mamba.py's names); ssm: spec.ssm; in_plan: the plan of the
        in-projection when the caller runs it itself (falcon-h1, fused with Q/K/V), else None."""
        if ssm.version == 1 and ssm.dt_b_c_rms:
            return None
        plans = {"in_plan": products(w.ssm_in), "out_plan": products(w.ssm_out)}
        if ssm.version == 1:
            plans.update(x_plan=products(w.ssm_x), dt_plan=products(w.ssm_dt, bias_ok=True))
            if len(_parts(w.ssm_dt)) != 1:
                return None
        if any(p is None for p in plans.values()):
            return None
        small = [w.conv_w, w.conv_b, w.A, w.D, w.get("dt_b"), w.get("ssm_norm"),
                 _parts(w.ssm_dt)[0].bias if ssm.version == 1 else None, conv_state, scan_state]
        if not fits(*small) or not all(t is None or t.is_contiguous() for t in small):
            return None
        s = _Mixer()
        n_head, head_dim, d_state = scan_state.shape
        s.version, s.dim, s.d_inner, s.channels = ssm.version, w.ssm_in.in_features, ssm.d_inner, ssm.conv_channels
        s.n_head, s.head_dim, s.d_state, s.d_conv = n_head, head_dim, d_state, w.conv_w.shape[1]
        s.n_group = 1 if ssm.version == 1 else ssm.n_group
        s.dt_rank = ssm.dt_rank if ssm.version == 1 else 0
        s.d_in_proj, s.eps = w.ssm_in.out_features, eps
        norm = w.get("ssm_norm") if ssm.version == 2 else None
        s.n_norm_rows = 0 if norm is None else s.n_group
        conv_wt = w.conv_w.t().contiguous()
        keep = [conv_wt, norm, w.dt_b if ssm.version == 2 else None, *plans.values()]
        for k, p in plans.items():
            setattr(s, k, p.addr)
        s.conv_wt, s.conv_b, s.A, s.D = conv_wt.data_ptr(), w.conv_b.data_ptr(), w.A.data_ptr(), w.D.data_ptr()
        s.dt_b = _ptr(w.dt_b) if ssm.version == 2 else None
        s.norm_w = _ptr(norm)
        s.dt_lin_bias = _ptr(_parts(w.ssm_dt)[0].bias) if ssm.version == 1 else None
        act = max(p.act_bytes for p in plans.values())
        if in_plan is not None:
            act = max(act, in_plan.act_bytes)
        return MixerStep(s, keep, act, s.dim)

    def __call__(self, h: torch.Tensor | None, conv_state: torch.Tensor, scan_state: torch.Tensor,
                 proj: torch.Tensor | None = None) -> torch.Tensor:
        """h (1, dim) contiguous float32, or proj (1, d_in_proj) with a contiguous row -> (1, dim)."""
        out = torch.empty((1, self.dim), dtype=torch.float32)
        if _lib().ss_mixer_step(self.addr, None if h is None else h.data_ptr(), None if proj is None else proj.data_ptr(),
                                conv_state.data_ptr(), scan_state.data_ptr(), ggml_dot._scratch(self.act_bytes),
                                out.data_ptr(), torch.get_num_threads()):
            raise MemoryError("the C mixer step could not allocate its scratch.")
        return out
