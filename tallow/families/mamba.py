"""mamba (Mamba-1: conv1d + selective scan) and mamba2 (SSD, multi-head with groups, gated
RMSNorm): no attention layers, a fixed recurrent state per layer. Their hyperparameters and
state sizes are read by tallow/ssm_spec.py (shared with falcon-h1's mixer)."""

from __future__ import annotations

from .. import spec as spec_module
from ..gguf_file import GGUFFile
from ..spec import RECURRENT, ModelSpec
from ..ssm_spec import ssm_model_spec
from .base import Family
from .llama import MODEL_ROLES
from .tensors import TensorTable

SSM_ROLES = ("ssm_in", "ssm_conv1d", "ssm_dt", "ssm_a", "ssm_d", "ssm_out")


class Mamba(Family):
    architecture = "mamba"
    model = "tallow.models.mamba:MambaModel"
    tensors = TensorTable(*MODEL_ROLES, "attn_norm", *SSM_ROLES, "ssm_x")
    layer_kinds = (RECURRENT,)

    def spec(self, gf: GGUFFile) -> ModelSpec:
        return ssm_model_spec(gf, spec_module)  # no attention keys at all: its own reading


class Mamba2(Mamba):
    architecture = "mamba2"
    tensors = TensorTable(*MODEL_ROLES, "attn_norm", *SSM_ROLES, "ssm_norm")
