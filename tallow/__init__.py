"""tallow: quantized GGUF inference, greedy-identical to llama.cpp."""

from .api import LLM, Completion, load
from .errors import TallowError

__all__ = ["LLM", "Completion", "TallowError", "load"]
__version__ = "0.1.0"
