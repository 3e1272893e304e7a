"""GGUF tensor names by role: the one place a tensor's name is spelled.

A role is what a tensor is for (`attn_q`: the query projection of block i; `output`: the
output projection); its name template is how GGUF files spell it, as llama.cpp's
LLM_TENSOR_NAMES table (src/llama-arch.cpp) spells it: block tensors carry `{i}`, and a
suffix (`weight`, `bias`) is added per use. Role keys follow llama.cpp's LLM_TENSOR_* enum
names lowercased (LLM_TENSOR_ATTN_OUT -> "attn_out" -> "blk.{i}.attn_output").

Each family declares the roles it uses (`TensorTable`); model files ask it for names
(`load_layer`), the tiny test writers name their tensors through it, and the memory plan
and the kernels receive roles (`OUTPUT`, `TOKEN_EMBD`, `PER_LAYER_TOKEN_EMBD`), never names.
"""

from __future__ import annotations

from collections.abc import Mapping

# Model-wide roles the memory plan and the kernels treat specially.
TOKEN_EMBD = "token_embd"  # the token embedding table: rows read from the file per lookup
OUTPUT = "output"  # the output projection (absent: tied to TOKEN_EMBD)
OUTPUT_NORM = "output_norm"
ROPE_FREQS = "rope_freqs"
EXPERT = "expert"  # one routed expert's slice of a 3-D tensor: the row-exact torch kernels (kernels/cpu/moe.py)
PER_LAYER_TOKEN_EMBD = "per_layer_token_embd"  # gemma4's per-layer table: rows read from the file too

# role -> GGUF name template (without its .weight/.bias suffix), from llama-arch.cpp.
NAMES: dict[str, str] = {
    TOKEN_EMBD: "token_embd",
    OUTPUT_NORM: "output_norm",
    OUTPUT: "output",
    ROPE_FREQS: "rope_freqs",
    "attn_norm": "blk.{i}.attn_norm",
    "attn_q": "blk.{i}.attn_q",
    "attn_k": "blk.{i}.attn_k",
    "attn_v": "blk.{i}.attn_v",
    "attn_out": "blk.{i}.attn_output",
    "attn_q_norm": "blk.{i}.attn_q_norm",
    "attn_k_norm": "blk.{i}.attn_k_norm",
    "attn_post_norm": "blk.{i}.post_attention_norm",
    "ffn_norm": "blk.{i}.ffn_norm",
    "ffn_gate": "blk.{i}.ffn_gate",
    "ffn_up": "blk.{i}.ffn_up",
    "ffn_down": "blk.{i}.ffn_down",
    "ffn_post_norm": "blk.{i}.post_ffw_norm",
    "layer_out_scale": "blk.{i}.layer_output_scale",
    PER_LAYER_TOKEN_EMBD: "per_layer_token_embd",
    "per_layer_model_proj": "per_layer_model_proj",
    "per_layer_proj_norm": "per_layer_proj_norm",
    "per_layer_inp_gate": "blk.{i}.inp_gate",
    "per_layer_proj": "blk.{i}.proj",
    "per_layer_post_norm": "blk.{i}.post_norm",
    # Mixture-of-experts blocks (qwen3moe, gemma4 26B-A4B: the MoE issue).
    "ffn_gate_inp": "blk.{i}.ffn_gate_inp",
    "ffn_gate_exps": "blk.{i}.ffn_gate_exps",
    "ffn_up_exps": "blk.{i}.ffn_up_exps",
    "ffn_down_exps": "blk.{i}.ffn_down_exps",
    "ffn_gate_up_exps": "blk.{i}.ffn_gate_up_exps",
    "ffn_gate_shexp": "blk.{i}.ffn_gate_shexp",
    "ffn_up_shexp": "blk.{i}.ffn_up_shexp",
    "ffn_down_shexp": "blk.{i}.ffn_down_shexp",
    "ffn_post_norm_1": "blk.{i}.post_ffw_norm_1",
    "ffn_post_norm_2": "blk.{i}.post_ffw_norm_2",
    "ffn_pre_norm_2": "blk.{i}.pre_ffw_norm_2",
    # Recurrent (Mamba-style) blocks (mamba, mamba2, falcon-h1: the SSM issue).
    "ssm_in": "blk.{i}.ssm_in",
    "ssm_conv1d": "blk.{i}.ssm_conv1d",
    "ssm_x": "blk.{i}.ssm_x",
    "ssm_dt": "blk.{i}.ssm_dt",
    "ssm_a": "blk.{i}.ssm_a",
    "ssm_d": "blk.{i}.ssm_d",
    "ssm_norm": "blk.{i}.ssm_norm",
    "ssm_out": "blk.{i}.ssm_out",
}


def tensor_name(role: str, i: int | None = None, suffix: str = "weight") -> str:
    """The GGUF name of `role` (block `i` for a block tensor), e.g. ("attn_q", 3) ->
    "blk.3.attn_q.weight"."""
    return _spell(role, NAMES[role], i, suffix)


def _spell(role: str, template: str, i: int | None, suffix: str) -> str:
    if ("{i}" in template) != (i is not None):
        raise ValueError(f"tensor role {role!r} ({template}) {'needs a' if i is None else 'takes no'} block index")
    return (template.format(i=i) if i is not None else template) + (f".{suffix}" if suffix else "")


class TensorTable:
    """The tensors one family uses: a subset of NAMES' roles plus any of its own (`extra`:
    role -> template, for a tensor no other family has). Asking for a role the family did not
    declare is a programming error (KeyError), so a model file cannot drift from its table."""

    def __init__(self, *roles: str, extra: Mapping[str, str] | None = None):
        extra = dict(extra or {})
        for role, template in extra.items():
            if NAMES.get(role, template) != template:
                raise ValueError(f"tensor role {role!r} is already spelled {NAMES[role]!r}")
        unknown = [r for r in roles if r not in NAMES]
        if unknown:
            raise ValueError(f"unknown tensor roles {unknown} (add them to NAMES or pass them as extra)")
        self.templates = {**{r: NAMES[r] for r in roles}, **extra}

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self.templates)

    def name(self, role: str, i: int | None = None, suffix: str = "weight") -> str:
        """The GGUF name of this family's `role` (KeyError: a role it did not declare)."""
        return _spell(role, self.templates[role], i, suffix)

    def role_of(self, name: str) -> tuple[str, int | None, str] | None:
        """(role, block index, suffix) of a GGUF tensor name, or None if no role of this family
        spells it: the inverse of `name`, for checking a file or a writer against the table."""
        stem, _, suffix = name.rpartition(".")
        for stem, suffix in ((stem, suffix), (name, "")):  # "blk.3.ssm_a": no suffix (ssm_a, ssm_d, falcon-h1's ffn_norm)
            index = None
            parts = stem.split(".")
            if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
                index, stem = int(parts[1]), ".".join(["blk", "{i}", *parts[2:]])
            for role, template in self.templates.items():
                if template == stem:
                    return role, index, suffix
        return None

    def block(self, i: int):
        """Names of block i's tensors: `tn = table.block(3); tn("attn_q")` -> "blk.3.attn_q.weight"."""
        return lambda role, suffix="weight": self.name(role, i, suffix)


def is_tied(tensors: Mapping[str, object]) -> bool:
    """Whether the output projection is the token embedding table (the file has no `output`)."""
    return tensor_name(OUTPUT) not in tensors


def model_roles(tensors: Mapping[str, object]) -> dict[str, str]:
    """name -> role for the model-wide tensors of a file that the plan and kernels treat
    specially (the embedding tables and the output projection), for those the file holds."""
    roles = (TOKEN_EMBD, OUTPUT, PER_LAYER_TOKEN_EMBD)
    return {tensor_name(r): r for r in roles if tensor_name(r) in tensors}
