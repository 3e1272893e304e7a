"""Where the tests find the project's shared data folder (llama.cpp's vocabularies and templates).

The folder is `shared/` beside the checkout: `$TALLOW_SHARED` if set, else `../shared` from the
repository root, else `../../shared` (a worktree one level deeper), else the copy of the files the
tests read in tests/fixtures/shared/ (Gemma 4's vocabulary and llama.cpp's test strings for it), so
a checkout alone runs them. A test whose file is in none of these skips, saying which.
"""

from __future__ import annotations

import atexit
import lzma
import os
import shutil
import tempfile
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
_unpacked: dict[str, Path] = {}


def shared_dirs() -> list[Path]:
    env = os.environ.get("TALLOW_SHARED")
    candidates = [Path(env)] if env else []
    candidates += [_REPO.parent / "shared", _REPO.parent.parent / "shared", _REPO / "tests" / "fixtures" / "shared"]
    return [p for p in candidates if p.is_dir()]


def shared_file(relative: str) -> Path:
    """A file of the shared folder, or skip the test saying which file is missing."""
    import pytest

    path = next((root / relative for root in shared_dirs() if (root / relative).is_file()), None)
    if path is None:
        pytest.skip(f"shared/{relative} not found (set TALLOW_SHARED to the project's shared folder)")
    return path


def vocab_gguf(name: str) -> Path:
    """llama.cpp's vocabulary-only GGUF `ggml-vocab-<name>.gguf`, unpacked once per test session
    from its .xz into a temporary folder (0.2 s for Gemma 4's 15 MB)."""
    if name not in _unpacked:
        packed = shared_file(f"vocab/ggml-vocab-{name}.gguf.xz")
        tmp = Path(tempfile.mkdtemp(prefix="tallow-vocab-"))
        atexit.register(shutil.rmtree, tmp, True)
        out = tmp / packed.name.removesuffix(".xz")
        out.write_bytes(lzma.decompress(packed.read_bytes()))
        _unpacked[name] = out
    return _unpacked[name]
