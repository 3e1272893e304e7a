"""Helpers for files that must survive a crash: a durable rename, and whether a writer still lives.

The KV store, the weight cache and `tallow pull` all write a temp file, fsync it and rename it
over the target; these are the two facts they share."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (POSIX needs the directory entry flushed too)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (a temp file named after a live writer is still being written)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True
