"""The state-space families' hyperparameters (GGUF `mamba`, `mamba2`), read as llama.cpp's
loaders read them (src/models/mamba.cpp, mamba2.cpp: the `{arch}.ssm.*` keys).

Kept apart from spec.py so the family registry can take it whole, and free of torch because
the memory plan (memory/budget.py) reads it before anything is loaded.

A recurrent layer carries two fixed-size states, whatever the context length:
  conv state  the last d_conv - 1 inputs of its causal conv1d: (d_conv - 1) x conv_channels
  SSM state   (n_head, head_dim, d_state): Mamba-1 has one "head" per inner channel
              (n_head = d_inner, head_dim = 1) and a per-(channel, state) decay A;
              Mamba-2 has n_head heads of head_dim channels, one scalar decay per head, and
              B/C shared by the heads of each of n_group groups.
Both are float32, as llama.cpp keeps them (its type_r/type_s default F32).
"""

from __future__ import annotations

from dataclasses import dataclass

SSM_ARCHITECTURES = ("mamba", "mamba2")  # pure state-space: no attention layers
HYBRID_ARCHITECTURES = ("falcon-h1",)  # attention and a Mamba-2 mixer side by side in every block

STATE_BYTES = 4  # float32
# Copies of the state a speculative verification pass holds beside the live one: the state at
# the pass's start, from which a rollback re-folds the accepted rows (memory/recurrent.py).
VERIFY_COPIES = 1


@dataclass(frozen=True)
class SSMSpec:
    version: int  # 1: Mamba (selective scan, per-state decay), 2: Mamba-2 (SSD, per-head decay)
    d_conv: int
    d_inner: int
    d_state: int
    dt_rank: int  # Mamba-1: the rank of the dt projection; Mamba-2: the number of heads
    n_group: int  # Mamba-2's B/C groups (Mamba-1: 1)
    dt_b_c_rms: bool  # Mamba-1 variants (FalconMamba) RMS-normalize dt, B and C
    layers: tuple[int, ...]  # the recurrent layers (all of them for mamba/mamba2)

    @property
    def n_head(self) -> int:
        return self.d_inner if self.version == 1 else self.dt_rank

    @property
    def head_dim(self) -> int:
        return 1 if self.version == 1 else self.d_inner // self.dt_rank

    @property
    def conv_channels(self) -> int:
        """Channels the conv1d runs over: x (Mamba-1), or x, B and C side by side (Mamba-2)."""
        return self.d_inner if self.version == 1 else self.d_inner + 2 * self.n_group * self.d_state

    @property
    def conv_state_bytes(self) -> int:
        return (self.d_conv - 1) * self.conv_channels * STATE_BYTES

    @property
    def ssm_state_bytes(self) -> int:
        return self.d_inner * self.d_state * STATE_BYTES

    @property
    def layer_state_bytes(self) -> int:
        """Bytes one recurrent layer's two states hold (fixed: no term grows with the context)."""
        return self.conv_state_bytes + self.ssm_state_bytes

    @property
    def state_bytes(self) -> int:
        return len(self.layers) * self.layer_state_bytes

    def mixer_activation_bytes(self, c: int) -> int:
        """Peak transient float32 activations of one mixer over a chunk of c tokens (models/mamba.py):
        the in-projection, the conv window and output and its SiLU, the x/dt/B/C projections,
        the scan's x·dt, output and per-token state copies, the gated output."""
        proj = 2 * self.d_inner + (self.conv_channels - self.d_inner) + (self.n_head if self.version == 2 else 0)
        per_token = proj + 3 * self.conv_channels + (self.dt_rank + 2 * self.d_state + self.d_inner) + 4 * self.d_inner
        return (c * per_token + (self.d_conv - 1) * self.conv_channels + 3 * self.d_inner * self.d_state) * STATE_BYTES


def ssm_spec_from_gguf(gf, n_layers: int, dim: int, read_int, read_bool) -> SSMSpec:
    """The SSM hyperparameters of a mamba/mamba2 file. read_int(key, lo, hi) / read_bool(key):
    spec.py's checked readers (a bad value is one sentence naming the key)."""
    arch = gf.architecture
    version = 1 if arch == "mamba" else 2
    d_conv = read_int("ssm.conv_kernel", 1, 64)
    d_inner = read_int("ssm.inner_size", 1, 1 << 20)
    d_state = read_int("ssm.state_size", 1, 1 << 12)
    dt_rank = read_int("ssm.time_step_rank", 1, 1 << 20)
    n_group = read_int("ssm.group_count", 1, 1 << 12) if version == 2 else 1
    from .errors import ModelFileError

    if arch == "mamba" and d_inner != 2 * dim:  # llama.cpp refuses the same files
        raise ModelFileError(f"{gf.path}: Mamba's inner size {d_inner} is not twice the embedding size {dim} "
                             f"(llama.cpp supports only an expansion factor of 2).")
    if version == 2 and (d_inner % dt_rank or d_inner % n_group or dt_rank % n_group):
        raise ModelFileError(f"{gf.path}: Mamba-2's inner size {d_inner}, {dt_rank} heads and {n_group} groups do "
                             f"not divide evenly.")
    return SSMSpec(version, d_conv, d_inner, d_state, dt_rank, n_group,
                   read_bool("ssm.dt_b_c_rms") if version == 1 else False, tuple(range(n_layers)))


def ssm_model_spec(gf, spec_module):
    """The ModelSpec of a pure state-space file: no attention layers (`layers` is empty), the
    recurrent layers in `ssm`. spec_module: tallow.spec (its checked readers and ModelSpec)."""
    import numpy as np

    s = spec_module
    arch, path = gf.architecture, gf.path

    def key(name: str) -> str:
        return f"{arch}.{name}"

    def need(name: str):
        value = gf.arch_get(name)
        if value is None:
            raise s.ModelFileError(f"{path}: the metadata key {key(name)} is missing.")
        return value

    def read_int(name: str, lo: int, hi: int) -> int:
        return s._int(need(name), key(name), path, lo, hi)

    def read_bool(name: str) -> bool:
        value = gf.arch_get(name, False)
        if not isinstance(value, (bool, np.bool_)):
            raise s.ModelFileError(f"{path}: the metadata key {key(name)} is {s._kind(value)}, not a boolean.")
        return bool(value)

    n_layers = read_int("block_count", 1, s.MAX_LAYERS)
    dim = read_int("embedding_length", 1, s.MAX_WIDTH)
    ssm = ssm_spec_from_gguf(gf, n_layers, dim, read_int, read_bool)
    embd = gf.tensors.get("token_embd.weight")
    if embd is None:
        raise s.ModelFileError(f"{path}: the tensor token_embd.weight is missing.")
    if len(embd.shape) != 2 or embd.shape[0] != dim or embd.shape[1] < 1:
        raise s.ModelFileError(f"{path}: the tensor token_embd.weight has shape {list(embd.shape)}, not [{dim}, vocabulary].")
    name = gf.get("general.name")
    return s.ModelSpec(
        architecture=arch, name=str(name) if isinstance(name, str) and name else path, n_layers=n_layers, dim=dim,
        ffn_dim=0, n_heads=0, n_kv_heads=0, head_dim=0, v_head_dim=0, vocab_size=embd.shape[1],
        context_length=s._int(gf.arch_get("context_length", 1 << 20), key("context_length"), path, 1, s.MAX_CONTEXT),
        norm_eps=s._float(gf.arch_get("attention.layer_norm_rms_epsilon", 1e-5), key("attention.layer_norm_rms_epsilon"), path),
        rope_base=10000.0, rope_dim=0, rope_style="neox", rope_scale=1.0, attn_scale=1.0, embed_scale=1.0,
        final_logit_softcap=None, attn_logit_softcap=None, tied_embeddings="output.weight" not in gf.tensors,
        layers=(), ssm=ssm,
    )


def ssm_layer_lines(ssm: SSMSpec) -> list[str]:
    """`tallow inspect`'s lines on the recurrent layers."""
    kind = "Mamba-1 selective scan" if ssm.version == 1 else (
        f"Mamba-2 SSD, {ssm.n_head} heads of {ssm.head_dim}, {ssm.n_group} group{'s' if ssm.n_group > 1 else ''}")
    return [
        "recurrent layers",
        f"  {kind}: d_inner {ssm.d_inner}, d_state {ssm.d_state}, conv kernel {ssm.d_conv}, layers 0-{len(ssm.layers) - 1}"
        if ssm.layers else "  none",
        f"  state per layer        {ssm.layer_state_bytes} bytes (conv {ssm.conv_state_bytes} + SSM {ssm.ssm_state_bytes}),"
        f" fixed: {ssm.state_bytes} bytes in all at any context",
    ]


def hybrid_model_spec(gf, spec, spec_module):
    """A falcon-h1 spec: spec.py's attention layers (read from the usual attention keys) plus the
    Mamba-2 mixer beside them in every block. llama.cpp scales Q·K by `attention.scale` where a
    file sets it (else 1/sqrt(head size), as spec.py has it); Falcon-H1's other multipliers are
    folded into the weights by its converter, so the file carries none."""
    import dataclasses

    s = spec_module
    arch, path = gf.architecture, gf.path

    def need(name: str):
        value = gf.arch_get(name)
        if value is None:
            raise s.ModelFileError(f"{path}: the metadata key {arch}.{name} is missing.")
        return value

    def read_int(name: str, lo: int, hi: int) -> int:
        return s._int(need(name), f"{arch}.{name}", path, lo, hi)

    ssm = ssm_spec_from_gguf(gf, spec.n_layers, spec.dim, read_int, lambda name: False)
    scale = gf.arch_get("attention.scale")
    attn_scale = spec.attn_scale
    if scale is not None and s._float(scale, f"{arch}.attention.scale", path) != 0.0:
        attn_scale = float(scale)
    return dataclasses.replace(spec, ssm=ssm, attn_scale=attn_scale)
