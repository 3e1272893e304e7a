"""Op by op against llama.cpp b11434 (issue 14): each tallow op under TALLOW_NUMERICS=ggml fed
llama.cpp's own input tensor, its output compared bit for bit with llama.cpp's.

  PYTHONPATH=$PWD python scripts/numerics_layers.py MODEL [--layers 0,15] [--tokens 40] [--decode]

--decode: the ops of one decode step (token --tokens + 1 at position --tokens) instead of the prompt's.

The forward pass is chaotic at one ulp (docs/performance.md, issue-14 sections), so comparing
tallow's whole forward with llama.cpp's only finds the first difference; feeding each op
llama.cpp's input isolates every op. Inputs and outputs come from the eval callback
(scripts/numerics_reference.py, configuration CONFIG there). Per op: elements, the share that
is bit-identical, max |diff|, max |diff| / max |ref|. For the quantized linears, "codes" says
whether the activation codes ggml computed equal ours (they do when the input is bit-identical:
then any difference is the order of the float sums inside the dot products, cpudot's part).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ["TALLOW_NUMERICS"] = "ggml"

from numerics_reference import Reference  # noqa: E402


def compare(name: str, ours, ref, rows: list | None = None) -> dict:
    a = np.asarray(ours.detach().float().numpy() if isinstance(ours, torch.Tensor) else ours, dtype=np.float32)
    b = np.asarray(ref, dtype=np.float32)
    if a.shape != b.shape and a.size == b.size:  # one token: llama.cpp's unit axes
        b = b.reshape(a.shape)
    if a.shape != b.shape:
        raise SystemExit(f"{name}: shape {a.shape} vs llama.cpp {b.shape}")
    fin = np.isfinite(b)
    same = (a == b) | (~fin & (a == b))
    d = np.abs(np.where(fin, a - b, 0.0))
    scale = np.abs(np.where(fin, b, 0)).max() or 1.0
    r = {"op": name, "n": a.size, "identical": float(same.mean()), "max_abs": float(d.max()), "max_rel": float(d.max() / scale)}
    print(f"  {name:28s} {a.size:9d}  identical {r['identical']:7.2%}  max|d| {r['max_abs']:.3e}  rel {r['max_rel']:.2e}",
          flush=True)
    if rows is not None:
        rows.append(r)
    return r


def node_before(T: dict, name: str) -> np.ndarray:
    """The last unnamed graph node (node_N) evaluated before the tensor `name`."""
    keys = list(T)
    nodes = [k for k in keys[: keys.index(name)] if k.startswith("node_") and " " not in k]
    return T[nodes[-1]][0]


def t(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--layers", default="0")
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--decode", action="store_true", help="one decode step after the prompt")
    args = ap.parse_args()
    import json

    from model_paths import require_model

    from tallow.gguf_file import GGUFFile
    from tallow.models import build_model
    from tallow.spec import spec_from_gguf

    path = require_model(args.model)
    fixture = json.loads((ROOT / "tests" / "fixtures" / f"conformance_{args.model}.json").read_text())
    ids = fixture["teacher_forced"]["ids"][: args.tokens + args.decode]
    ref = Reference(path)
    start = 0
    if args.decode:  # the prompt first, then capture the one-token step at position len(prompt)
        start = args.tokens
        ref.logits(ids[:start])
        ids = ids[start:]
    _, T = ref.logits(ids, capture=True, start=start, reset=not args.decode)
    ref.close()
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    arch = spec.architecture
    print(f"{args.model} ({arch}), {len(ids)} tokens, TALLOW_NUMERICS=ggml")
    rows: list[dict] = []
    with torch.inference_mode():
        emb = model.embedding(torch.tensor(ids))
        if arch == "gemma3":
            compare("embd*scale (inp_scaled)", emb * spec.embed_scale, T["inp_scaled"][0], rows)
        else:
            compare("embd (get_rows)", emb, T["embd"][0], rows)
        for il in [int(x) for x in args.layers.split(",")]:
            print(f" layer {il}")
            layer_ops(model, spec, T, il, len(ids), rows, start)
        from tallow.layers import rms_norm

        print(" output")
        last = T[f"l_out-{spec.n_layers - 1}"][0]
        compare("result_norm", rms_norm(t(last), model.output_norm, spec.norm_eps), T["result_norm"][0], rows)
        compare("result_output (linear)", model.output(t(T["result_norm"][0])), T["result_output"][0], rows)
    return rows


def layer_ops(model, spec, T, il: int, n: int, rows: list, start: int = 0) -> None:
    from tallow.layers import rms_norm
    from tallow.numerics import ggml_softmax

    g = lambda name, k=0: T[f"{name}-{il}"][k]  # noqa: E731
    w = model.layers[il]
    layer = spec.layers[il]
    nh, nkv, hd = layer.n_heads, layer.n_kv_heads, layer.head_dim
    eps = spec.norm_eps
    arch = spec.architecture
    x_in = T["inp_scaled"][0] if (il == 0 and arch == "gemma3") else (T["embd"][0] if il == 0 else T[f"l_out-{il - 1}"][0])
    compare("attn_norm", rms_norm(t(x_in), w.attn_norm, eps), g("attn_norm"), rows)
    qkv = w.attn_qkv(t(g("attn_norm")))
    q_lin, k_lin, v_lin = qkv[:, : nh * hd], qkv[:, nh * hd : (nh + nkv) * hd], qkv[:, (nh + nkv) * hd :]
    bias = arch == "qwen2"  # Qcur-il: [mul_mat, (+bias), reshaped, roped]
    compare("Qcur (linear" + (" + bias)" if bias else ")"), q_lin, g("Qcur", 1 if bias else 0), rows)
    compare("Kcur (linear" + (" + bias)" if bias else ")"), k_lin, g("Kcur", 1 if bias else 0), rows)
    compare("Vcur (linear" + (" + bias)" if bias else ")"), v_lin, g("Vcur", 1 if bias else 0), rows)
    table = model.rope[layer.rope_key]
    table.ensure(start + n)
    if arch == "gemma3":  # per-head Q/K RMSNorm before RoPE, then Q scaled (node after "Qcur")
        qk_norm = w.attn_qk_norm  # (nh + nkv, hd): Q heads' rows then K heads'
        compare("Qcur_normed", rms_norm(t(g("Qcur", 1)).reshape(n, nh, hd), qk_norm[:nh], eps),
                g("Qcur_normed").reshape(n, nh, hd), rows)
        compare("Kcur_normed", rms_norm(t(g("Kcur", 1)).reshape(n, nkv, hd), qk_norm[nh:], eps),
                g("Kcur_normed").reshape(n, nkv, hd), rows)
        q_pre, k_pre = g("Qcur_normed"), g("Kcur_normed")
    else:
        q_pre, k_pre = g("Qcur", -2), g("Kcur", -2)
    compare("Qcur (rope)", table.apply_at(t(q_pre).reshape(n, nh, hd), start), g("Qcur", -1).reshape(n, nh, hd), rows)
    compare("Kcur (rope)", table.apply_at(t(k_pre).reshape(n, nkv, hd), start), g("Kcur", -1).reshape(n, nkv, hd), rows)
    # KQ = mul_mat(K f16 cache, Q): Q rounded to f16 (vec_dot_type of F16), llamafile's F16 sums.
    from tallow.numerics import ggml_attention, ggml_dot_f16

    kq_ref = g("kq")  # (nh, n, n_kv_padded)
    n_keys = kq_ref.shape[-1]
    kcache = t(T[f"cache_k_l{il} (view) (permuted)"][0].astype(np.float32)).reshape(nkv, n_keys, hd)
    vcache = t(T[f"cache_v_l{il} (view) (permuted)"][0].astype(np.float32)).reshape(nkv, -1, n_keys)  # (nkv, hd, keys)
    q_ref = t(g("Qcur", -1)).reshape(n, nh, hd)  # roped
    if model.ggml_prescaled_q:  # gemma3: ggml_scale(Qcur, f_attention_scale) before the attention
        compare("Q * attention scale", q_ref * spec.attn_scale, node_before(T, f"kq-{il}"), rows)
        q_ref = q_ref * spec.attn_scale
    q_ref = q_ref.transpose(0, 1)  # (nh, n, hd)
    group = nh // nkv
    compare("kq (K f16 . Q f16)", ggml_dot_f16(q_ref, kcache.repeat_interleave(group, dim=0)), kq_ref, rows)
    q_pos = torch.arange(start, start + n)[:, None]
    mask = torch.arange(n_keys)[None, :] <= q_pos
    if layer.sliding_window:
        mask &= (q_pos - torch.arange(n_keys)[None, :]) < layer.sliding_window
    scale = 1.0 if model.ggml_prescaled_q else spec.attn_scale
    probs = ggml_softmax((t(kq_ref) * scale).masked_fill(~mask, float("-inf")))
    compare("kq_soft_max", probs, g("kq_soft_max"), rows)
    kqv = ggml_dot_f16(t(g("kq_soft_max")), vcache.repeat_interleave(group, dim=0))
    compare("kqv (V f16 . softmax f16)", kqv, g("kqv"), rows)
    whole = ggml_attention(q_ref, kcache[:, : start + n], vcache[:, :, : start + n].transpose(1, 2), mask[:, : start + n], scale,
                           spec.attn_logit_softcap)
    compare("kqv_out (ggml_attention)", whole, g("kqv_out"), rows)
    attn = w.attn_output(t(g("kqv_out")))
    if arch == "gemma3":  # sandwich norms: attn_post_norm, sa_out, ffn_norm, GeGLU, ffn_post_norm
        wo = node_before(T, f"attn_post_norm-{il}")  # the unnamed wo product
        compare("attn_out (linear)", attn, wo, rows)
        compare("attn_post_norm", rms_norm(t(wo), w.post_attention_norm, eps), g("attn_post_norm"), rows)
        compare("sa_out (residual add)", t(g("attn_post_norm")) + t(x_in), g("sa_out"), rows)
        compare("ffn_norm", rms_norm(t(g("sa_out")), w.ffn_norm, eps), g("ffn_norm"), rows)
        gu = w.ffn_gate_up(t(g("ffn_norm")))
        f = gu.shape[-1] // 2
        compare("ffn_gate (linear)", gu[:, :f], g("ffn_gate"), rows)
        compare("ffn_up (linear)", gu[:, f:], g("ffn_up"), rows)
        glu = model.ops.glu(torch.cat((t(g("ffn_gate")), t(g("ffn_up"))), dim=-1), "geglu")
        compare("ffn_geglu", glu, g("ffn_geglu"), rows)
        compare("ffn_out (linear)", w.ffn_down(t(g("ffn_geglu"))), g("ffn_out"), rows)
        compare("ffn_post_norm", rms_norm(t(g("ffn_out")), w.post_ffw_norm, eps), g("ffn_post_norm"), rows)
        compare("l_out (residual add)", t(g("ffn_post_norm")) + t(g("sa_out")), g("l_out"), rows)
        return
    wo = T[f"attn_out-{il}"][0] if f"attn_out-{il}" in T else node_before(T, f"ffn_inp-{il}")  # qwen2: unnamed
    compare("attn_out (linear)", attn, wo, rows)
    compare("ffn_inp (residual add)", t(wo) + t(x_in), g("ffn_inp"), rows)
    compare("ffn_norm", rms_norm(t(g("ffn_inp")), w.ffn_norm, eps), g("ffn_norm"), rows)
    gu = w.ffn_gate_up(t(g("ffn_norm")))
    f = gu.shape[-1] // 2
    compare("ffn_gate (linear)", gu[:, :f], g("ffn_gate"), rows)
    compare("ffn_up (linear)", gu[:, f:], g("ffn_up"), rows)
    glu = model.ops.glu(torch.cat((t(g("ffn_gate")), t(g("ffn_up"))), dim=-1), "swiglu")
    compare("ffn_swiglu", glu, g("ffn_swiglu"), rows)
    compare("ffn_out (linear)", w.ffn_down(t(g("ffn_swiglu"))), g("ffn_out"), rows)
    compare("l_out (residual add)", t(g("ffn_out")) + t(g("ffn_inp")), g("l_out"), rows)


if __name__ == "__main__":
    main()
