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
the retention kept). So this is opt-in.

TALLOW_BOUNDED_HEAP=1 fixes the threshold (for a tight memory budget).

Between prefill chunks (TALLOW_HEAP_TRIM, on by default): malloc_trim(0), which gives the
pages of every whole free run inside the heap back to the OS (glibc >= 2.8 walks the free
chunks, not only the top), so the freed temporaries of the chunks before do not stay resident
beside the next chunk's. Each chunk then faults in the pages its first block touches again;
its later blocks reuse them.

Always: one malloc arena (`single_arena`). glibc gives threads that allocate concurrently
arenas of their own, each keeping its own freed chunks, so with torch's intra-op threads the
heap could hold another chunk of freed temporaries per arena, depending on which thread
allocated first: smollm2-135m, ctx 2048, a 2000-token prompt, 2 threads, repeated runs: peak
1.00-1.16x the plan; MALLOC_ARENA_MAX=1 1.03x, one thread 1.00x (measured 2026-11-29). The
plan counts one heap; this makes the process have one.
"""

from __future__ import annotations

import ctypes
import functools

from .. import switches

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 256 << 10  # bytes: allocations from here up are mmapped (and unmapped on free)

_done = False


def bounded_heap_enabled() -> bool:
    return switches.enabled("TALLOW_BOUNDED_HEAP")


@functools.cache
def _glibc():
    """glibc's malloc controls, looked up once (trims run after every prefill chunk); None where the C
    library is another: nothing to tune."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def single_arena() -> bool:
    """One malloc arena for all threads (set before they allocate: arenas made earlier stay)."""
    libc = _glibc()
    return libc is not None and libc.mallopt(M_ARENA_MAX, 1) == 1


def return_freed() -> None:
    """Hand the pages of the heap's free runs back to the OS (glibc keeps them otherwise)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def trim_between_chunks() -> bool:
    return switches.enabled("TALLOW_HEAP_TRIM")


def bound_heap() -> bool:
    """One arena always; with TALLOW_BOUNDED_HEAP=1 also a fixed mmap threshold (and so trim
    threshold). Once per process; True if the threshold is set."""
    global _done
    if _done:
        return _done
    single_arena()
    if not bounded_heap_enabled():
        return _done
    libc = _glibc()
    if libc is None:
        return False
    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD) == 1 and ok
    _done = ok
    return ok
