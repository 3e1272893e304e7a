"""A CPU decode step of the llama block (llama, qwen2, qwen3), gemma3's, dense Gemma 4's or Falcon-H1's in one C call (decode_layer.c):
every layer's norms, products, RoPE, K/V write, attention and GLU back to back, with the composed default
path's bits; the rows of a speculative verification too, each as its decode step computes it.

The composed step (models/llama.py's, gemma3.py's or gemma4.py's block) already runs its products, norms and attention in
C, but reaches them through ~13 Python calls and ~25 torch calls a layer; on a small model that costs as much
as the products (docs/performance.md, session 12). `DecodeLayers.for_model` says whether a model's blocks are
the ones decode_layer.c computes, `applies` whether a step and a pool are (one token or up to 8 verified
rows, host start, an f16 pool (rings too: each ring layer writes and reads slot position % ring), the C
products, norms and attention in use), `run` runs it.
One caller at a time per model, as the engine is: `run` points the C layers at the pool it is given.

SwiGLU has to be torch's own SiLU: the C code calls the Sleef expf torch's vectorized kernels use (16 lanes
with its AVX-512 kernels, 8 with its AVX2 ones), found in torch's library, and checks at load that it gives
F.silu's bits (`_vexp_ok`); where that is not so (another torch build, a CPU without AVX2) the composed path
runs. GeGLU reads torch's fp16 GELU of
every fp16 value from a table made at load.

Falcon-H1 (session 13): the llama block with each layer's Mamba-2 mixer beside the attention, as models/falcon_h1.py's
block runs it on one decode row: Q/K/V and the mixer's in-projection in one product, the mixer as one ss_mixer_step
(c_ssm.MixerStep's, built here over the same plans), attn_output(...) + mixer(...). One decode row only (a verification
keeps each row's state: the composed block does that), and only where the composed block would take its C mixer
(TALLOW_CPU_C_MIXER and what it needs), so both paths are the same calls.

ggml's arithmetic (session 14, TALLOW_CPU_GGML_STEP=1, opt-in; the llama block and gemma3's): RoPE, SwiGLU/GeGLU and the
attention as ggml-cpu computes them (ggml_ops.c, TALLOW_NUMERICS=ggml's functions), so that with the C products a decode
step is llama.cpp's own bit for bit; RoPE then reads ggml's angle tables (`_ggml_rope`), and a verification's rows need
no thread-split check (ggml's GLU goes row by row). The composed blocks keep torch's arithmetic: with this on, the C
step is compared with TALLOW_NUMERICS=ggml's composed decode step instead (tests/test_decode_layer.py).

Switches (read per step): TALLOW_CPU_C_LAYER=0 runs the composed blocks; TALLOW_CPU_GGML_STEP=1 ggml's arithmetic.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import os
import weakref

import torch
import torch.nn.functional as F

from ... import switches
from . import c_ssm, ggml_dot

__all__ = ["usable", "DecodeLayers", "swiglu", "silu_rows_match"]

_ABI = 6
GGML_ROPE, GGML_ATTENTION, GGML_GLU = 1, 2, 4  # decode_layer.c's DL_GGML_* bits
GGML_ALL = GGML_ROPE | GGML_ATTENTION | GGML_GLU
_state: dict = {}  # "lib": the library once checked (None: not usable), "why": the reason


class _Layer(ctypes.Structure):
    """decode_layer.c's dl_layer_t."""

    _fields_ = [("qkv", ctypes.c_void_p), ("out", ctypes.c_void_p), ("gate_up", ctypes.c_void_p), ("down", ctypes.c_void_p),
                ("ple_gate", ctypes.c_void_p), ("ple_proj", ctypes.c_void_p),
                ("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p), ("qkv_bias", ctypes.c_void_p),
                ("qk_norm", ctypes.c_void_p), ("v_norm", ctypes.c_void_p), ("post_attn_norm", ctypes.c_void_p),
                ("post_ffw_norm", ctypes.c_void_p), ("ple_post_norm", ctypes.c_void_p), ("out_scale", ctypes.c_void_p),
                ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p),
                ("skh", ctypes.c_int64), ("skt", ctypes.c_int64), ("svh", ctypes.c_int64), ("svt", ctypes.c_int64),
                ("window", ctypes.c_int64), ("ring", ctypes.c_int64), ("n_heads", ctypes.c_int64), ("n_kv", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("v_head_dim", ctypes.c_int64), ("rope_dim", ctypes.c_int64),
                ("ffn", ctypes.c_int64), ("writes_kv", ctypes.c_int32), ("v_is_k", ctypes.c_int32),
                ("mixer", ctypes.c_void_p), ("conv_state", ctypes.c_void_p), ("ssm_state", ctypes.c_void_p),
                ("mixer_in", ctypes.c_int64), ("mixer_act", ctypes.c_int64), ("gcos", ctypes.c_void_p), ("gsin", ctypes.c_void_p)]


class _Model(ctypes.Structure):
    """decode_layer.c's dl_model_t."""

    _fields_ = [("n_layers", ctypes.c_int64), ("dim", ctypes.c_int64), ("ple_dim", ctypes.c_int64),
                ("neox", ctypes.c_int32), ("geglu", ctypes.c_int32), ("eps", ctypes.c_float), ("scale", ctypes.c_float),
                ("gelu", ctypes.c_void_p), ("gelu_ggml", ctypes.c_void_p), ("layers", ctypes.POINTER(_Layer)),
                ("ggml_ops", ctypes.c_int32), ("prescaled_q", ctypes.c_int32)]


# torch's CPU kernel level -> the Sleef expf its vectorized kernels call, and its lanes
_TORCH_VEXP = {"AVX512": ("Sleef_expf16_u10", 16), "AVX2": ("Sleef_expf8_u10", 8)}


def _torch_vexp() -> tuple[int, int] | None:
    """The address and lane count of the expf torch's vectorized CPU kernels call here (Sleef_expf16_u10
    with its AVX-512 kernels, Sleef_expf8_u10 with its AVX2 ones, in libtorch_cpu), or None elsewhere."""
    name, lanes = _TORCH_VEXP.get(torch.backends.cpu.get_cpu_capability(), (None, 0))
    if name is None:
        return None
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        return ctypes.cast(getattr(ctypes.CDLL(path), name), ctypes.c_void_p).value, lanes
    except (OSError, AttributeError):
        return None


@functools.cache  # asked at every verification step; torch's kernel level is fixed when it loads
def vector_lanes() -> int:
    """The float lanes of torch's vectorized CPU kernels here (16 AVX-512, 8 AVX2): its elementwise loops take
    two vectors a step, so SiLU whole blocks of 2 x lanes floats, the fp16 GELU of 4 x lanes halves."""
    return _TORCH_VEXP.get(torch.backends.cpu.get_cpu_capability(), (None, 16))[1]


def _vexp_ok(lib) -> bool:
    """Whether the C SwiGLU gives F.silu(g) * u's bits: values over float32's whole range (both exp
    edges, zeros, subnormals) in a length whose last values take torch's scalar loop."""
    gen = torch.Generator().manual_seed(0)
    g = torch.cat([torch.randn(4000, generator=gen) * s for s in (1.0, 8.0, 40.0)]
                  + [torch.tensor([0.0, -0.0, 88.0, -88.0, 103.0, -103.0, 1e-40, -1e-40, 3e38, -3e38])])
    g = torch.cat([g, g[:29]])  # 12039 values: the last 7 through the scalar loop
    u = torch.randn(g.numel(), generator=gen)
    y = torch.empty_like(g)
    if lib.dl_swiglu(g.data_ptr(), u.data_ptr(), y.data_ptr(), g.numel()):
        return False
    return torch.equal(y.view(torch.int32), (F.silu(g) * u).view(torch.int32))


def _lib():
    """The library with decode_layer.c, its SwiGLU checked against torch's, or None (reason in _state)."""
    if "lib" in _state:
        return _state["lib"]
    lib, why = ggml_dot._load(), ""
    if lib is None or not hasattr(lib, "dl_decode"):
        lib, why = None, "the C library is not built (or is from an older tallow)"
    elif lib.dl_abi_version() != _ABI:
        lib, why = None, "the C library is from another version of tallow; reinstall"
    else:
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.dl_decode.argtypes = [p, p, p, p, i64, i64, i32]
        lib.dl_decode.restype = i32
        lib.dl_set_vexp.argtypes = [p, i32]
        lib.dl_set_vexp.restype = i32
        lib.dl_swiglu.argtypes = [p, p, p, i64]
        lib.dl_swiglu.restype = i32
        vexp = _torch_vexp()
        if vexp is None or not lib.dl_set_vexp(*vexp):
            lib, why = None, "torch does not run its AVX-512 or AVX2 kernels here (its SiLU could not be matched)"
        elif not _vexp_ok(lib):
            lib.dl_set_vexp(None, 0)
            lib, why = None, "this torch build's SiLU gives other bits than the C SwiGLU"
    _state.update(lib=lib, why=why)
    return lib


def usable() -> bool:
    return _lib() is not None


def unavailable_reason() -> str:
    _lib()
    return _state["why"]


def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The C step's SwiGLU on float32 rows (..., n), each row as one call of the step computes it (tests: it
    must equal F.silu(g) * u bit for bit)."""
    g2 = g.reshape(-1, g.shape[-1]).float().contiguous()
    u2 = u.reshape(-1, u.shape[-1]).float().contiguous()
    y = torch.empty_like(g2)
    lib = _lib()
    for gr, ur, yr in zip(g2, u2, y):
        if lib is None or lib.dl_swiglu(gr.data_ptr(), ur.data_ptr(), yr.data_ptr(), gr.numel()):
            raise RuntimeError(f"the C SwiGLU is not usable here: {unavailable_reason()}")
    return y.reshape(g.shape)


def silu_rows_match(m: int, ffn: int, threads: int, geglu: bool = False) -> bool:
    """Whether F.silu over m rows of ffn values gives each value the bits the C SwiGLU gives it row by row.
    torch's CPU loop runs serially under 32768 values (at::internal::GRAIN_SIZE), else splits them into
    equal pieces, one per thread, and each piece takes Sleef's exp on whole blocks (2 vectors, `vector_lanes`)
    and libm's on its last values: the same as row by row when no block or tail moves, i.e. ffn and every
    piece a multiple of the block (tests/test_decode_layer.py checks it at the real models' widths). GeGLU's
    fp16 GELU works in blocks of 2 fp16 vectors over the rows' values flattened."""
    block = (4 if geglu else 2) * vector_lanes()
    total = m * ffn
    if geglu and ffn % block:  # its tail would be the last row's only
        return False
    if total < 32768:
        return True
    pieces = min(max(1, threads), -(-total // 32768))
    return ffn % block == 0 and total % (block * pieces) == 0


def _c_product(linear):
    """The GgmlDotGroup / GgmlDotLinear behind a block's linear (a FusedLinear of one run), or None."""
    from .fused_linear import FusedLinear

    if isinstance(linear, FusedLinear):
        if len(linear.runs) != 1:
            return None
        linear = linear.runs[0]
    return linear if type(linear) in (ggml_dot.GgmlDotGroup, ggml_dot.GgmlDotLinear) else None


class DecodeLayers:
    """A model's layers as decode_layer.c reads them: the products' plans, norms and biases (held here so
    their addresses stay valid), and per KV pool the cache rows of every layer."""

    def __init__(self, model, linears: list[tuple], geglu: bool, mixers: dict | None = None):
        spec = model.spec
        gemma4 = _is_gemma4(model)
        self.plans = []  # ggml_dot._Products: the C plans and the weights they point into
        self.keep = []  # biases made contiguous, the GELU tables, V's norm of ones
        self.layers = (_Layer * len(linears))()
        self.mixers = mixers or {}  # Falcon-H1: layer index -> c_ssm.MixerStep (its states bound per pool)
        for c, (w, parts) in zip(self.layers, zip(model.layers, linears)):
            layer = spec.layers[w.index]
            runs = [None if lin is None else lin if isinstance(lin, ggml_dot._Products)  # Falcon-H1's Q/K/V + in-projection
                    else ggml_dot._Products(lin._weights(), lin.in_features, row_invariant=True) for lin in parts]
            self.plans.append(runs)
            mixer = self.mixers.get(w.index)
            if mixer is not None:
                c.mixer, c.mixer_in, c.mixer_act = mixer.addr, mixer.s.d_in_proj, mixer.act_bytes
            c.qkv, c.out, c.gate_up, c.down, c.ple_gate, c.ple_proj = (r and r.addr for r in runs)
            c.attn_norm, c.ffn_norm = w.attn_norm.data_ptr(), w.ffn_norm.data_ptr()
            for field, name in (("qk_norm", "attn_qk_norm"), ("post_attn_norm", "post_attention_norm"),
                                ("post_ffw_norm", "post_ffw_norm"), ("ple_post_norm", "ple_post_norm"),
                                ("out_scale", "out_scale")):
                t = w.get(name)
                if t is None and name == "attn_qk_norm" and not layer.owns_kv:
                    t = w.get("attn_q_norm")  # a shared-KV layer: one (head_dim,) row for every Q head
                if t is not None:
                    t = t.contiguous()
                    self.keep.append(t)
                    setattr(c, field, t.data_ptr())
            if getattr(parts[0], "bias", None) is not None:
                bias = parts[0].bias.float().contiguous()
                self.keep.append(bias)
                c.qkv_bias = bias.data_ptr()
            c.window = layer.sliding_window or 0
            c.n_heads, c.n_kv, c.head_dim, c.v_head_dim = layer.n_heads, layer.n_kv_heads, layer.head_dim, layer.v_head_dim
            c.rope_dim, c.ffn = layer.rope_dim, parts[3].in_features
            c.writes_kv = int(layer.owns_kv)
            if gemma4:
                c.v_is_k = int(w.index in model.v_is_k)
                if layer.owns_kv:
                    ones = model.v_norm_ones[layer.v_head_dim]
                    self.keep.append(ones)
                    c.v_norm = ones.data_ptr()
        # Each layer's RoPE table (gemma3/gemma4: local and global bases), its pointers renewed when it grows.
        self.tables = {}
        for i, layer in enumerate(spec.layers):
            self.tables.setdefault(layer.rope_key, (model.rope[layer.rope_key], []))[1].append(i)
        self.table_at = {key: (0, 0) for key in self.tables}
        m = self.cmodel = _Model()
        m.n_layers, m.dim, m.ple_dim = len(linears), spec.dim, spec.per_layer_input_dim if gemma4 else 0
        m.neox, m.eps, m.scale = int(spec.rope_style == "neox"), spec.norm_eps, spec.attn_scale
        self.ffns = sorted({c.ffn for c in self.layers})
        if geglu:  # layers.geglu's fp16 GELU of every fp16 value: its bits by construction
            every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
            table = F.gelu(every, approximate="tanh").float()
            self.keep.append(table)
            m.geglu, m.gelu = 1, table.data_ptr()
        # ggml's elementwise arithmetic (TALLOW_CPU_GGML_STEP): the llama block and gemma3's, the families whose
        # TALLOW_NUMERICS=ggml ops were checked against llama.cpp; not Gemma 4 or Falcon-H1 (their verification
        # rows and other blocks would keep torch's arithmetic).
        self.ggml_capable = not gemma4 and not self.mixers
        self.numerics_ggml = False  # TALLOW_NUMERICS=ggml at load: ggml's arithmetic whatever TALLOW_CPU_GGML_STEP says
        self.ggml_mask = GGML_ALL  # which ops take ggml's arithmetic when it is on (scripts measure them one by one)
        m.prescaled_q = int(model.ggml_prescaled_q)
        self.ggml_tables: dict = {}  # rope key -> RotaryTables with ggml's angles, made at the first ggml step
        if m.ple_dim or (geglu and self.ggml_capable):  # numerics.ggml_gelu_table, read by ggml_ops.c's go_geglu
            from ...numerics import ggml_gelu_table

            table = ggml_gelu_table().float().contiguous()
            self.keep.append(table)
            m.gelu_ggml = table.data_ptr()
        # Whether the last layer leaves a delta pending (else it joins the stream: Gemma 4's branch or scale).
        last = model.layers[-1]
        self.pending = last.get("ple_gate") is None and last.get("out_scale") is None
        m.layers = self.layers
        self.pool, self.k0 = None, 0  # the KV pool whose rows self.layers holds (a weakref), its first row's address
        self.addr = ctypes.addressof(m)

    @classmethod
    def for_model(cls, model) -> "DecodeLayers | None":
        """The C step for a model whose every layer decode_layer.c computes: the llama block (llama, qwen2,
        qwen3), gemma3's or dense Gemma 4's, unchanged; all products in the C kernel; else None. Under
        TALLOW_NUMERICS=ggml only where it computes in ggml's arithmetic (the llama block and gemma3's), and
        then always in it: its decode step is that path's composed step bit for bit, in one call."""
        from ...models.falcon_h1 import FalconH1Model
        from ...models.gemma3 import Gemma3Model
        from ...models.llama import LlamaModel
        from ...numerics_mode import GGML

        if model.place.on_gpu or not ggml_dot.usable() or not usable():
            return None
        kind = type(model)
        llama = kind.block is LlamaModel.block and kind.mlp is LlamaModel.mlp
        gemma3 = kind.block is Gemma3Model.block
        gemma4 = _is_gemma4(model)
        falcon = kind.block is FalconH1Model.block and kind.mixer is FalconH1Model.mixer
        ggml = model.numerics == GGML
        if not (llama or gemma3 or gemma4 or falcon) or (ggml and not (llama or gemma3)):
            return None  # (under TALLOW_NUMERICS=ggml: only the blocks the C step computes in ggml's arithmetic)
        if falcon:
            return cls._for_falcon(model)
        spec = model.spec
        if spec.attn_logit_softcap is not None or any(l.n_heads % l.n_kv_heads for l in spec.layers):
            return None
        if gemma4 and model.ops.fused_step:
            return None
        linears = []
        for w in model.layers:
            layer = spec.layers[w.index]
            names = ["attn_qkv" if layer.owns_kv else "attn_q", "attn_output", "ffn_gate_up", "ffn_down"]
            if gemma4 and w.get("ffn_experts") is not None:  # 26B-A4B's routed experts: not here
                return None
            if not gemma4 and not layer.owns_kv:
                return None
            parts = [_c_product(w.get(name)) for name in names]
            ple = [w.get("ple_gate"), w.get("ple_proj")]
            if gemma4 and ple[0] is not None:
                ple = [_c_product(p) for p in ple]
                if any(p is None or p.bias is not None for p in ple):
                    return None
            parts += ple if gemma4 else [None, None]
            if any(p is None for p in parts[:4]) or any(p.bias is not None for p in parts[1:4]):
                return None
            norms = [w.get(n) for n in ("attn_norm", "ffn_norm", "attn_qk_norm", "attn_q_norm", "post_attention_norm",
                                        "post_ffw_norm", "ple_post_norm", "out_scale")]
            if any(t is not None and t.dtype != torch.float32 for t in norms):
                return None
            qk = norms[2] if layer.owns_kv else norms[3]
            want = (layer.n_heads + layer.n_kv_heads, layer.head_dim) if layer.owns_kv else (layer.head_dim,)
            if qk is not None and tuple(qk.shape) != want:
                return None
            linears.append(tuple(parts))
        if (gemma3 or gemma4) and any(p[3].in_features % 64 for p in linears):  # torch's fp16 GELU takes a scalar tail there
            return None
        layers = cls(model, linears, geglu=gemma3 or gemma4)
        layers.numerics_ggml = ggml
        return layers

    @classmethod
    def _for_falcon(cls, model) -> "DecodeLayers | None":
        """Falcon-H1 where every layer is the hybrid block with its products in the C kernel (no biases), the
        mixer one c_ssm.MixerStep takes (Mamba-2), and the composed block would run its C mixer; else None."""
        from ...memory.recurrent import RecurrentState
        from . import c_ssm

        spec, ssm = model.spec, model.spec.ssm
        if (getattr(model, "c_mixers", None) is None or ssm is None or ssm.version != 2 or set(ssm.layers) != set(range(len(model.layers)))
                or spec.attn_logit_softcap is not None or any(l.n_heads % l.n_kv_heads or not l.owns_kv for l in spec.layers)):
            return None
        states = RecurrentState(spec)  # shapes for the build; each pool's own states are bound in _bind
        linears, mixers = [], {}
        for w in model.layers:
            fused = c_ssm.products([w.attn_qkv, w.ssm_in])  # the composed block's plan (models/falcon_h1.py)
            parts = [_c_product(w.get(n)) for n in ("attn_output", "ffn_gate_up", "ffn_down")]
            if fused is None or any(p is None or p.bias is not None for p in parts):
                return None
            if any(t.dtype != torch.float32 for t in (w.attn_norm, w.ffn_norm)):
                return None
            mixer = c_ssm.MixerStep.build(w, ssm, spec.norm_eps, states.conv[w.index], states.scan[w.index], fused)
            if mixer is None:
                return None
            mixers[w.index] = mixer
            linears.append((fused, *parts, None, None))
        return cls(model, linears, geglu=False, mixers=mixers)

    def _bind(self, kv) -> bool:
        """Point every layer at kv's cache rows (a shared-KV layer at its source's, a ring layer with its
        ring's length); False where the pool is not one decode_layer.c writes (quantized, f32/bf16)."""
        if kv.scaled or kv.dtype != torch.float16 or len(kv.k) != len(self.layers):
            return False
        for i, (c, k, v) in enumerate(zip(self.layers, kv.k, kv.v)):
            if k.stride(-1) != 1 or v.stride(-1) != 1 or bool(c.writes_kv) != kv.owns(i):
                return False
            c.k, c.v = k.data_ptr(), v.data_ptr()
            c.skh, c.skt, c.svh, c.svt = k.stride(0), k.stride(1), v.stride(0), v.stride(1)
            c.ring = k.shape[1] if kv.is_ring(i) else 0
        if self.mixers:  # Falcon-H1: each layer's conv and SSM states, contiguous float32 (memory/recurrent.py)
            state = getattr(kv, "state", None)
            if state is None:
                return False
            for i, mixer in self.mixers.items():
                conv, scan = state.conv.get(i), state.scan.get(i)
                if conv is None or scan is None or not c_ssm.fits(conv, scan) or not (conv.is_contiguous() and scan.is_contiguous()):
                    return False
                self.layers[i].conv_state, self.layers[i].ssm_state = conv.data_ptr(), scan.data_ptr()
        owners = [c.k for c in self.layers if c.writes_kv]
        if len(set(owners)) != len(owners):  # two layers writing one cache
            return False
        self.pool, self.k0 = weakref.ref(kv), kv.k[0].data_ptr()
        return True

    def applies(self, step, kv) -> bool:
        """Whether this step runs here: one decode token, or a speculative verification's rows (up to the C
        products' MAX_ROWS, where torch's SiLU computes each row's values as one row's), from a host start;
        switches as the composed path needs them to give these bits (C norms and C attention on, fast
        layers on); and kv bindable."""
        from ...models.step import DECODE, VERIFY

        m = step.ids.shape[0]
        if not step.on_host or not (step.phase == DECODE and m == 1 or step.phase == VERIFY and self._rows_ok(m)):
            return False
        if self.mixers and (m != 1 or kv.keeping_rows or step.scratch.get("n_valid") is not None
                            or not (c_ssm.usable() and c_ssm.mixer_on())):
            return False  # Falcon-H1: one decode row, where the composed block takes its C mixer
        return self._ready(kv)

    def _ready(self, kv) -> bool:
        """The switches on that the composed path needs for these bits (C norms and C attention, fast layers), and kv
        bindable."""
        from ...layers import c_attention_enabled, fast_paths_enabled

        if not (switches.enabled("TALLOW_CPU_C_LAYER") and switches.enabled("TALLOW_CPU_C_NORM")
                and fast_paths_enabled() and c_attention_enabled()):
            return False
        bound = self.pool is not None and self.pool() is kv and kv.k[0].data_ptr() == self.k0
        return bound or self._bind(kv)

    def verifies_in_ggml(self, rows: int, kv) -> bool:
        """Under TALLOW_NUMERICS=ggml, whether a verification of `rows` rows over kv runs here, where its rows are its
        decode steps bit for bit (the composed ggml blocks' are not: more than one row sums as tinyBLAS does, and
        the products take the tiled order from 8 rows): what speculation needs there."""
        return self.numerics_ggml and self._rows_ok(rows) and self._ready(kv)

    def ggml_on(self) -> bool:
        """Whether this step runs ggml's elementwise arithmetic (TALLOW_NUMERICS=ggml at load, else
        TALLOW_CPU_GGML_STEP, read per step)."""
        return self.ggml_capable and (self.numerics_ggml or switches.enabled("TALLOW_CPU_GGML_STEP"))

    def _rows_ok(self, m: int) -> bool:
        if self.ggml_on() and self.ggml_mask & GGML_GLU:  # ggml's GLU goes row by row: no thread split to match
            return m <= ggml_dot.GgmlDotLinear.MAX_ROWS
        threads, geglu = torch.get_num_threads(), bool(self.cmodel.geglu)
        return m <= ggml_dot.GgmlDotLinear.MAX_ROWS and all(silu_rows_match(m, f, threads, geglu) for f in self.ffns)

    def _ggml_rope(self, n: int) -> None:
        """ggml's RoPE tables (RotaryTables' ggml angles: the float recurrence, libm's cosf/sinf) for positions
        0..n-1 of every rope key, made at the first ggml step and grown as the model's own are."""
        for key, (table, layers) in self.tables.items():
            g = self.ggml_tables.get(key)
            if g is None:
                g = self.ggml_tables[key] = copy.copy(table)
                g.ggml = True
                g.cos = g.sin = torch.empty(0, table.rope_dim // 2)
            if g.cos.shape[0] < n:
                g.ensure(n)
                for i in layers:
                    self.layers[i].gcos, self.layers[i].gsin = g.cos_full.data_ptr(), g.sin_signed.data_ptr()

    def run(self, x: torch.Tensor, step, kv, per_layer: torch.Tensor | None = None):
        """x (m, dim) the embedded tokens (per_layer (m, n_layers, d): Gemma 4's per-layer inputs) -> (the
        stream, the last layer's pending delta or None), as `_blocks` returns them; the tokens' K/V written at
        step.start.. in every layer that owns a cache."""
        start, m = step.start, x.shape[0]
        ggml = self.ggml_on()
        self.cmodel.ggml_ops = self.ggml_mask if ggml else 0
        if ggml:
            self._ggml_rope(start + m)
        for key, (table, layers) in self.tables.items():
            # (n, 1, rope_dim) float32, contiguous; `ensure` may have regrown them
            at = table.cos_full.data_ptr(), table.sin_signed.data_ptr()
            if at != self.table_at[key]:
                self.table_at[key] = at
                for i in layers:
                    self.layers[i].cos, self.layers[i].sin = at
        x = x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()
        ple = None
        if self.cmodel.ple_dim:
            per_layer = per_layer if per_layer.dtype == torch.float32 and per_layer.is_contiguous() else per_layer.float().contiguous()
            ple = per_layer.data_ptr()
        delta = torch.empty_like(x)
        rc = _state["lib"].dl_decode(self.addr, x.data_ptr(), delta.data_ptr(), ple, m, start, max(1, torch.get_num_threads()))
        if rc != (0 if self.pending else 1):  # (-4: a mixer given rows; applies() prevents it)
            raise RuntimeError(f"the C decode step failed ({rc})")
        kv.mark_written(start + m - 1)
        return x, delta if self.pending else None


def _is_gemma4(model) -> bool:
    from ...models.gemma4 import Gemma4Model

    return type(model).block is Gemma4Model.block
