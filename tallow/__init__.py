"""tallow: quantized GGUF inference, greedy-identical to llama.cpp.

    import tallow
    llm = tallow.load("smollm2-135m")
    print(llm.generate("The capital of France is", max_tokens=16).text)
"""

import os
from typing import Any

from . import switches as _switches
from .errors import TallowError

# oneDNN's AMX bf16 GEMMs (Sapphire Rapids and later) round a row differently for different row
# counts, so a prompt served from the prefix cache would no longer give a cold prefill's bits.
# Capped here, before torch's first operation reads the ISA (TALLOW_CPU_AMX=1: leave it).
if not _switches.enabled("TALLOW_CPU_AMX"):
    os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")

__all__ = ["LLM", "Completion", "TallowError", "load"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The API pulls in torch and the model code; import it on first use so that light
    # commands (tokenize, models, plan) and submodule imports stay fast.
    if name in ("LLM", "Completion", "load"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'tallow' has no attribute {name!r}")
