"""The Mamba mixer's two recurrent ops, chosen once per model by device: the conv1d with its
SiLU, and the selective scan with the mixer's D skip and SiLU(z) gate after it.

On the CPU one C call each (kernels/cpu/c_ssm.py, ssm_step.c; TALLOW_CPU_C_SSM=0, a call it does
not take, or no built library: kernels/cpu/ssm.py's torch references, op for op what models/mamba.py
computed before this module existed, also the GPU's with TALLOW_SSM_TRITON=0); on the GPU one
Triton launch each (kernels/triton/ssm.py). Both update the layer's states in place and take
`n_valid` (None, a host int, or a (1,) device tensor inside a captured graph): rows from
n_valid on never advance a state.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from .. import switches
from .cpu import c_ssm
from .cpu.ssm import blocked_scan, causal_conv, selective_scan


def ssm_triton_enabled() -> bool:
    return switches.enabled("TALLOW_SSM_TRITON")


class TorchMixerOps:
    def epilogue(self, dt_proj, out_proj, n: int) -> bool:
        """Whether the scan takes the dt projection's bias and writes y's Q8_1 for the
        out-projection (TritonMixerOps, Mamba-1 decode); the torch ops never do."""
        return False

    def conv(self, x, state, weight, bias, n_valid=None) -> torch.Tensor:
        """SiLU(causal conv1d of x (n, C) after the state (d_conv - 1, C), plus bias)."""
        return F.silu(causal_conv(x, state, weight, bias, n_valid))

    def scan(self, state, x, dt, A, B, C, n_valid=None, dt_bias=None, D=None, z=None, q8=False) -> torch.Tensor:
        """(selective scan + x * D) * SiLU(z) over x (n, n_head * head_dim), dt (n, n_head) (+ dt_bias),
        B and C (n, n_group * d_state); state (n_head, head_dim, d_state). Returns (n, n_head * head_dim)."""
        n, (n_head, head_dim, d_state) = x.shape[0], state.shape
        scan = blocked_scan if switches.enabled("TALLOW_SSM_BLOCKED_SCAN") else selective_scan
        xh = x.reshape(n, n_head, head_dim)
        y = scan(state, xh, dt if dt_bias is None else dt + dt_bias, A, B.reshape(n, -1, d_state),
                 C.reshape(n, -1, d_state), n_valid)
        if D is not None:
            y = y + xh * D.view(n_head, 1)
        y = y.reshape(n, n_head * head_dim)
        return y if z is None else F.silu(z) * y


class CMixerOps(TorchMixerOps):
    """The C ops where a call fits them (CPU float32, every row valid), else the torch reference."""

    def __init__(self):
        # each conv kernel's (d_conv, C) copy, made at its first call: id -> (a weak reference to the
        # kernel, the copy); a dead reference means the id was reused, and the copy is made again
        self.transposed: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        # whether a layer's fixed scan inputs (state, A, dt_bias, D) fit the C call, asked once:
        # id(state) -> (weak references to the state and A, the answer)
        self.fixed_ok: dict[int, tuple[weakref.ref, weakref.ref, bool]] = {}

    def conv(self, x, state, weight, bias, n_valid=None) -> torch.Tensor:
        if _all_rows(x, n_valid) and c_ssm.fits(x, state, weight, bias) and _dense(state, bias):
            ref, wt = self.transposed.get(id(weight), (None, None))
            if ref is None or ref() is not weight:
                wt = weight.t().contiguous()
                self.transposed[id(weight)] = (weakref.ref(weight), wt)
            return c_ssm.conv(x, state, wt, bias)
        return super().conv(x, state, weight, bias, n_valid)

    def scan(self, state, x, dt, A, B, C, n_valid=None, dt_bias=None, D=None, z=None, q8=False) -> torch.Tensor:
        if _all_rows(x, n_valid) and c_ssm.fits(x, dt, B, C, z) and self._fixed_fit(state, A, dt_bias, D):
            return c_ssm.scan(state, x, dt, A, B, C, dt_bias, D, z)
        return super().scan(state, x, dt, A, B, C, n_valid, dt_bias, D, z)

    def _fixed_fit(self, state, A, dt_bias, D) -> bool:
        ref_s, ref_a, ok = self.fixed_ok.get(id(state), (None, None, False))
        if ref_s is None or ref_s() is not state or ref_a() is not A:
            ok = _dense(state, A, dt_bias, D) and c_ssm.fits(state, A, dt_bias, D)
            self.fixed_ok[id(state)] = (weakref.ref(state), weakref.ref(A), ok)
        return ok


def _all_rows(x: torch.Tensor, n_valid) -> bool:
    return n_valid is None or (isinstance(n_valid, int) and n_valid == x.shape[0])


def _dense(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or t.is_contiguous() for t in tensors)


class TritonMixerOps:
    def __init__(self, scan_rows: int | None = None):
        self.scan_rows = scan_rows  # rows of the state per scan program (None: ssm_scan's choice; tests: fewer programs)

    def epilogue(self, dt_proj, out_proj, n: int) -> bool:
        """Mamba-1 decode (TALLOW_SSM_SCAN_EPILOGUE): the scan adds the dt projection's bias before
        its softplus (the same float add the projection's own launch did) and writes y's Q8_1
        blocks for an integer-dot out-projection, two launches fewer a layer. Only where both
        projections are GPULinears that take those paths for n rows."""
        from .gpu.linear import GEMV_MAX_ROWS, GPULinear

        return (switches.enabled("TALLOW_SSM_SCAN_EPILOGUE") and n <= GEMV_MAX_ROWS
                and isinstance(dt_proj, GPULinear) and dt_proj.bias is not None
                and isinstance(out_proj, GPULinear) and out_proj.dense is None and out_proj.use_mmvq
                and out_proj.use_gemv and out_proj.in_features % 32 == 0)

    def conv(self, x, state, weight, bias, n_valid=None) -> torch.Tensor:
        from .triton.ssm import ssm_conv

        return ssm_conv(x, state, weight, bias, n_valid, silu=True)

    def scan(self, state, x, dt, A, B, C, n_valid=None, dt_bias=None, D=None, z=None, q8=False):
        """`q8`: y with its Q8_1 blocks, as a gpu.linear.SharedQ8 the out-projection reads directly."""
        from .triton.ssm import ssm_scan

        if not q8:
            if A.dim() == 1 and ssd_chunked(x.shape[0]):
                from .triton.ssd import ssd_scan

                return ssd_scan(state, x, dt, A, B, C, n_valid, dt_bias, D, z)
            return ssm_scan(state, x, dt, A, B, C, n_valid, dt_bias, D, z, block_r=self.scan_rows)
        from .gpu.linear import SharedQ8

        y, xq = ssm_scan(state, x, dt, A, B, C, n_valid, dt_bias, D, z, block_r=self.scan_rows, q8=True)
        return SharedQ8(y, q8=xq)


def ssd_chunked(n: int) -> bool:
    """Whether a Mamba-2 scan over n rows takes the chunked SSD form (TALLOW_SSD_CHUNKED, a prefill
    chunk of SSD_MIN_ROWS or more) rather than the token-by-token scan (decode, short chunks)."""
    from .triton.ssd import SSD_MIN_ROWS

    return n >= SSD_MIN_ROWS and switches.enabled("TALLOW_SSD_CHUNKED")


def mixer_ops(device: torch.device) -> TorchMixerOps | TritonMixerOps:
    if device.type == "cuda":
        return TritonMixerOps() if ssm_triton_enabled() else TorchMixerOps()
    return CMixerOps() if c_ssm.usable() else TorchMixerOps()
