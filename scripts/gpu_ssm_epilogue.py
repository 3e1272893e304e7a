"""TALLOW_SSM_SCAN_EPILOGUE on the H200 (session 14): Mamba-1's decode scan with the dt
projection's bias and y's Q8_1 blocks inside it, against the separate bias add and quantization.

    python scripts/gpu_ssm_epilogue.py mamba [SWITCH] [--no-kernel]

(SWITCH: another switch for step 2, e.g. `falcon-h1 TALLOW_HYBRID_JOIN_Q8`.)

1. The kernel on Mamba-1.4B's layer (4096 channels, 16 states), one decode row: y and the state
   against ssm_scan after a separate `dt + bias` (max |d|, bit equality), the Q8_1 fields against
   quantize_q8_1(y) (outputs poisoned first), µs per launch of each form (CUDA events, 200 launches).
2. A tiny model (TINY) wide enough for the integer-dot paths, one process per setting (the switch on,
   off; the CPU eager reference): 48 teacher-forced decode steps through the CUDA graph after a
   40-token prompt, logits max |d| and top-1 between them, and 32 greedy tokens each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def kernel() -> None:
    from tallow.kernels.triton.mmvq import quantize_q8_1
    from tallow.kernels.triton.ssm import ssm_scan

    dev, rows, ds = torch.device("cuda"), 4096, 16
    g = torch.Generator(device=dev).manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device=dev)
    state = r(rows, 1, ds)
    x, z, dt, bias, D = r(1, rows), r(1, rows), r(1, rows) * 3, r(rows), r(rows)
    A = -torch.rand(rows, ds, generator=g, device=dev) * 4
    bc = r(1, 2 * ds)
    B, C = bc[:, :ds], bc[:, ds:]
    s1, s2 = state.clone(), state.clone()
    y_ref = ssm_scan(s1, x, dt + bias, A, B, C, D=D, z=z)
    y, xq = ssm_scan(s2, x, dt, A, B, C, dt_bias=bias, D=D, z=z, q8=True)
    ref = quantize_q8_1(y)
    same_q8 = all(torch.equal(getattr(xq, f), getattr(ref, f)) for f in ("qs", "d", "s", "isum"))
    print(json.dumps({"kernel": "mamba-1.4b layer, 1 row", "y_max_abs": (y - y_ref).abs().max().item(),
                      "y_equal": torch.equal(y, y_ref), "state_equal": torch.equal(s1, s2), "q8_equal_quantize_q8_1": same_q8}))

    def timed(fn, reps=200):
        for _ in range(5):
            fn()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(); a.record()
        for _ in range(reps):
            fn()
        b.record(); torch.cuda.synchronize()
        return a.elapsed_time(b) / reps * 1e3

    st = state.clone()
    sep = timed(lambda: quantize_q8_1(ssm_scan(st, x, dt.add(bias), A, B, C, D=D, z=z)))
    fused = timed(lambda: ssm_scan(st, x, dt, A, B, C, dt_bias=bias, D=D, z=z, q8=True))
    scan_only = timed(lambda: ssm_scan(st, x, dt, A, B, C, dt_bias=bias, D=D, z=z))
    print(json.dumps({"us_separate_add_scan_q8": round(sep, 2), "us_fused": round(fused, 2), "us_scan_alone": round(scan_only, 2),
                      "note": "eager launches, host-bound: a ceiling on each, not graph times"}))


# Tiny random-weight models (tests/tiny_models.py, Mamba's initialisation: sane logits, unlike the
# twins' degenerate ones) whose matrices are wide enough for the integer-dot GEMV, so the paths
# the switches change run: 2 layers, Q8_0.
TINY = {"mamba": dict(dim=2048, d_inner=4096, d_state=16, dt_rank=128),
        "falcon-h1": dict(dim=1024, d_inner=2048, d_state=16, n_head=32, n_heads=8, n_kv=2, head_dim=128, ffn=2048)}


def model_run(arch: str, device: str, out: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from gguf import GGMLQuantizationType as QT
    from tiny_models import write_tiny_ssm

    import tallow
    from tallow.bench import rewind

    path = write_tiny_ssm(arch, f"/tmp/epi-{arch}.gguf", qtype=QT.Q8_0, shape=TINY[arch])
    llm = tallow.load(str(path), ctx=256, device=device, progress=False)
    kinds = sorted({getattr(l, "kind", "?") for w in llm.model.layers for l in w.tensors.values() if hasattr(l, "kind")})
    prompt, forced = list(range(3, 43)), list(range(50, 98))
    rewind(llm, prompt)
    logits = torch.stack([llm.engine.decode_step(t).float().cpu() for t in forced])
    llm.engine.reset()
    tokens = llm.generate(prompt, max_tokens=32, temperature=0.0).tokens
    torch.save({"logits": logits, "tokens": tokens, "kinds": kinds}, out)


def main() -> None:
    if sys.argv[1] == "--child":
        return model_run(sys.argv[2], sys.argv[3], sys.argv[4])
    arch = sys.argv[1]
    switch = next((a for a in sys.argv[2:] if a.startswith("TALLOW_")), "TALLOW_SSM_SCAN_EPILOGUE")
    if "--no-kernel" not in sys.argv:
        kernel()
    res = {}
    for name, device, v in (("on", "cuda", "1"), ("off", "cuda", "0"), ("cpu", "cpu", "1")):
        env = dict(os.environ, **{switch: v})
        out = f"/tmp/epi_{arch}_{name}.pt"
        r = subprocess.run([sys.executable, __file__, "--child", arch, device, out], env=env, capture_output=True, text=True, timeout=240)
        if r.returncode:
            print(f"{arch} {name} FAILED: {r.stderr[-1500:]}")
            return
        res[name] = torch.load(out)
    on, off, cpu = res["on"], res["off"], res["cpu"]

    def cmp(a, b):
        return {"max_abs": (a["logits"] - b["logits"]).abs().max().item(),
                "top1": (a["logits"].argmax(-1) == b["logits"].argmax(-1)).float().mean().item(),
                "greedy_equal": a["tokens"] == b["tokens"]}

    print(json.dumps({"tiny": arch, "switch": switch, "kinds_on": on["kinds"], "kinds_off": off["kinds"],
                      "logit_std": cpu["logits"].std().item(), "on_vs_off": cmp(on, off), "on_vs_cpu": cmp(on, cpu),
                      "off_vs_cpu": cmp(off, cpu), "tokens_on": on["tokens"][:12]}))


if __name__ == "__main__":
    main()
