"""falcon-h1: attention and a Mamba-2 mixer side by side in every block, then a SwiGLU MLP. The
attention layers are read as every attention family's; the mixer (ssm_spec.py) and llama.cpp's
`attention.scale` are added on top (ssm_spec.hybrid_model_spec)."""

from __future__ import annotations

from .. import spec as spec_module
from ..gguf_file import GGUFFile
from ..spec import ModelSpec
from ..ssm_spec import hybrid_model_spec
from .base import Family
from .llama import BLOCK_ROLES, MODEL_ROLES
from .mamba import SSM_ROLES
from .tensors import TensorTable


class FalconH1(Family):
    architecture = "falcon-h1"
    model = "tallow.models.falcon_h1:FalconH1Model"
    # blk.N.ffn_norm carries no .weight suffix in the files llama.cpp b11434 loads
    tensors = TensorTable(*MODEL_ROLES, *BLOCK_ROLES, *SSM_ROLES, "ssm_norm")

    def spec(self, gf: GGUFFile) -> ModelSpec:
        return hybrid_model_spec(gf, super().spec(gf), spec_module)
