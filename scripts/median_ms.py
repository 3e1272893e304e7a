"""The CPU benchmark scripts' timer: one warm-up call, then the median of `reps` calls, in ms."""

from __future__ import annotations

import statistics
import time


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3
