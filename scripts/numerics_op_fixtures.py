"""Record llama.cpp b11434's own inputs and outputs of the elementwise ops of one layer into
tests/fixtures/ggml_layer_ops.json (dev only: needs the reference harness, numerics_reference.py).

  PYTHONPATH=$PWD python scripts/numerics_op_fixtures.py

For smollm2-135m (llama: RoPE in pairs, SwiGLU) and gemma3-270m (per-head Q/K norm, NeoX RoPE,
Q scaled before attention, GeGLU), layer 0, the first 6 tokens of the conformance text: the
tensors the eval callback sees, cropped so the fixture stays small (the first 2 query heads for RoPE, the query heads of KV head 0 over the
first 16 key slots for attention: keys 6.. are masked; the MLP activations to their first 256 columns: the ops are
elementwise). tests/test_ggml_numerics.py feeds tallow's TALLOW_NUMERICS=ggml ops the inputs and
requires llama.cpp's outputs bit for bit. Also the sha256 of libggml-cpu's GELU table over its
finite inputs.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from numerics_reference import CONFIG, LLAMA_DIR, Reference  # noqa: E402

N_TOKENS, N_KEYS, N_COLS = 6, 16, 256


def pack(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a, dtype=np.float32)
    return {"shape": list(a.shape), "f32": base64.b64encode(a.tobytes()).decode()}


def layer_case(name: str) -> dict:
    from model_paths import require_model

    from tallow.gguf_file import GGUFFile
    from tallow.quant.reference import dequantize
    from tallow.spec import spec_from_gguf

    path = require_model(name)
    ids = json.loads((ROOT / "tests" / "fixtures" / f"conformance_{name}.json").read_text())["teacher_forced"]["ids"]
    ref = Reference(path)
    _, T = ref.logits(ids[:N_TOKENS], capture=True)
    _, D = ref.logits(ids[N_TOKENS : N_TOKENS + 1], capture=True, start=N_TOKENS, reset=False)  # one decode step
    ref.close()
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    layer = spec.layers[0]
    nh, nkv, hd = layer.n_heads, layer.n_kv_heads, layer.head_dim

    def weight(role: str) -> np.ndarray:
        t = gf.tensors[f"blk.0.{role}.weight"]
        return dequantize(t.data, t.qtype, t.n_cols).reshape(-1).numpy()

    g = lambda key, k=0: T[key][k]  # noqa: E731
    gemma = spec.architecture == "gemma3"
    x_in = g("inp_scaled") if gemma else g("embd")
    n = N_TOKENS
    case = {
        "model": name, "architecture": spec.architecture, "eps": spec.norm_eps, "n_heads": nh, "n_kv_heads": nkv,
        "head_dim": hd, "rope_base": layer.rope_base, "rope_style": spec.rope_style, "attn_scale": spec.attn_scale,
        "prescaled_q": gemma, "glu": "geglu" if gemma else "swiglu",
        "rms_norm": {"x": pack(x_in), "weight": pack(weight("attn_norm")), "out": pack(g("attn_norm-0"))},
        "rope": {"x": pack((g("Qcur_normed-0") if gemma else g("Qcur-0", 1)).reshape(n, nh, hd)[:, :2]),
                 "out": pack(g("Qcur-0", -1).reshape(n, nh, hd)[:, :2])},
    }
    if gemma:
        case["qk_norm"] = {"x": pack(g("Qcur-0", 1).reshape(n, nh, hd)[:, :2]), "weight": pack(weight("attn_q_norm")),
                           "out": pack(g("Qcur_normed-0").reshape(n, nh, hd)[:, :2])}
    n_keys = g("kq-0").shape[-1]
    keys = [k for k in T if k.startswith("cache_k_l0 (view) (permuted)")][0]
    values = [k for k in T if k.startswith("cache_v_l0 (view) (permuted)")][0]
    kcache = T[keys][0].astype(np.float32).reshape(nkv, n_keys, hd)[:, :N_KEYS]
    vcache = T[values][0].astype(np.float32).reshape(nkv, hd, n_keys)[:, :, :N_KEYS]
    q = g("Qcur-0", -1).reshape(n, nh, hd)
    if gemma:  # the ggml_scale node kq reads
        names = list(T)
        q = T[[k for k in names[: names.index("kq-0")] if k.startswith("node_") and " " not in k][-1]][0]
    group = nh // nkv  # the query heads of KV head 0 only, to keep the fixture small
    case["attention"] = {
        "q": pack(q.reshape(n, nh, hd).transpose(1, 0, 2)[:group]), "k": pack(kcache[:1]), "v": pack(vcache[:1]),
        "kq": pack(g("kq-0")[:group, :, :N_KEYS]), "kq_soft_max": pack(g("kq_soft_max-0")[:group, :, :N_KEYS]),
        "kqv": pack(g("kqv-0")[:group]),
    }
    # The decode step at position N_TOKENS: one query row, where ggml's F16 products take
    # ggml_vec_dot_f16's order instead of llamafile's.
    qd = D["Qcur-0"][-1].reshape(1, nh, hd)
    if gemma:
        names = list(D)
        qd = D[[k for k in names[: names.index("kq-0")] if k.startswith("node_") and " " not in k][-1]][0]
    kd = D[keys][0].astype(np.float32).reshape(nkv, n_keys, hd)[:, :N_KEYS]
    vd = D[values][0].astype(np.float32).reshape(nkv, hd, n_keys)[:, :, :N_KEYS]
    case["attention_decode"] = {
        "q": pack(qd.reshape(1, nh, hd).transpose(1, 0, 2)[:group]), "k": pack(kd[:1]), "v": pack(vd[:1]),
        "kq": pack(D["kq-0"][0].reshape(nh, 1, n_keys)[:group, :, :N_KEYS]),
        "kq_soft_max": pack(D["kq_soft_max-0"][0].reshape(nh, 1, n_keys)[:group, :, :N_KEYS]),
        "kqv": pack(D["kqv-0"][0].reshape(nh, 1, hd)[:group]), "start": N_TOKENS,
    }
    act = "ffn_geglu-0" if gemma else "ffn_swiglu-0"
    case["glu_op"] = {"gate": pack(g("ffn_gate-0")[:, :N_COLS]), "up": pack(g("ffn_up-0")[:, :N_COLS]),
                      "out": pack(g(act)[:, :N_COLS])}
    return case


def gelu_table_sha256() -> str:
    lib = ctypes.CDLL(str(LLAMA_DIR / "libggml-cpu.so.0"))
    addr = ctypes.addressof(ctypes.c_uint16.in_dll(lib, "ggml_table_gelu_f16"))
    table = np.frombuffer(ctypes.string_at(addr, 65536 * 2), dtype=np.uint16)
    finite = np.isfinite(np.arange(65536, dtype=np.uint16).view(np.float16))
    return hashlib.sha256(table[finite].tobytes()).hexdigest()


def main() -> None:
    cases = [layer_case(name) for name in ("smollm2-135m", "gemma3-270m")]
    data = {"llama_cpp": "b11434 (../shared/llama.cpp, libraries through llama-cpp-python 0.3.36's bindings)",
            "config": CONFIG, "gelu_table_sha256_finite": gelu_table_sha256(), "cases": cases}
    out = ROOT / "tests" / "fixtures" / "ggml_layer_ops.json"
    out.write_text(json.dumps(data))
    print("wrote", out, out.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
