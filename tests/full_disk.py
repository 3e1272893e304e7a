"""A file handle that fails as a full disk does, for the tests of saves that must survive one."""

from __future__ import annotations

import errno
import os
from typing import Any


class FullDisk:
    """Wraps an open file: writes go through until `room` bytes have been written (the first
    write always goes through, whatever its size), then each raises ENOSPC."""

    def __init__(self, f: Any, room: int = 0) -> None:
        self.f, self.left, self.writes = f, room, 0

    def write(self, data: bytes) -> int:
        if self.writes and len(data) > self.left:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.writes += 1
        self.left = max(0, self.left - len(data))
        return self.f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> "FullDisk":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.f.close()
