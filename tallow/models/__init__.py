"""Model families by GGUF architecture name."""

from __future__ import annotations

from ..gguf_file import GGUFFile
from ..spec import ModelSpec
from .base import DecoderModel
from .gemma3 import Gemma3Model
from .falcon_h1 import FalconH1Model
from .gemma4 import Gemma4Model
from .llama import LlamaModel
from .mamba import MambaModel
from .qwen import Qwen2Model, Qwen3Model
from .qwen3moe import Qwen3MoeModel

FAMILIES: dict[str, type[DecoderModel]] = {
    "llama": LlamaModel,
    "qwen2": Qwen2Model,
    "qwen3": Qwen3Model,
    "qwen3moe": Qwen3MoeModel,
    "gemma3": Gemma3Model,
    "gemma4": Gemma4Model,
    "mamba": MambaModel,
    "mamba2": MambaModel,
    "falcon-h1": FalconH1Model,
}


def build_model(gf: GGUFFile, spec: ModelSpec, linear_mode: str | None = None, device: str = "cpu",
                weight_cache=None) -> DecoderModel:
    """weight_cache: a memory/weight_cache.WeightCache to map packed layers from (None: pack them)."""
    return FAMILIES[spec.architecture](gf, spec, linear_mode, device, weight_cache)
