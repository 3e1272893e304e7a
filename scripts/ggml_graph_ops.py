"""ggml's own RoPE, RMSNorm, f16 attention products and softmax against tallow's ggml emulation
(docs/performance.md, issue 14). Dev only: needs the b11434 CPU build's libraries.

  tar xJf ../shared/llama.cpp/llama-b11434-cpu.tar.xz -C /tmp/llama
  LD_LIBRARY_PATH=/tmp/llama PYTHONPATH=$PWD python scripts/ggml_graph_ops.py
"""
import ctypes as C, numpy as np, torch, sys

base = C.CDLL("/tmp/llama/libggml-base.so.0", mode=C.RTLD_GLOBAL)
cpu = C.CDLL("/tmp/llama/libggml-cpu.so.0", mode=C.RTLD_GLOBAL)
class P(C.Structure): _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]
base.ggml_init.restype = C.c_void_p; base.ggml_init.argtypes = [P]
for f in ("ggml_new_tensor_1d", "ggml_new_tensor_2d", "ggml_new_tensor_3d", "ggml_rope_ext", "ggml_rms_norm", "ggml_soft_max_ext", "ggml_mul_mat", "ggml_new_graph", "ggml_get_data", "ggml_cpy", "ggml_mul"):
    getattr(base, f).restype = C.c_void_p
base.ggml_new_tensor_1d.argtypes = [C.c_void_p, C.c_int, C.c_int64]
base.ggml_new_tensor_2d.argtypes = [C.c_void_p, C.c_int, C.c_int64, C.c_int64]
base.ggml_new_tensor_3d.argtypes = [C.c_void_p, C.c_int, C.c_int64, C.c_int64, C.c_int64]
base.ggml_rope_ext.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p, C.c_int, C.c_int, C.c_int] + [C.c_float] * 6
base.ggml_rms_norm.argtypes = [C.c_void_p, C.c_void_p, C.c_float]
base.ggml_mul.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p]
base.ggml_soft_max_ext.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_float, C.c_float]
base.ggml_mul_mat.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p]
base.ggml_new_graph.argtypes = [C.c_void_p]
base.ggml_build_forward_expand.argtypes = [C.c_void_p, C.c_void_p]
base.ggml_get_data.argtypes = [C.c_void_p]
cpu.ggml_graph_compute_with_ctx.argtypes = [C.c_void_p, C.c_void_p, C.c_int]
ctx = base.ggml_init(P(512 << 20, None, False))
F32, F16, I32 = 0, 1, 26
def put(t, a): C.memmove(base.ggml_get_data(t), a.ctypes.data, a.nbytes)
def get(t, shape, dt=np.float32): 
    n = int(np.prod(shape)) * np.dtype(dt).itemsize
    return np.frombuffer(C.string_at(base.ggml_get_data(t), n), dt).reshape(shape).copy()
def run(t):
    g = base.ggml_new_graph(ctx); base.ggml_build_forward_expand(g, t); cpu.ggml_graph_compute_with_ctx(ctx, g, 2)
rng = np.random.default_rng(0)
# RoPE (NORM mode 0), head_dim 64, 3 heads, 40 tokens at positions 300..339
hd, nh, nt, p0 = 64, 3, 40, 300
x = rng.standard_normal((nt, nh, hd)).astype(np.float32)
tx = base.ggml_new_tensor_3d(ctx, F32, hd, nh, nt); put(tx, x)
tp = base.ggml_new_tensor_1d(ctx, I32, nt); put(tp, np.arange(p0, p0 + nt, dtype=np.int32))
tr = base.ggml_rope_ext(ctx, tx, tp, None, hd, 0, 8192, 100000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
run(tr); ref = get(tr, (nt, nh, hd))
import os; os.environ["TALLOW_NUMERICS"] = "ggml"
from tallow.layers import RotaryTables
for style, mode in (("norm", 0), ("neox", 2)):
    tr = base.ggml_rope_ext(ctx, tx, tp, None, hd, mode, 8192, 100000.0, 1.0, 0.0, 1.0, 32.0, 1.0); run(tr); ref = get(tr, (nt, nh, hd))
    rt = RotaryTables(hd, 100000.0, style); rt.ensure(p0 + nt)
    ours = rt.apply_at(torch.from_numpy(x), p0).numpy()
    os.environ["TALLOW_NUMERICS"] = ""; rd = RotaryTables(hd, 100000.0, style); rd.ensure(p0 + nt); dflt = rd.apply_at(torch.from_numpy(x), p0).numpy(); os.environ["TALLOW_NUMERICS"] = "ggml"
    print("rope", style, "ggml-mode max", np.abs(ours - ref).max(), "bit-equal frac", (ours == ref).mean(), "| default max", np.abs(dflt - ref).max())
# RMSNorm * w
x2 = (rng.standard_normal((5, 576)) * 4).astype(np.float32); w = rng.standard_normal(576).astype(np.float32)
ta = base.ggml_new_tensor_2d(ctx, F32, 576, 5); put(ta, x2); tw = base.ggml_new_tensor_1d(ctx, F32, 576); put(tw, w)
tn = base.ggml_mul(ctx, base.ggml_rms_norm(ctx, ta, 1e-5), tw); run(tn); ref = get(tn, (5, 576))
from tallow.numerics import ggml_rms_norm, ggml_softmax
ours = ggml_rms_norm(torch.from_numpy(x2), torch.from_numpy(w), 1e-5).numpy()
print("rms_norm max", np.abs(ours - ref).max(), "bit-equal frac", (ours == ref).mean())
# KQ with K f16, Q f32 ; softmax with scale; KQV with V f16
nk, nq = 37, 5
k = rng.standard_normal((nk, hd)).astype(np.float16); q = (rng.standard_normal((nq, hd)) * 2).astype(np.float32); v = rng.standard_normal((hd, nk)).astype(np.float16)
tk = base.ggml_new_tensor_2d(ctx, F16, hd, nk); put(tk, k); tq = base.ggml_new_tensor_2d(ctx, F32, hd, nq); put(tq, q)
kq = base.ggml_mul_mat(ctx, tk, tq)  # (nq, nk)
sm = base.ggml_soft_max_ext(ctx, kq, None, 0.125, 0.0)
tv = base.ggml_new_tensor_2d(ctx, F16, nk, hd); put(tv, v)  # V transposed: rows over keys
kqv = base.ggml_mul_mat(ctx, tv, sm)  # (nq, hd)
run(kqv); r_kq = get(kq, (nq, nk)); r_sm = get(sm, (nq, nk)); r_o = get(kqv, (nq, hd))
o_kq = (torch.from_numpy(q).half().float() @ torch.from_numpy(k).float().T).numpy()
o_sm = ggml_softmax(torch.from_numpy(r_kq) * 0.125).numpy()
o_o = (torch.from_numpy(r_sm).half().float() @ torch.from_numpy(v).float().T).numpy()
print("kq max", np.abs(o_kq - r_kq).max(), "softmax max rel", (np.abs(o_sm - r_sm) / r_sm).max(), "kqv max", np.abs(o_o - r_o).max(),
      "kqv without f16 weights", np.abs((torch.from_numpy(r_sm) @ torch.from_numpy(v).float().T).numpy() - r_o).max())
