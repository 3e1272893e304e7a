"""Mamba's two recurrent ops on the GPU (mamba, mamba2, falcon-h1), one launch each, for a decode
token and for a prefill chunk alike; the torch references are kernels/cpu/ssm.py.

`ssm_conv`: the causal depthwise conv1d of kernels/cpu/ssm.causal_conv (taps summed in ggml's
order, bias after), SiLU fused, the conv state updated in place: tiles of rows and channels,
the state written by a program that has read all of its old rows first.

`ssm_scan`: the selective scan of kernels/cpu/ssm.selective_scan — dt (+ Mamba-2's bias) through
ggml's softplus, s = s * exp(dt * A) + B * (x * dt), y = sum(s * C) — with the D skip and the
SiLU(z) gate of the mixer fused after it. A program owns a block of rows of the flattened
(n_head * head_dim, d_state) state and keeps it in registers across the chunk's tokens, one
token after the other as ggml-cuda's ssm_scan does (not the SSD matrix form): the state is
read and written once per launch, and a one-token decode step is the same code as a chunk.

`ssm_scan(..., q8=True)` (Mamba-1's decode step, TALLOW_SSM_SCAN_EPILOGUE) also writes y's Q8_1
blocks, the out-projection's integer-dot input (mmvq.py), in the scan's own program: a program then
owns whole 32-row blocks of y. Mamba-1's dt bias comes in as `dt_bias` (added before the softplus, as
the dt projection's bias add did): that drops the projection's separate bias-add launch.

Both launch with programmatic dependent launch (pdl.py) where the GPU takes it (the q8 scan
does not: see ssm_scan).

Both take `n_valid`: only rows 0..n_valid-1 advance a state (the rows after are a captured
graph's padding; their outputs are computed and meaningless). n_valid is a host int, or a
(1,) int64 device tensor read inside the kernel, so a graph replays at any chunk length.
Graph-safe with `out` given (or allocated inside the captured region).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .mmvq import Q8Act, _store_q8_1

__all__ = ["ssm_conv", "ssm_scan"]

ELEMENTS = 128  # state elements per scan program (see ssm_scan)


@triton.jit
def _window_rows(x_ptr, state_ptr, r, ch, mask, C, sx, DC1: tl.constexpr):
    """Rows r (a column of row indices) of the window [state; x]: the state's row r for r < DC1,
    else x's row r - DC1; ch a row of channels."""
    old = tl.load(state_ptr + r * C + ch, mask=mask & (r < DC1), other=0.0)
    new = tl.load(x_ptr + (r - DC1) * sx + ch, mask=mask & (r >= DC1), other=0.0)
    return tl.where(r < DC1, old, new)


@triton.jit(do_not_specialize=["n", "n_valid"])
def _conv_kernel(x_ptr, state_ptr, w_ptr, b_ptr, y_ptr, nvalid_ptr, n, n_valid, C, sx, sy,
                 D_CONV: tl.constexpr, SILU: tl.constexpr, NVALID_PTR: tl.constexpr, CONV: tl.constexpr,
                 UPDATE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_J: tl.constexpr,
                 PDL: tl.constexpr):
    """CONV: the outputs of a (BLOCK_T rows, BLOCK_C channels) tile. UPDATE: the new conv state
    of the program's channels, read whole before it is stored — only where one program per
    channel block runs (one row block, or a launch of its own after the outputs')."""
    ch = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = ch < C
    pdl.wait(PDL)
    if CONV:
        t = (tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T))[:, None]
        m2 = (t < n) & cm[None, :]
        # Tap by tap in ggml's order (kernels/cpu/ssm.causal_conv), the bias after.
        acc = _window_rows(x_ptr, state_ptr, t, ch[None, :], m2, C, sx, D_CONV - 1) * tl.load(w_ptr + ch * D_CONV, mask=cm, other=0.0)[None, :]
        for k in tl.static_range(1, D_CONV):
            w = tl.load(w_ptr + ch * D_CONV + k, mask=cm, other=0.0)[None, :]
            acc += _window_rows(x_ptr, state_ptr, t + k, ch[None, :], m2, C, sx, D_CONV - 1) * w
        acc += tl.load(b_ptr + ch, mask=cm, other=0.0)[None, :]
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        tl.store(y_ptr + t * sy + ch[None, :], acc, mask=m2)
    if UPDATE:
        if NVALID_PTR:
            nv = tl.load(nvalid_ptr).to(tl.int32)
        else:
            nv = n_valid
        # The new state: window rows n_valid .. n_valid + D_CONV - 2.
        j = tl.arange(0, BLOCK_J)
        jm = (j < D_CONV - 1)[:, None] & cm[None, :]
        v = _window_rows(x_ptr, state_ptr, (nv + j)[:, None], ch[None, :], jm, C, sx, D_CONV - 1)
        tl.debug_barrier()
        tl.store(state_ptr + j[:, None] * C + ch[None, :], v, mask=jm)


def _n_valid_args(n_valid, n: int):
    """(pointer tensor or None, host count, whether the kernel reads the pointer)."""
    if isinstance(n_valid, torch.Tensor):
        return n_valid, n, True
    return None, n if n_valid is None else int(n_valid), False


CONV_ROWS, CONV_CHANNELS = 16, 128  # a conv program's tile


def ssm_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, n_valid=None,
             silu: bool = True, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (n, C) (any row stride, channels contiguous), state (d_conv - 1, C) contiguous float32,
    updated in place; weight (C, d_conv), bias (C,). Returns (n, C) float32: the conv plus bias,
    through SiLU when `silu`. One launch for up to CONV_ROWS rows (a decode step), else two:
    the outputs' tiles over rows and channels, then the state (no tile may overwrite it while
    another still reads it)."""
    n, channels = x.shape
    d_conv = weight.shape[1]
    if x.stride(1) != 1 or not (state.is_contiguous() and weight.is_contiguous() and bias.is_contiguous()):
        raise ValueError("ssm_conv: x's channels, the state, the weight and the bias must be contiguous.")
    if out is None:
        out = torch.empty((n, channels), dtype=torch.float32, device=x.device)
    ptr, count, from_ptr = _n_valid_args(n_valid, n)
    block_c = min(CONV_CHANNELS, triton.next_power_of_2(channels))
    row_blocks = triton.cdiv(n, CONV_ROWS)
    args = (x, state, weight, bias, out, ptr if from_ptr else state, n, count, channels, x.stride(0), out.stride(0))
    meta = dict(D_CONV=d_conv, SILU=silu, NVALID_PTR=from_ptr, BLOCK_T=CONV_ROWS, BLOCK_C=block_c,
                BLOCK_J=max(1, triton.next_power_of_2(max(d_conv - 1, 1))), num_warps=4, **pdl.launch(x.device))
    together = row_blocks == 1
    _conv_kernel[(triton.cdiv(channels, block_c), row_blocks)](*args, CONV=True, UPDATE=together and d_conv > 1, **meta)
    if not together and d_conv > 1:
        _conv_kernel[(triton.cdiv(channels, block_c), 1)](*args, CONV=False, UPDATE=True, **meta)
    return out


@triton.jit
def _softplus(x):
    """ggml_compute_softplus_f32: x above 20, else log(1 + exp(x)), with log1p's accuracy for
    small exp(x) (log(u) * e / (u - 1), u = 1 + e: exact where 1 + e rounds)."""
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, lp)


@triton.jit
def _scan_inputs(dt_ptr, x_ptr, b_ptr, c_ptr, z_ptr, t, n, head, rows, bc, rm, m2, sdt, sx, sb, sc, sz,
                 HAS_Z: tl.constexpr):
    """Token t's dt, x, B, C and z (zeros past the last token; z is x's stand-in without a gate)."""
    live = t < n
    dt = tl.load(dt_ptr + t * sdt + head, mask=rm & live, other=0.0)
    x = tl.load(x_ptr + t * sx + rows, mask=rm & live, other=0.0)
    B = tl.load(b_ptr + t * sb + bc, mask=m2 & live, other=0.0)
    C = tl.load(c_ptr + t * sc + bc, mask=m2 & live, other=0.0)
    if HAS_Z:
        z = tl.load(z_ptr + t * sz + rows, mask=rm & live, other=0.0)
    else:
        z = x
    return dt, x, B, C, z


@triton.jit(do_not_specialize=["n", "n_valid"])  # one compile for a decode step and a chunk (n = 1 is no constant)
def _scan_kernel(state_ptr, x_ptr, dt_ptr, dtb_ptr, a_ptr, b_ptr, c_ptr, d_ptr, z_ptr, y_ptr, nvalid_ptr,
                 q_ptr, d8_ptr, s8_ptr, i_ptr,
                 n, n_valid, R, head_dim, per_group, d_state, sx, sdt, sb, sc, sz, sy,
                 A_PER_STATE: tl.constexpr, HAS_DTB: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
                 NVALID_PTR: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, Q8: tl.constexpr,
                 PDL: tl.constexpr):
    # Q8: token t's y also as Q8_1 row t (BLOCK_R a multiple of 32, R of 32): the program's
    # BLOCK_R // 32 blocks, quantized as mmvq.quantize_q8_1 does the same fp32 values.
    pdl.wait(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = rows < R
    st = tl.arange(0, BLOCK_S)
    m2 = rm[:, None] & (st < d_state)[None, :]
    head = rows // head_dim
    group = head // per_group
    s = tl.load(state_ptr + rows[:, None] * d_state + st[None, :], mask=m2, other=0.0)
    if A_PER_STATE:  # Mamba-1: a decay per (channel, state)
        A = tl.load(a_ptr + head[:, None] * d_state + st[None, :], mask=m2, other=0.0)
    else:  # Mamba-2: one per head
        A = tl.load(a_ptr + head, mask=rm, other=0.0)[:, None]
    if HAS_DTB:
        dtb = tl.load(dtb_ptr + head, mask=rm, other=0.0)
    if HAS_D:
        D = tl.load(d_ptr + head, mask=rm, other=0.0)
    if NVALID_PTR:
        nv = tl.load(nvalid_ptr).to(tl.int32)
    else:
        nv = n_valid
    bc = group[:, None] * d_state + st[None, :]
    # Token t + 1's inputs are loaded while token t computes: the recurrence waits on nothing
    # but itself (the loads do not depend on the state).
    dt_n, x_n, B_n, C_n, z_n = _scan_inputs(dt_ptr, x_ptr, b_ptr, c_ptr, z_ptr, 0, n, head, rows, bc, rm, m2,
                                            sdt, sx, sb, sc, sz, HAS_Z)
    for t in range(n):
        dt, x, B, Cm, z = dt_n, x_n, B_n, C_n, z_n
        dt_n, x_n, B_n, C_n, z_n = _scan_inputs(dt_ptr, x_ptr, b_ptr, c_ptr, z_ptr, t + 1, n, head, rows, bc, rm, m2,
                                                sdt, sx, sb, sc, sz, HAS_Z)
        if HAS_DTB:
            dt = dt + dtb
        dt = _softplus(dt)
        s_new = s * tl.exp(dt[:, None] * A) + B * (x * dt)[:, None]
        y = tl.sum(s_new * Cm, axis=1)
        if HAS_D:
            y = y + x * D
        if HAS_Z:
            y = (z / (1.0 + tl.exp(-z))) * y
        tl.store(y_ptr + t * sy + rows, y, mask=rm)
        if Q8:
            qb = tl.program_id(0) * (BLOCK_R // 32) + tl.arange(0, BLOCK_R // 32)
            _store_q8_1(tl.reshape(y, (BLOCK_R // 32, 32)), t, qb, tl.arange(0, 32), qb < R // 32, R, R // 32,
                        q_ptr, d8_ptr, s8_ptr, i_ptr, BLOCK_R // 32, False)
        s = tl.where(t < nv, s_new, s)  # padding rows leave the state where the last real row put it
    tl.store(state_ptr + rows[:, None] * d_state + st[None, :], s, mask=m2)


def scan_shapes(fn: str, state, x, dt, A, B, C, z):
    """(n_head, head_dim, d_state, n, rows, n_group) of a scan's arguments (ssm_scan's doc), or one
    sentence naming `fn` where they do not fit."""
    n_head, head_dim, d_state = state.shape
    n, rows = x.shape
    n_group = B.shape[1] // d_state
    for name, t in (("x", x), ("dt", dt), ("B", B), ("C", C), ("z", z)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"{fn}: {name}'s last dim must be contiguous.")
    if not (state.is_contiguous() and A.is_contiguous()) or rows != n_head * head_dim or n_head % n_group:
        raise ValueError(f"{fn}: the state and A must be contiguous, x (n, n_head * head_dim), B and C (n, n_group * d_state).")
    return n_head, head_dim, d_state, n, rows, n_group


def ssm_scan(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             n_valid=None, dt_bias: torch.Tensor | None = None, D: torch.Tensor | None = None,
             z: torch.Tensor | None = None, out: torch.Tensor | None = None, block_r: int | None = None,
             q8: bool = False):
    """state (n_head, head_dim, d_state) contiguous float32, updated in place; x (n, n_head *
    head_dim); dt (n, n_head) before its softplus (dt_bias (n_head,) added first); A (n_head,
    d_state) (Mamba-1) or (n_head,) (Mamba-2); B, C (n, n_group * d_state); D (n_head,) the skip;
    z (n, n_head * head_dim) the gate. 2-D inputs may have any row stride, their last dim
    contiguous. Returns y (n, n_head * head_dim) float32: (scan + x * D) * SiLU(z); with `q8`
    (rows a multiple of 32), (y, y's mmvq.Q8Act), the Q8_1 blocks written by the scan's programs."""
    n_head, head_dim, d_state, n, rows, n_group = scan_shapes("ssm_scan", state, x, dt, A, B, C, z)
    if out is None:
        out = torch.empty((n, rows), dtype=torch.float32, device=x.device)
    ptr, count, from_ptr = _n_valid_args(n_valid, n)
    block_s = triton.next_power_of_2(d_state)
    # A program's tokens run one after another, each waiting on its loads: many small programs
    # (~128 state elements, one warp) let an SM hide one's latency behind the others'.
    # (block_r: an override for scripts/gpu_ssmgpu.py's sweep.)
    block_r = block_r or max(1, min(triton.next_power_of_2(rows), ELEMENTS // block_s))
    xq = None
    if q8:  # whole Q8_1 blocks per program (Mamba-1's 16 states: 32 rows, 512 elements, 4 warps)
        if rows % 32:
            raise ValueError(f"ssm_scan: q8 wants rows a multiple of 32, got {rows}.")
        block_r = max(32, block_r)
        dev = x.device
        xq = Q8Act.empty(n, rows, dev)
    warps = max(1, min(4, block_r * block_s // 128))
    q_args = (xq.qs, xq.d, xq.s, xq.isum) if q8 else (out, out, out, out)
    _scan_kernel[(triton.cdiv(rows, block_r),)](
        state, x, dt, dt_bias if dt_bias is not None else A, A, B, C, D if D is not None else A,
        z if z is not None else x, out, ptr if from_ptr else A, *q_args, n, count, rows, head_dim, n_head // n_group, d_state,
        x.stride(0), dt.stride(0), B.stride(0), C.stride(0), z.stride(0) if z is not None else 0, out.stride(0),
        A_PER_STATE=A.dim() == 2, HAS_DTB=dt_bias is not None, HAS_D=D is not None, HAS_Z=z is not None,
        NVALID_PTR=from_ptr, BLOCK_R=block_r, BLOCK_S=block_s, Q8=q8, num_warps=warps,
        # The q8 scan follows the dt projection's GEMV directly (no bias-add launch between): launched
        # early beside it under PDL, the step ran 0.48 ms slower on the Mamba-1.4B twin (session 14,
        # call 2; 0.15 ms faster without PDL), so it starts when that GEMV has finished.
        **(pdl.launch(x.device) if not q8 else {"PDL": False}))
    return (out, xq) if q8 else out
