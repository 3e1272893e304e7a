"""The two recurrent ops of a Mamba layer, as ggml's CPU kernels compute them (ggml-cpu/ops.cpp:
ssm_conv, ssm_scan), in float32.

`causal_conv`: a depthwise conv1d over the last d_conv inputs of each channel, the layer's conv
state supplying the d_conv - 1 inputs before this call's first row.

`selective_scan`: per token t, per head h (and its head_dim channels, and d_state states):
    dt' = softplus(dt[t, h])                       (ggml: x > 20 gives x)
    s   = s * exp(dt' * A[h]) + B[t, g(h)] * (x[t, h] * dt')
    y   = sum over states of s * C[t, g(h)]
A is (n_head, d_state) for Mamba-1 (one decay per channel and state; there head_dim is 1) and
(n_head,) for Mamba-2 (one per head). g(h) = h // (n_head / n_group).

Both take `n_valid`: only rows 0..n_valid-1 advance the state (rows after are padding, e.g. a
captured graph's bucket); their outputs are computed and meaningless. n_valid may be a (1,)
device tensor (a graph's chunk length, read on the device: no host branch on it).
`selective_scan` is the sequential reference, one token at a time — the same arithmetic whatever rows share a call,
so a chunked prefill leaves bit for bit the state a one-token-at-a-time decode does.

`blocked_scan` (opt-in, TALLOW_SSM_BLOCKED_SCAN=1): the decays, the B·x·dt inputs and the
outputs of a block of tokens are computed in one operation each, and only the recurrence
s = s·decay + input stays a loop, one `addcmul_` per token (within 1e-5 of the reference, not
bit-identical). Not the default: not measured faster (docs/performance.md, issue 17).
"""

from __future__ import annotations

import torch


def softplus_ggml(x: torch.Tensor) -> torch.Tensor:
    """ggml_compute_softplus_f32: log(1 + exp(x)), and x itself above 20."""
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(torch.clamp(x, max=20.0))))


def _per_head(t: torch.Tensor, per_group: int) -> torch.Tensor:
    """(n, n_group, d_state) -> (n, n_head, d_state), each group's row once per head of it (an
    expand and a copy: no host-side size computation, so a CUDA graph can capture it)."""
    if per_group == 1:
        return t
    n, groups, d_state = t.shape
    return t.unsqueeze(2).expand(n, groups, per_group, d_state).reshape(n, groups * per_group, d_state)


def causal_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                n_valid: int | None = None) -> torch.Tensor:
    """x (n, C) new inputs, state (d_conv - 1, C) the inputs before them (updated in place to the
    last d_conv - 1 valid inputs), weight (C, d_conv), bias (C,). Returns the conv output (n, C)
    with the bias added (before the activation)."""
    n, d_conv = x.shape[0], weight.shape[1]
    n_valid = n if n_valid is None else n_valid
    window = torch.cat([state, x])  # (d_conv - 1 + n, C)
    # Tap by tap in ggml's order: sum = 0; sum += s[k] * w[k] for k = 0..d_conv-1.
    y = window[0:n] * weight[:, 0]
    for k in range(1, d_conv):
        y = y + window[k : k + n] * weight[:, k]
    if isinstance(n_valid, torch.Tensor):  # a device count (a captured graph's padded chunk): no host branch
        state.copy_(window.index_select(0, n_valid + torch.arange(d_conv - 1, device=x.device)))
    else:
        state.copy_(window[n_valid : n_valid + d_conv - 1])
    return y + bias


def selective_scan(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, n_valid: int | None = None) -> torch.Tensor:
    """state (n_head, head_dim, d_state), updated in place; x (n, n_head, head_dim); dt (n, n_head)
    before its softplus; A (n_head, d_state) or (n_head,); B, C (n, n_group, d_state).
    Returns y (n, n_head, head_dim)."""
    n, n_head = dt.shape
    n_valid = n if n_valid is None else n_valid
    per_group = n_head // B.shape[1]
    dts = softplus_ggml(dt)  # (n, n_head)
    Bh = _per_head(B, per_group)  # (n, n_head, d_state)
    Ch = _per_head(C, per_group)
    x_dt = x * dts.unsqueeze(-1)  # (n, n_head, head_dim)
    y = torch.empty_like(x)
    s = state.clone()
    for t in range(n):
        if A.dim() == 2:  # Mamba-1: a decay per (channel, state)
            decay = torch.exp(dts[t].unsqueeze(-1) * A).unsqueeze(1)  # (n_head, 1, d_state)
        else:  # Mamba-2: one per head
            decay = torch.exp(dts[t] * A).view(n_head, 1, 1)
        s = s * decay + Bh[t].unsqueeze(1) * x_dt[t].unsqueeze(-1)
        y[t] = (s * Ch[t].unsqueeze(1)).sum(-1)
        if isinstance(n_valid, torch.Tensor):  # a device count: the state follows every row before it
            state.copy_(torch.where(t < n_valid, s, state))
        elif t == n_valid - 1:
            state.copy_(s)
    return y


# A block's per-token states (l, n_head, head_dim, d_state) float32 stay under this many elements.
BLOCK_ELEMENTS = 1 << 20  # 4 MiB: 1 << 22 was 2-4x slower on one thread (out of cache)


def blocked_scan(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, n_valid: int | None = None) -> torch.Tensor:
    """`selective_scan`, with everything but the recurrence itself batched over blocks of tokens."""
    n, n_head = dt.shape
    n_valid = n if n_valid is None else n_valid
    per_group = n_head // B.shape[1]
    dts = softplus_ggml(dt)
    Bh = _per_head(B, per_group)  # (n, n_head, d_state)
    Ch = _per_head(C, per_group)
    if A.dim() == 2:
        decay = torch.exp(dts.unsqueeze(-1) * A).unsqueeze(2)  # (n, n_head, 1, d_state)
    else:
        decay = torch.exp(dts * A).view(n, n_head, 1, 1)
    block = max(1, min(n, BLOCK_ELEMENTS // state.numel()))
    y = torch.empty_like(x)
    s = state
    for a in range(0, n, block):
        b = min(n, a + block)
        states = (x[a:b] * dts[a:b].unsqueeze(-1)).unsqueeze(-1) * Bh[a:b].unsqueeze(2)  # the inputs, then the states
        for t in range(b - a):
            states[t].addcmul_(s, decay[a + t])  # s_t = input_t + s_{t-1} * decay_t
            s = states[t]
            if isinstance(n_valid, torch.Tensor):
                state.copy_(torch.where(a + t < n_valid, s, state))
            elif a + t == n_valid - 1:
                state.copy_(s)
        y[a:b] = (states * Ch[a:b].unsqueeze(2)).sum(-1)
        s = s.clone() if b < n else s  # the next block's first step reads it; this block's buffer goes
    return y
