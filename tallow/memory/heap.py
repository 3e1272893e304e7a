"""Keep freed activation memory from staying in the process (glibc's heap), so the peak the
memory plan predicts is the peak the process reaches.

Why: a prefill chunk allocates and frees tens of MiB of temporaries per block. glibc serves
allocations above its mmap threshold with mmap (returned to the OS on free), but the
threshold is *dynamic*: every freed mmapped block raises it to that block's size, so after
the first chunk the large temporaries are carved from the heap and arenas instead, and freed
memory there stays resident. Measured on smollm2-135m, ctx 2048, a 2000-token prompt: the
process peak rose 71 MiB above its resident size against 51 MiB of planned scratch and stayed
there after the answer (peak 10.3% over the plan). Fixing the threshold (mallopt) keeps large
temporaries mmapped: the run's peak fell to the loading peak and the memory came back after
the prefill (docs/performance.md, "Peak memory vs plan").

TALLOW_BOUNDED_HEAP=0 leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 10  # bytes: allocations from here up are mmapped (and unmapped on free)

_done = False


def bounded_heap_enabled() -> bool:
    return os.environ.get("TALLOW_BOUNDED_HEAP", "1").strip().lower() not in ("0", "false", "no", "off")


def bound_heap() -> bool:
    """Fix glibc's mmap threshold (and so its trim threshold) once per process; True if set."""
    global _done
    if _done or not bounded_heap_enabled():
        return _done
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        ok = libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD) == 1 and ok
    except (OSError, AttributeError):
        return False  # not glibc: nothing to tune
    _done = ok
    return ok
