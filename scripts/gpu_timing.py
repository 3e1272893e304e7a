"""Microseconds one call of a kernel takes, for the device scripts' kernel tables (gpu_ssd.py,
gpu_prefill_split.py, gpu_ssmgpu.py): a warm-up, then CUDA events around `reps` back-to-back calls
(on a CPU device, the wall clock)."""
import time

import torch


def time_us(fn, reps: int = 20, warmup: int = 3, device: str = "cuda") -> float:
    for _ in range(warmup):
        fn()
    if device != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps * 1e6
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3
