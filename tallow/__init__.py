"""tallow: quantized GGUF inference, greedy-identical to llama.cpp.

    import tallow
    llm = tallow.load("smollm2-135m")
    print(llm.generate("The capital of France is", max_tokens=16).text)
"""

from typing import Any

from .errors import TallowError

__all__ = ["LLM", "Completion", "TallowError", "load"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The API pulls in torch and the model code; import it on first use so that light
    # commands (tokenize, models, plan) and submodule imports stay fast.
    if name in ("LLM", "Completion", "load"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'tallow' has no attribute {name!r}")
