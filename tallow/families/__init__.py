"""The family registry: what tallow knows about each GGUF architecture, declared once per family.

A family file here (torch-free, so `tallow plan`/`inspect` never import torch) declares:
  - `architecture`: the GGUF `general.architecture` it reads;
  - `tensors`: its tensor-name table (`tensors.TensorTable`: role -> GGUF name template);
  - `layer_kinds`: the kinds of layer it builds (spec.LAYER_KINDS: full attention, sliding
    window, shared-KV reader; recurrent is reserved for the SSM families) — spec_from_gguf
    refuses a file whose layers come out of another kind;
  - `layers(md, hp)`: its GGUF metadata keys -> per-layer `LayerSpec`s (the shared keys every
    family reads are already parsed into `hp`, spec.Hparams; `md` reads and checks the rest);
    and `attn_scale`, `embed_scale`, `rope_style`, `per_layer_input_dim`;
  - `model`: "module:Class" of its forward pass (tallow/models/<family>.py, imported only when
    a model is built).

Adding a family (e.g. the SSM issue's mamba2) takes:
  1. tallow/families/<family>.py: a `Family` subclass as above (new tensor roles: add llama.cpp's
     spelling to tensors.NAMES, or pass them as `extra=` to its TensorTable);
  2. its line in `_FAMILY_CLASSES` below;
  3. tallow/models/<family>.py: the model class (`load_layer` asks `self.tensor_names` for every
     name; `block` is its forward); its kernels under tallow/kernels/ (with a tests/kernel_cases.py case);
  4. its tiny random-weight writer in tests/tiny_models.py, naming tensors through the same table.
A new layer kind (recurrent) also needs its memory (memory/) and its constant in spec.LAYER_KINDS.
Porting a family written the old way: move its `if arch == ...` branch of spec_from_gguf into
`layers`/`attn_scale`/`embed_scale`, its `_ROPE_STYLE` entry into `rope_style`, its FAMILIES entry
into `model`, and replace each "blk.{i}.<name>.weight" string in load_layer and the writer with
`tn(role)` where tn = the table's block(i) (the role is llama.cpp's LLM_TENSOR_* name lowercased).
"""

from __future__ import annotations

import importlib

from ..errors import ModelFileError
from .base import Family
from .gemma3 import Gemma3
from .gemma4 import Gemma4
from .llama import Llama
from .qwen import Qwen2, Qwen3

_FAMILY_CLASSES: tuple[type[Family], ...] = (Llama, Qwen2, Qwen3, Gemma3, Gemma4)

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
