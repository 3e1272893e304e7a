"""Builds a family's model; which class that is, the family registry says (tallow/families)."""

from __future__ import annotations

from ..families import model_class
from ..gguf_file import GGUFFile
from ..spec import ModelSpec
from .base import DecoderModel


def build_model(gf: GGUFFile, spec: ModelSpec, linear_mode: str | None = None, device: str = "cpu",
                weight_cache=None, numerics: str | None = None) -> DecoderModel:
    """weight_cache: a memory/weight_cache.WeightCache to map packed layers from (None: pack them);
    numerics: the arithmetic numerics_choice.choose gave (None: chosen by the model)."""
    return model_class(spec.architecture)(gf, spec, linear_mode, device, weight_cache, numerics)
