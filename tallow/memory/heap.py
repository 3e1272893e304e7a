"""Keep freed activation memory from staying in the process (glibc's heap), so the peak the
memory plan predicts is the peak the process reaches.

Why: a prefill chunk allocates and frees tens of MiB of temporaries per block. glibc serves
allocations above its mmap threshold with mmap (returned to the OS on free), but the
threshold is *dynamic*: every freed mmapped block raises it to that block's size, so after
the first chunk the large temporaries are carved from the heap and arenas instead, and freed
memory there stays resident. Measured on smollm2-135m, ctx 2048, a 2000-token prompt: the
prefill peak rose 75 MiB above the resident size with glibc's defaults, 50 MiB with the
threshold fixed at 256 KiB (only live bytes resident; the plan's single-chunk account is
51 MiB). But every large temporary then page-faults fresh zeroed pages: the prefill took 72%
more CPU time (7.06 s against 4.11 s, 1.5 M minor faults against 14 k; 4 MiB: +33% and most of
the retention kept). So this is opt-in, and the plan (budget.scratch_bytes) counts the heap
as glibc keeps it by default (docs/performance.md, "Peak memory vs plan").

TALLOW_BOUNDED_HEAP=1 fixes the threshold (for a tight memory budget); the default leaves glibc alone.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 10  # bytes: allocations from here up are mmapped (and unmapped on free)

_done = False


def bounded_heap_enabled() -> bool:
    return os.environ.get("TALLOW_BOUNDED_HEAP", "0").strip().lower() in ("1", "true", "yes", "on")


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
