"""The family registry: what tallow knows about each GGUF architecture, declared once per family.

A family file here (torch-free, so `tallow plan`/`inspect` never import torch) subclasses
`base.Family` and declares:
  - `architecture`: the GGUF `general.architecture` it reads;
  - `tensors`: its tensor-name table (`tensors.TensorTable`: role -> GGUF name template);
  - `layer_kinds`: the kinds of layer it builds (spec.LAYER_KINDS: full attention, sliding
    window, shared-KV reader; recurrent is reserved for the SSM families) — spec_from_gguf
    stops on a layer of another kind;
  - `layers(md, hp)`: its GGUF metadata keys -> per-layer `LayerSpec`s (the keys every family
    shares are already read into `hp`, a spec.Hparams; `md`, a spec.Metadata, reads and checks
    its own), and `attn_scale`, `embed_scale`, `rope_style`, `per_layer_input_dim`;
    or, for blocks that are not all attention + MLP, `spec(gf)` itself;
  - `model`: "module:Class" of its forward pass (tallow/models/<family>.py, imported only when
    a model is built).

Adding a family touches:
  1. tallow/families/<family>.py (new): the Family subclass; a tensor role no family has yet
     gets llama.cpp's spelling (src/llama-arch.cpp LLM_TENSOR_NAMES) in tensors.NAMES, or
     `extra=` in its own TensorTable;
  2. this file: its import and its entry in `_FAMILY_CLASSES` (two lines);
  3. tallow/models/<family>.py (new): the model class — `load_layer` takes every name from
     `self.tensor_names` (tn = self.tensor_names.block(i); tn("attn_q")), `block` is its forward;
     its kernels under tallow/kernels/, each with a case in tests/kernel_cases.py;
  4. tests/tiny_models.py: its tiny random-weight writer, naming tensors through the same table
     (family(arch).tensors), and its llama.cpp fixture (scripts/make_fixtures.py).
A new layer kind (recurrent) also brings its memory (memory/) and a LayerSpec/ModelSpec field.

Porting a family written the old way (an `if arch == ...` branch in spec.py, a FAMILIES entry in
models/__init__.py, "blk.{i}.<name>.weight" strings): its SUPPORTED_ARCHITECTURES and _ROPE_STYLE
entries become `architecture` and `rope_style`; its FAMILIES entry `model`; its branch of
spec_from_gguf `layers`/`attn_scale`/`embed_scale`, or a `spec(gf)` override for model-wide
fields (`dataclasses.replace(super().spec(gf), n_experts=...)`) and for recurrent blocks; each
name string in load_layer and in its tiny writer `tn(role)` (or `tn(role, "bias")`, `tn(role, "")`
for a name without suffix), the role being llama.cpp's LLM_TENSOR_* enum lowercased
(LLM_TENSOR_ATTN_OUT -> "attn_out" -> "blk.{i}.attn_output"). tests/test_families.py then checks
that every tensor of its tiny file is spelled by a role of its table.
"""

from __future__ import annotations

import importlib

from ..errors import ModelFileError
from .base import Family
from .gemma3 import Gemma3
from .falcon_h1 import FalconH1
from .gemma4 import Gemma4
from .llama import Llama
from .mamba import Mamba, Mamba2
from .qwen import Qwen2, Qwen3, Qwen3Moe

_FAMILY_CLASSES: tuple[type[Family], ...] = (Llama, Qwen2, Qwen3, Qwen3Moe, Gemma3, Gemma4, Mamba, Mamba2, FalconH1)

FAMILIES: dict[str, Family] = {cls.architecture: cls() for cls in _FAMILY_CLASSES}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(FAMILIES)


def family(architecture: str, path: str = "") -> Family:
    """The family of a GGUF architecture, or the one-sentence ModelFileError for `path`."""
    try:
        return FAMILIES[architecture]
    except KeyError:
        raise ModelFileError(f"{path}: architecture {architecture!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}).") from None


def model_class(architecture: str):
    """The DecoderModel subclass of a family (imports torch)."""
    module, _, name = family(architecture).model.partition(":")
    return getattr(importlib.import_module(module), name)


__all__ = ["FAMILIES", "SUPPORTED_ARCHITECTURES", "Family", "family", "model_class"]
