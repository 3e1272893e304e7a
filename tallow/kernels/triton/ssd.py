"""Mamba-2's selective scan over a prefill chunk in the chunked SSD form (TALLOW_SSD_CHUNKED), for
mamba2 and falcon-h1: the same sums as ssm.ssm_scan's token-by-token recurrence, re-associated so
most of the work is matrix products on the tensor cores.

Mamba-2 decays a whole head's state by one scalar a token: with a_t = dt_t * A (dt after its
softplus) and the within-chunk running sums cs_t = a_1 + ... + a_t, the recurrence
s_t = exp(a_t) s_{t-1} + (dt_t x_t) B_t^T, y_t = s_t C_t unrolls over a chunk of L tokens that
enters with state s_0 into

    y_t   = exp(cs_t) (s_0 C_t) + sum_{u <= t} exp(cs_t - cs_u) (C_t . B_u) dt_u x_u
    s_end = exp(cs_L) s_0 + sum_u exp(cs_L - cs_u) dt_u x_u B_u^T

(the Mamba-2 paper's "state space duality"). The first line is two products per chunk, C s_0^T
and the (L, L) matrix C B^T masked to u <= t and scaled by the decay segments, times X; the
second one more, X^T (weighted) times B. C B^T is the same for every head of a group, so a launch
of its own (_cb_kernel) writes it once per chunk and group (it was ~60% of the products when each
program made its own). Then one program owns one head's block of BLOCK_P state rows and walks the
chunks in order; the state stays in the layer's state tensor (L2-resident), read
and rewritten in BLOCK_N-wide column tiles once per chunk. The decays and their sums are fp32;
the products run as three-pass TF32 ("tf32x3", about fp32's accuracy: the token-by-token scan is
fp32 throughout and greedy tokens must stay llama.cpp's).

Padding rows (t >= n_valid, a captured graph's) get dt = 0: a decay of exp(0) = 1 and no input,
so they leave the state exactly where the last real row put it, as the token-by-token scan's
`where` does. Their outputs are computed and meaningless. n_valid is a host int or a (1,) int64
device tensor (a graph replays at any chunk length).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .ssm import _n_valid_args, _softplus, scan_shapes

__all__ = ["ssd_scan", "SSD_MIN_ROWS"]

SSD_MIN_ROWS = 32  # below this many rows (decode, speculation's verification) the token-by-token scan
# Tokens per chunk, state rows and columns per tile, warps: the fastest of scripts/gpu_ssd.py's sweep on
# Falcon-H1-1.5B's layer (session 15, call 1: 221 µs for 512 tokens against 305 for (64, 32, 64, 4); call 3,
# with C B^T in its own launch: still the best on all four Falcon-H1 shapes, 137 µs). More rows per program
# mean fewer programs for 132 SMs, wider tiles and longer chunks more registers.
CHUNK, BLOCK_P, BLOCK_N, WARPS = 64, 16, 32, 4
PRECISION = "tf32x3"


@triton.jit(do_not_specialize=["n"])
def _cb_kernel(b_ptr, c_ptr, g_ptr, n, d_state, sb, sc, n_group,
               L: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    """G = C B^T of one chunk and group, (L, L): every head of the group reads the same one."""
    pdl.wait(PDL)
    chunk, group = tl.program_id(0), tl.program_id(1)
    t = chunk * L + tl.arange(0, L)
    tm = t < n
    G = tl.zeros((L, L), dtype=tl.float32)
    for n0 in range(0, d_state, BLOCK_N):
        nn = n0 + tl.arange(0, BLOCK_N)
        m = tm[:, None] & (nn < d_state)[None, :]
        Bc = tl.load(b_ptr + t[:, None] * sb + group * d_state + nn[None, :], mask=m, other=0.0)
        Cc = tl.load(c_ptr + t[:, None] * sc + group * d_state + nn[None, :], mask=m, other=0.0)
        G += tl.dot(Cc, tl.trans(Bc), input_precision=PRECISION)
    tt = tl.arange(0, L)
    tl.store(g_ptr + ((chunk * n_group + group) * L + tt[:, None]) * L + tt[None, :], G)


@triton.jit(do_not_specialize=["n", "n_valid"])
def _ssd_kernel(state_ptr, x_ptr, dt_ptr, dtb_ptr, a_ptr, b_ptr, c_ptr, d_ptr, z_ptr, y_ptr, nvalid_ptr, g_ptr,
                n, n_valid, head_dim, per_group, n_group, d_state, sx, sdt, sb, sc, sz, sy,
                HAS_DTB: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, NVALID_PTR: tl.constexpr,
                L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                PDL: tl.constexpr):
    pdl.wait(PDL)
    head = tl.program_id(1)
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < head_dim
    rows = head * head_dim + p  # the program's channels of x, z and y, and rows of the flattened state
    group = head // per_group
    bc0 = group * d_state
    A = tl.load(a_ptr + head)
    if HAS_DTB:
        dtb = tl.load(dtb_ptr + head)
    if HAS_D:
        D = tl.load(d_ptr + head)
    if NVALID_PTR:
        nv = tl.load(nvalid_ptr).to(tl.int32)
    else:
        nv = n_valid
    tt = tl.arange(0, L)
    causal = tt[:, None] >= tt[None, :]  # (t, u): u at or before t
    for c0 in range(0, n, L):
        t = c0 + tt
        tm = t < n
        dt = tl.load(dt_ptr + t * sdt + head, mask=tm, other=0.0)
        if HAS_DTB:
            dt = dt + dtb
        dt = tl.where(t < nv, _softplus(dt), 0.0)  # padding and the tail past n: no decay, no input
        cs = tl.cumsum(dt * A, axis=0)
        last = tl.sum(tl.where(tt == L - 1, cs, 0.0), axis=0)  # the whole chunk's log-decay
        x = tl.load(x_ptr + t[:, None] * sx + rows[None, :], mask=tm[:, None] & pm[None, :], other=0.0)
        xw = x * (tl.exp(last - cs) * dt)[:, None]  # each token's input as it reaches the chunk's end
        Y = tl.zeros((L, BLOCK_P), dtype=tl.float32)  # C s_0^T
        for n0 in range(0, d_state, BLOCK_N):
            nn = n0 + tl.arange(0, BLOCK_N)
            nm = nn < d_state
            m_tn = tm[:, None] & nm[None, :]
            Bc = tl.load(b_ptr + t[:, None] * sb + bc0 + nn[None, :], mask=m_tn, other=0.0)
            Cc = tl.load(c_ptr + t[:, None] * sc + bc0 + nn[None, :], mask=m_tn, other=0.0)
            s_ptrs = state_ptr + rows[:, None] * d_state + nn[None, :]
            m_pn = pm[:, None] & nm[None, :]
            S = tl.load(s_ptrs, mask=m_pn, other=0.0)
            Y += tl.dot(Cc, tl.trans(S), input_precision=PRECISION)
            S = S * tl.exp(last) + tl.dot(tl.trans(xw), Bc, input_precision=PRECISION)
            tl.store(s_ptrs, S, mask=m_pn)
        G = tl.load(g_ptr + ((c0 // L * n_group + group) * L + tt[:, None]) * L + tt[None, :])  # C B^T (_cb_kernel)
        seg = tl.where(causal, cs[:, None] - cs[None, :], 0.0)
        M = tl.where(causal, G * tl.exp(seg) * dt[None, :], 0.0)
        y = Y * tl.exp(cs)[:, None] + tl.dot(M, x, input_precision=PRECISION)
        if HAS_D:
            y = y + x * D
        if HAS_Z:
            z = tl.load(z_ptr + t[:, None] * sz + rows[None, :], mask=tm[:, None] & pm[None, :], other=0.0)
            y = (z / (1.0 + tl.exp(-z))) * y
        tl.store(y_ptr + t[:, None] * sy + rows[None, :], y, mask=tm[:, None] & pm[None, :])
        tl.debug_barrier()  # this chunk's state tiles stored before any thread of the program reads the next's


def ssd_scan(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             n_valid=None, dt_bias: torch.Tensor | None = None, D: torch.Tensor | None = None,
             z: torch.Tensor | None = None, out: torch.Tensor | None = None, chunk: int | None = None,
             block_p: int | None = None, block_n: int | None = None, warps: int | None = None,
             precision: str | None = None) -> torch.Tensor:
    """ssm.ssm_scan's Mamba-2 case (A (n_head,), one decay per head), the same arguments and result:
    state (n_head, head_dim, d_state) contiguous float32, updated in place; x (n, n_head * head_dim);
    dt (n, n_head) before its softplus (dt_bias added first); B, C (n, n_group * d_state); D the
    skip, z the gate. Returns y (n, n_head * head_dim) float32. chunk / block_p / block_n / warps /
    precision: overrides for scripts/gpu_ssd.py's sweep and the interpreter tests."""
    if A.dim() != 1:
        raise ValueError("ssd_scan: Mamba-2 only (A (n_head,), one decay per head).")
    n_head, head_dim, d_state, n, rows, n_group = scan_shapes("ssd_scan", state, x, dt, A, B, C, z)
    if out is None:
        out = torch.empty((n, rows), dtype=torch.float32, device=x.device)
    ptr, count, from_ptr = _n_valid_args(n_valid, n)
    block_p = block_p or max(16, min(BLOCK_P, triton.next_power_of_2(head_dim)))
    block_n = block_n or max(16, min(BLOCK_N, triton.next_power_of_2(d_state)))
    chunk = chunk or CHUNK
    precision = precision or PRECISION
    G = torch.empty((triton.cdiv(n, chunk), n_group, chunk, chunk), dtype=torch.float32, device=x.device)
    _cb_kernel[(G.shape[0], n_group)](B, C, G, n, d_state, B.stride(0), C.stride(0), n_group, L=chunk,
                                      BLOCK_N=max(16, min(64, triton.next_power_of_2(d_state))), PRECISION=precision,
                                      num_warps=4, **pdl.launch(x.device))
    _ssd_kernel[(triton.cdiv(head_dim, block_p), n_head)](
        state, x, dt, dt_bias if dt_bias is not None else A, A, B, C, D if D is not None else A,
        z if z is not None else x, out, ptr if from_ptr else A, G, n, count, head_dim, n_head // n_group, n_group, d_state,
        x.stride(0), dt.stride(0), B.stride(0), C.stride(0), z.stride(0) if z is not None else 0, out.stride(0),
        HAS_DTB=dt_bias is not None, HAS_D=D is not None, HAS_Z=z is not None, NVALID_PTR=from_ptr,
        L=chunk, BLOCK_P=block_p, BLOCK_N=block_n, PRECISION=precision,
        num_warps=warps or WARPS, **pdl.launch(x.device))
    return out
