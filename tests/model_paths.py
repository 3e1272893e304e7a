"""Where the tests find real GGUF models: `<dir>/<name>.gguf` in, in order,
$TALLOW_TEST_MODELS, tallow's model cache (where `tallow pull` puts them) and /root/models."""

from __future__ import annotations

import os
from pathlib import Path

KNOWN_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct")


def model_dirs() -> list[Path]:
    dirs = []
    env = os.environ.get("TALLOW_TEST_MODELS")
    if env:
        dirs.append(Path(env))
    from tallow.registry import models_dir  # honours $TALLOW_HOME and $XDG_CACHE_HOME, like `tallow pull`

    dirs.append(models_dir())
    dirs.append(Path("/root/models"))
    return dirs


def model_path(name: str) -> Path | None:
    """The first `<dir>/<name>.gguf` that exists, or None (tests then skip with that reason)."""
    for d in model_dirs():
        p = d / f"{name}.gguf"
        if p.is_file():
            return p
    return None


def require_model(name: str) -> Path:
    """The model's path; skip when missing, or fail when TALLOW_REQUIRE_MODELS=1 (CI)."""
    import pytest

    path = model_path(name)
    if path is None:
        if os.environ.get("TALLOW_REQUIRE_MODELS") == "1":
            pytest.fail(f"model {name} is required (TALLOW_REQUIRE_MODELS=1) but was not found; run `tallow pull {name}`")
        pytest.skip(f"model {name} not found; run `tallow pull {name}`")
    return path
