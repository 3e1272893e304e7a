"""Check tallow's C kernel (tallow/kernels/cpu/ggml_dot.c) against libggml-cpu b11434's own functions,
bit for bit, on random blocks (dev only: CI has no ggml; tests/test_ggml_dot.py checks the fixture
this writes with --write).

  mkdir -p /tmp/llama && tar xJf ../shared/llama.cpp/llama-b11434-cpu.tar.xz -C /tmp/llama
  PYTHONPATH=$PWD python scripts/cpudot_vs_ggml.py /tmp/llama [--rows 4096] [--write]

What llama.cpp runs for a product in the configuration of the conformance fixtures and
TALLOW_NUMERICS=ggml (scripts/numerics_reference.py's CONFIG: weight repacking off, so no
CPU_REPACK buffer): every quantized weight stays in the file's layout and each row takes
type_traits_cpu[type].vec_dot (ggml_vec_dot_q4_0_q8_0, _q4_1_q8_1, _q5_0_q8_0, _q5_1_q8_1, _q8_0_q8_0, _q4_K_q8_K,
_q5_K_q8_K, _q6_K_q8_K) over activations from the vec_dot_type's from_float (Q8_1 / Q8_0 / Q8_K). This script
calls exactly those, one row at a time. (With repacking on, llama.cpp's default on AVX2 machines,
Q4_K would go through ggml_gemv_q4_K_8x8_q8_K, whose float order differs; the C kernel does not
mirror it.) Prompts: for 8 or more activation rows llama.cpp b11434 takes its tiled K-quant product
(ggml-cpu/tiled) for Q4_K and Q6_K, another float order, which the C kernel follows for 8+ rows;
Q4_0/Q5_0/Q8_0 prompts go to llamafile's tinyBLAS_Q0 (per-output order vec_dot's), Q4_1 stays on vec_dot.
The second check runs whole products of 2, 7, 8, 16 and 40 activation rows through ggml_mul_mat in a
graph of libggml-cpu's own and compares them bit for bit; --write also records 8-row products
(prompt_cases) for tests/test_ggml_dot.py.
"""

from __future__ import annotations

import base64
import ctypes
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from tallow.kernels.cpu import ggml_dot

sys.path.insert(0, str(Path(__file__).resolve().parent))
# libggml-cpu's type traits and function types, as the op-fixture script declares them
from make_ggml_op_fixtures import _FROM_FLOAT, _VEC_DOT, _Traits  # noqa: E402
from make_ggml_op_fixtures import ACT_BLOCK as ACT  # noqa: E402
FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ggml_dot.json"


def random_weight(qtype: QT, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K):  # random codes and scales, sane fp16 super-block scales
        bb = GGML_QUANT_SIZES[qtype][1]
        raw = rng.integers(0, 256, size=(n, k // 256, bb), dtype=np.uint8)
        half = lambda: (rng.uniform(0.2, 2.0, size=(n, k // 256)) * 1e-3).astype(np.float16).view(np.uint8).reshape(n, k // 256, 2)
        if qtype == QT.Q6_K:
            raw[..., 208:210] = half()
        else:
            raw[..., 0:2], raw[..., 2:4] = half(), half()
        return raw.reshape(n, -1)
    return quantize((rng.standard_normal((n, k)) * 0.05).astype(np.float32), qtype)


def activations(k: int, rng: np.random.Generator, variant: int) -> np.ndarray:
    """Heavy-tailed like a residual stream; variant 1 adds an outlier and a zero block, variant 2 ties of
    the largest magnitude with both signs, variant 3 is plain normal."""
    x = (rng.standard_normal(k) * rng.standard_normal(k) ** 2).astype(np.float32)
    if variant == 1:
        x[32:64] = 0
        x[300 % k] = 900.0
    elif variant == 2:
        x[67], x[73] = -40.0, 40.0
    elif variant == 3:
        x = rng.standard_normal(k).astype(np.float32)
    return x


def graph_products(lib_dir: Path, qtype: QT, raw: np.ndarray, k: int, x: np.ndarray, threads: int = 2) -> np.ndarray:
    """ggml_mul_mat(weight, x) computed by libggml-cpu in a graph of its own (no repack buffer, as with
    repacking off): x (M, K) float32 -> (M, N). M picks ggml's path: 1 row vec_dot; 2+ rows llamafile's
    tinyBLAS for Q5_0/Q8_0, vec_dot per row for Q4_1; 8+ rows the tiled K-quant product for Q4_K/Q6_K."""
    C = ctypes
    base = C.CDLL(str(lib_dir / "libggml-base.so.0"), mode=C.RTLD_GLOBAL)
    cpu = C.CDLL(str(lib_dir / "libggml-cpu.so.0"), mode=C.RTLD_GLOBAL)

    class Params(C.Structure):
        _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]

    base.ggml_init.restype = C.c_void_p
    base.ggml_init.argtypes = [Params]
    for f in ("ggml_new_tensor_2d", "ggml_mul_mat", "ggml_new_graph", "ggml_get_data"):
        getattr(base, f).restype = C.c_void_p
    base.ggml_new_tensor_2d.argtypes = [C.c_void_p, C.c_int, C.c_int64, C.c_int64]
    base.ggml_mul_mat.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p]
    base.ggml_new_graph.argtypes = [C.c_void_p]
    base.ggml_build_forward_expand.argtypes = [C.c_void_p, C.c_void_p]
    base.ggml_get_data.argtypes = [C.c_void_p]
    base.ggml_free.argtypes = [C.c_void_p]
    cpu.ggml_graph_compute_with_ctx.argtypes = [C.c_void_p, C.c_void_p, C.c_int]
    n, m = raw.shape[0], x.shape[0]
    ctx = base.ggml_init(Params(raw.nbytes + x.nbytes + 4 * n * m + (64 << 20), None, False))
    try:
        tw = base.ggml_new_tensor_2d(ctx, int(qtype), k, n)
        tx = base.ggml_new_tensor_2d(ctx, 0, k, m)
        C.memmove(base.ggml_get_data(tw), np.ascontiguousarray(raw).ctypes.data, raw.nbytes)
        xc = np.ascontiguousarray(x, dtype=np.float32)
        C.memmove(base.ggml_get_data(tx), xc.ctypes.data, xc.nbytes)
        ty = base.ggml_mul_mat(ctx, tw, tx)
        g = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(g, ty)
        if cpu.ggml_graph_compute_with_ctx(ctx, g, threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")
        return np.frombuffer(C.string_at(base.ggml_get_data(ty), 4 * n * m), np.float32).reshape(m, n).copy()
    finally:
        base.ggml_free(ctx)


# every code level this CPU runs, best first, and its key in the report
LEVELS = tuple(range(ggml_dot.set_simd(True), ggml_dot.PORTABLE - 1, -1))
LEVEL_KEYS = {ggml_dot.AVX512: "avx512", ggml_dot.AVX2: "avx2", ggml_dot.PORTABLE: "portable"}
PROMPT_ROWS = (2, 7, 8, 16, 40)  # activation rows of the whole-product check: vec_dot / tinyBLAS, then tiled
PROMPT_FIXTURE_ROWS, PROMPT_FIXTURE_K = 8, 512


def main() -> None:
    args = sys.argv[1:]
    lib_dir = Path(args[0]) if args and not args[0].startswith("--") else Path("/tmp/llama")
    rows = int(args[args.index("--rows") + 1]) if "--rows" in args else 2048
    write = "--write" in args
    lib = ctypes.CDLL(str(next(p for p in (lib_dir / "libggml-cpu.so", lib_dir / "libggml-cpu.so.0") if p.exists())))
    lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_Traits)
    lib.ggml_cpu_init()
    if not ggml_dot.available():
        sys.exit(f"the C kernel is not built: {ggml_dot.unavailable_reason()}")
    rng = np.random.default_rng(8)
    k = 1536
    fixture_cases, prompt_cases = [], []
    worst = 0
    for qtype in (QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q6_K, QT.Q4_K, QT.Q4_0, QT.Q5_K, QT.Q5_1):  # (the later ones last: the others keep their draws)
        raw = random_weight(qtype, rows, k, rng)
        traits = lib.ggml_get_type_traits_cpu(int(qtype)).contents
        vt = QT(traits.vec_dot_type)
        vt_traits = lib.ggml_get_type_traits_cpu(int(vt)).contents
        stats = {"quant_bytes_differ": 0, "bits_differ": {}, "max_rel": {}}
        for variant in range(4):
            x = activations(k, rng, variant)
            xq = np.zeros(k // ACT[vt][0] * ACT[vt][1], np.uint8)
            _FROM_FLOAT(vt_traits.from_float)(x.ctypes.data, xq.ctypes.data, k)
            ours_q = ggml_dot.quantize(x[None], qtype).reshape(-1)
            stats["quant_bytes_differ"] += int((ours_q != xq).sum())
            ref = np.zeros(rows, np.float32)
            vd = _VEC_DOT(traits.vec_dot)
            for r in range(rows):
                row = raw[r]
                vd(k, ref[r:].ctypes.data, 0, row.ctypes.data, 0, xq.ctypes.data, 0, 1)
            for level in LEVELS:
                ggml_dot.set_simd(level)
                ours = ggml_dot.gemv_quantized(raw, qtype, k, xq[None]).reshape(-1)
                key = LEVEL_KEYS[level]
                diff = int((ours.view(np.uint32) != ref.view(np.uint32)).sum())
                stats["bits_differ"][key] = stats["bits_differ"].get(key, 0) + diff
                rel = float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))
                stats["max_rel"][key] = max(stats["max_rel"].get(key, 0.0), rel)
                worst = max(worst, diff)
            ggml_dot.set_simd(True)
            if variant == 1:
                keep = min(rows, 16)
                fixture_cases.append({"weight_type": qtype.name, "x": base64.b64encode(x.tobytes()).decode(),
                                      "x_quantized": base64.b64encode(xq.tobytes()).decode(),
                                      "weight": base64.b64encode(np.ascontiguousarray(raw[:keep]).tobytes()).decode(),
                                      "dots": base64.b64encode(ref[:keep].tobytes()).decode()})
        print(f"{qtype.name:5s} x {vt.name}: {rows} rows x 4 activations, K={k}: activation bytes differing "
              f"{stats['quant_bytes_differ']}, outputs differing in any bit {stats['bits_differ']}, "
              f"max |diff|/max|y| {stats['max_rel']}")
        # whole products of several activation rows through ggml's graph (prompt paths)
        prompt = {}
        for m in PROMPT_ROWS:
            xs = np.stack([activations(k, rng, v % 4) for v in range(m)])
            theirs = graph_products(lib_dir, qtype, raw[: min(rows, 512)], k, xs)
            for level in LEVELS:
                ggml_dot.set_simd(level)
                ours = ggml_dot.gemv_quantized(raw[: min(rows, 512)], qtype, k, ggml_dot.quantize(xs, qtype))
                key = LEVEL_KEYS[level]
                diff = int((ours.view(np.uint32) != theirs.view(np.uint32)).sum())
                prompt[f"{m}/{key}"] = diff
                worst = max(worst, diff)
            ggml_dot.set_simd(True)
        print(f"      ggml_mul_mat, {min(rows, 512)} weight rows x M activation rows, outputs differing in any bit "
              f"(M/code): {prompt}")
        kp = PROMPT_FIXTURE_K
        wp = random_weight(qtype, 16, kp, rng)
        xp = np.stack([activations(kp, rng, v % 4) for v in range(PROMPT_FIXTURE_ROWS)])
        prompt_cases.append({"weight_type": qtype.name, "K": kp, "rows": PROMPT_FIXTURE_ROWS,
                             "x_quantized": base64.b64encode(ggml_dot.quantize(xp, qtype).tobytes()).decode(),
                             "weight": base64.b64encode(np.ascontiguousarray(wp).tobytes()).decode(),
                             "products": base64.b64encode(graph_products(lib_dir, qtype, wp, kp, xp).tobytes()).decode()})
    if write:
        FIXTURE.write_text(json.dumps({"source": f"libggml-cpu b11434 ({lib_dir}); scripts/cpudot_vs_ggml.py", "K": k,
                                       "cases": fixture_cases, "prompt_cases": prompt_cases}) + "\n")
        print(f"wrote {FIXTURE}")
    sys.exit(1 if worst else 0)


if __name__ == "__main__":
    main()
