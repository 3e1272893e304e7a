"""CPU decode attention over an f16 cache in C (decode_attention.c): ms per call and the K/V bytes read per
second, over the decode shapes of the CPU models (docs/performance.md, sessions 10 and 12).

    python scripts/c_attention_bench.py [--threads 2] [--against OTHER_BUILD.so] [--torch]

--against: another build of the library (e.g. main's tallow/kernels/cpu/_ggml_dot*.so) timed on the same
inputs, with a check that both give the same bits; --torch: torch's path (the f16 window copied to fp32, SDPA).
Time it alone on the machine (flock -x /tmp/cpu.lock ...).
"""

import argparse
import ctypes
import time

import torch

from tallow.kernels.cpu import c_attention
from tallow.layers import attend_keys

# (query heads, KV heads, head dim, keys): E2B's global and sliding layers, qwen2.5, smollm2, gemma3
SHAPES = [(8, 1, 512, 32768), (8, 1, 256, 512), (12, 2, 128, 4096), (12, 2, 128, 32768), (9, 3, 64, 4096),
          (4, 1, 256, 4096)]


def other_build(path: str):
    lib = ctypes.CDLL(path)
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    abi = lib.tg_abi_version()
    ring = [i64] if abi >= 4 else []  # ABI 4 added the ring length after `end`
    lib.ta_attend_f16.argtypes = [p, i32, i32, i32, i32, p, p, i64, i64, i64, i64, i64, i64, *ring, f32, f32, p, i32]

    def attend(q, k, v, n, threads):
        out = torch.empty(1, q.shape[1] * v.shape[2])
        args = [q.data_ptr(), q.shape[1], k.shape[0], k.shape[2], v.shape[2], k.data_ptr(), v.data_ptr(),
                k.stride(0), k.stride(1), v.stride(0), v.stride(1), 0, n, *([0] if ring else []), 0.1, 0.0,
                out.data_ptr(), threads]
        lib.ta_attend_f16(*args)
        return out

    return attend


def timed(f, n: int) -> float:
    f()
    reps = max(5, int(2e6 / n))
    t = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--against", help="another build of the C library to time beside this tree's")
    ap.add_argument("--torch", action="store_true", help="also time torch's path")
    args = ap.parse_args()
    other = other_build(args.against) if args.against else None
    for heads, n_kv, d, n in SHAPES:
        g = torch.Generator().manual_seed(n)
        q = torch.randn(1, heads, d, generator=g)
        k, v = torch.randn(n_kv, n, d, generator=g).half(), torch.randn(n_kv, n, d, generator=g).half()
        here = lambda: c_attention.attend_f16(q, k, v, 0, n, 0.1, threads=args.threads)  # noqa: E731
        dt, nbytes = timed(here, n), 2 * k.numel() * 2
        line = f"{heads} heads / {n_kv} KV x {d}, {n} keys: {dt * 1e3:.3f} ms ({nbytes / dt / 1e9:.1f} GB/s)"
        if other is not None:
            there = lambda: other(q, k, v, n, args.threads)  # noqa: E731
            same = torch.equal(here(), there())
            line += f"   other build {timed(there, n) * 1e3:.3f} ms, {'same bits' if same else 'OTHER BITS'}"
        if args.torch:
            ref = lambda: attend_keys(q, k.float(), v.float(), 0.1)  # noqa: E731
            err = float((here() - ref()).norm() / ref().norm())
            line += f"   torch {timed(ref, n) * 1e3:.3f} ms (relative difference {err:.1e})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
