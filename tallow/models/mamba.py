"""Mamba (GGUF `mamba`) and Mamba-2 (`mamba2`), as llama.cpp's src/models/mamba.cpp and
mamba-base.cpp build them.

Every block: RMSNorm, a Mamba mixer, the residual. No attention, no MLP, no positions: what a
block knows of earlier tokens is its layer's recurrent state (memory/recurrent.py).

Mamba-1 mixer (build_mamba_layer): in-projection to x and the gate z (d_inner each); a causal
depthwise conv1d of x over d_conv taps (conv state = the d_conv - 1 inputs before), bias, SiLU;
x projected to dt (dt_rank), B and C (d_state each), dt up-projected to d_inner with a bias;
the selective scan with a decay per (channel, state); y + D·x, gated by SiLU(z); out-projection.

Mamba-2 mixer (build_mamba2_layer): in-projection to z (d_inner), xBC (d_inner + 2·n_group·d_state)
and dt (one per head); the conv1d runs over x, B and C together; dt gets a bias; the scan has
one scalar decay per head and B/C shared by each group's heads; y + D·x per head, gated by
SiLU(z), then an RMSNorm per group with its weight; out-projection.

On the CPU a one-row decode step runs the whole mixer as one C call (kernels/cpu/c_ssm.MixerStep,
TALLOW_CPU_C_MIXER=0 for the composed one below; the same bits).

The mixer needs only (layer weights, x, the memory): `mixer(w, h, memory, n_valid)`. Its conv
and scan run through kernels/ssm_ops.py: the torch references on the CPU, one Triton launch each
on the GPU. On the GPU a decode step and a prefill chunk run inside CUDA graphs (engine/graphs.py):
their start is a device tensor, so the host-side position of the state is kept by the graph's
caller (`memory.folding`), and a padded chunk's real length reaches the kernels as a device
tensor (`n_valid`), so padding rows never advance a state.
"""

from __future__ import annotations

import functools

import torch

from ..errors import ModelFileError
from ..kernels.cpu import c_ssm
from ..kernels.ssm_ops import mixer_ops
from ..layers import rms_norm
from ..quant.reference import dequantize
from .base import DecoderModel, LayerWeights


class MambaModel(DecoderModel):
    """Both versions: spec.ssm.version says which mixer a block runs."""

    fused_attention_inputs = False

    def __init__(self, gf, spec, linear_mode=None, device="cpu", weight_cache=None, numerics=None):
        super().__init__(gf, spec, linear_mode, device, weight_cache, numerics)
        self.ssm_ops = mixer_ops(self.device)  # torch on the CPU (or TALLOW_SSM_TRITON=0), else Triton
        # CPU decode: each layer's whole mixer in one C call (TALLOW_CPU_C_MIXER), built at its first
        # step: layer index -> c_ssm.MixerStep, or None where the layer's weights do not fit it
        self.c_mixers: dict[int, c_ssm.MixerStep | None] | None = (
            {} if self.device.type == "cpu" and c_ssm.mixer_usable() else None)

    def small(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A small F32/F16 tensor (conv kernel, A, D, biases, norms) as float32 of `shape`."""
        t = self._tensor(name)
        if int(torch.tensor(t.shape).prod()) != int(torch.tensor(shape).prod()):
            raise ModelFileError(f"{self.gf.path}: the tensor {name} has shape {list(t.shape)}, not {list(reversed(shape))}.")
        return dequantize(t.data, t.qtype, t.n_cols).reshape(shape).clone().float().to(self.device)

    def shaped(self, name: str, cols: int, rows: int) -> str:
        """name, after checking the matrix is [cols, rows] (GGUF order): a wrong shape is one
        sentence at load, not a matmul error mid-answer."""
        shape = list(self._tensor(name).shape)
        if shape != [cols, rows]:
            raise ModelFileError(f"{self.gf.path}: the tensor {name} has shape {shape}, not {[cols, rows]}.")
        return name

    def load_layer(self, i: int) -> LayerWeights:
        ssm, tn, dim = self.spec.ssm, self.tensor_names.block(i), self.spec.dim  # families/mamba.py
        d, ch = ssm.d_inner, ssm.conv_channels
        self.shaped(tn("ssm_in"), dim, 2 * d if ssm.version == 1 else d + ch + ssm.n_head)
        self.shaped(tn("ssm_out"), d, dim)
        if ssm.version == 1:
            self.shaped(tn("ssm_x"), d, ssm.dt_rank + 2 * ssm.d_state)
            self.shaped(tn("ssm_dt"), ssm.dt_rank, d)
        t = {"attn_norm": self.norm_weight(tn("attn_norm")),
             "ssm_out": self.linear(tn("ssm_out")),
             "conv_w": self.small(tn("ssm_conv1d"), (ssm.conv_channels, ssm.d_conv)),
             "conv_b": (self.small(tn("ssm_conv1d", "bias"), (ssm.conv_channels,)) if tn("ssm_conv1d", "bias") in self.gf.tensors
                        else torch.zeros(ssm.conv_channels, device=self.device))}  # falcon-h1 may have none
        if not self.stacks_in_projection():
            t["ssm_in"] = self.linear(tn("ssm_in"))
        if ssm.version == 1:
            t["ssm_x"] = self.linear(tn("ssm_x"))
            t["ssm_dt"] = self.linear(tn("ssm_dt"), tn("ssm_dt", "bias"))
            t["A"] = self.small(tn("ssm_a", ""), (ssm.d_inner, ssm.d_state))
            t["D"] = self.small(tn("ssm_d", ""), (ssm.d_inner,))
        else:
            t["dt_b"] = self.small(tn("ssm_dt", "bias"), (ssm.n_head,))
            t["A"] = self.small(tn("ssm_a", ""), (ssm.n_head,))
            t["D"] = self.small(tn("ssm_d", ""), (ssm.n_head,))
            if tn("ssm_norm") in self.gf.tensors:  # optional in falcon-h1
                t["ssm_norm"] = self.small(tn("ssm_norm"), (ssm.n_group, ssm.d_inner // ssm.n_group))
        return LayerWeights(i, t)

    def stacks_in_projection(self) -> bool:
        """Whether a block's in-projection is built inside a stacked product of the subclass's
        (falcon-h1's with Q/K/V on the GPU) rather than on its own."""
        return False

    # -- forward ---------------------------------------------------------------------------
    def _blocks(self, step, kv):
        if not step.on_host:  # a graph's step: its caller folds the rows in (engine/graphs.py)
            if isinstance(step.logits, torch.Tensor):  # a padded prefill chunk: its last real row, on the device
                step.scratch["n_valid"] = step.logits + 1
            return super()._blocks(step, kv)
        with kv.folding(step.start, step.ids.shape[0]):
            return super()._blocks(step, kv)

    def block(self, w: LayerWeights, x, delta, step, kv):
        x, h = self.ops.add_norm(x, delta, w.attn_norm, self.spec.norm_eps)
        return x, self.mixer(w, h, kv, step.scratch.get("n_valid"))

    def mixer(self, w: LayerWeights, h: torch.Tensor, memory, n_valid=None, proj: torch.Tensor | None = None,
              addend: torch.Tensor | None = None) -> torch.Tensor:
        """The Mamba mixer of layer w over h (n, dim); advances the layer's states in `memory`
        (a memory.recurrent.RecurrentMemory) by rows 0..n_valid-1 (n_valid: None for all, a host
        int, or a (1,) device tensor). Returns (n, dim) — `addend + ` it where an addend is given
        (falcon-h1's attention branch), which the GPU's out-projection adds as it stores its output.
        `proj`: the in-projection's output where the caller computed it (falcon-h1's stacked product)."""
        n = h.shape[0]
        if n == 1 and n_valid is None and not memory.keeping_rows and proj is None:
            step = self.c_mixer(w, memory)
            if step is not None and h.dtype == torch.float32 and h.is_contiguous():
                m = step(h, memory.state.conv[w.index], memory.state.scan[w.index])
                return m if addend is None else addend + m
        if proj is None:
            proj = w.ssm_in(h).float()
        if memory.keeping_rows and n > 1:
            # A speculative verification pass (memory.rows_kept): each row runs the recurrent part
            # as a one-token decode step does, and the memory can fold it again from the pass's
            # start, so a rejected draft rolls back exactly. Only the in/out projections (row-exact)
            # see all rows.
            rows = []
            for r in range(n):
                row = proj[r : r + 1].clone()
                rows.append(self._mix(w, row, memory, None))
                memory.keep_row(w.index, functools.partial(self._mix, w, row, memory, None))
            return self._out(w, torch.cat(rows), addend)
        return self._out(w, self._mix(w, proj, memory, n_valid, q8_out=True), addend)

    def _out(self, w: LayerWeights, y, addend: torch.Tensor | None) -> torch.Tensor:
        if addend is None:
            return w.ssm_out(y)
        if self.place.on_gpu:
            return w.ssm_out(y, addend=addend)  # gpu/linear.GPULinear: the add in the GEMV's epilogue
        return addend + w.ssm_out(y)

    def c_mixer(self, w: LayerWeights, memory, in_plan=None) -> c_ssm.MixerStep | None:
        """The layer's one-call C mixer (decode on the CPU), or None: the composed mixer runs."""
        if self.c_mixers is None or not c_ssm.mixer_on():
            return None
        i = w.index
        if i not in self.c_mixers:
            self.c_mixers[i] = c_ssm.MixerStep.build(w, self.spec.ssm, self.spec.norm_eps, memory.state.conv[i],
                                                     memory.state.scan[i], in_plan)
        step = self.c_mixers[i]
        if step is not None and not (memory.state.conv[i].is_contiguous() and memory.state.scan[i].is_contiguous()):
            return None
        return step

    def _mix(self, w: LayerWeights, proj: torch.Tensor, memory, n_valid, q8_out: bool = False) -> torch.Tensor:
        """The mixer between its in-projection's output proj (n, d_in_proj) and its out-projection:
        conv, scan, skip, gate (and Mamba-2's grouped norm). Returns y (n, d_inner) — with `q8_out`
        on the GPU possibly as y and its Q8_1 blocks for the out-projection (ssm_ops.epilogue)."""
        ssm, state, ops = self.spec.ssm, memory.state, self.ssm_ops
        n, i = proj.shape[0], w.index
        d = ssm.d_inner
        if ssm.version == 1:
            x = ops.conv(proj[:, :d], state.conv[i], w.conv_w, w.conv_b, n_valid)  # SiLU applied
            x_db = w.ssm_x(x).float()
            r, ds = ssm.dt_rank, ssm.d_state
            dt, B, C = x_db[:, :r], x_db[:, r : r + ds], x_db[:, r + ds :]
            if ssm.dt_b_c_rms:  # FalconMamba: weightless RMSNorms of dt, B and C
                dt, B, C = (_rms(v, self.spec.norm_eps) for v in (dt, B, C))
            if q8_out and ops.epilogue(w.ssm_dt, w.ssm_out, n):  # the bias added inside the scan, y's Q8_1 written there
                dt = w.ssm_dt(dt.contiguous(), add_bias=False).float()
                return ops.scan(state.scan[i], x, dt, w.A, B, C, n_valid, dt_bias=w.ssm_dt.bias, D=w.D, z=proj[:, d:], q8=True)
            dt = w.ssm_dt(dt.contiguous()).float()  # (n, d_inner), with its bias
            return ops.scan(state.scan[i], x, dt, w.A, B, C, n_valid, D=w.D, z=proj[:, d:])
        ch, ng, ds = ssm.conv_channels, ssm.n_group, ssm.d_state
        xBC = ops.conv(proj[:, d : d + ch], state.conv[i], w.conv_w, w.conv_b, n_valid)  # SiLU applied
        y = ops.scan(state.scan[i], xBC[:, :d], proj[:, d + ch :], w.A, xBC[:, d : d + ng * ds], xBC[:, d + ng * ds :],
                     n_valid, dt_bias=w.dt_b, D=w.D, z=proj[:, :d])
        if w.get("ssm_norm") is not None and ng == 1:  # one group (falcon-h1): a row's RMSNorm, one launch on the GPU
            y = self.ops.norm(y, w.ssm_norm.view(d), self.spec.norm_eps)
        elif w.get("ssm_norm") is not None:  # the grouped, gated RMSNorm
            y = rms_norm(y.view(n, ng, d // ng), w.ssm_norm, self.spec.norm_eps).reshape(n, d)
        return y


def _rms(v: torch.Tensor, eps: float) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
