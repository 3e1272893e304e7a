"""TALLOW_SSM_SCAN_EPILOGUE on the H200 (session 14): Mamba-1's decode scan with the dt
projection's bias and y's Q8_1 blocks inside it, against the separate bias add and quantization.

    python scripts/gpu_ssm_epilogue.py /root/twins/mamba-1.4b.gguf [SWITCH] [--no-kernel]

(SWITCH: another switch for step 2, e.g. TALLOW_HYBRID_JOIN_Q8 on a Falcon-H1 twin.)

1. The kernel on Mamba-1.4B's layer (4096 channels, 16 states), one decode row: y and the state
   against ssm_scan after a separate `dt + bias` (max |d|, bit equality), the Q8_1 fields against
   quantize_q8_1(y) (outputs poisoned first), µs per launch of each form (CUDA events, 200 launches).
2. The model, one process per setting (the switch on, off): 48 teacher-forced decode steps through
   the CUDA graph after a 40-token prompt, logits max |d| and top-1 between the settings, and 32
   greedy tokens each.
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


def model_run(path: str, out: str) -> None:
    import tallow

    llm = tallow.load(path, ctx=512, device="cuda", progress=False)
    prompt = list(range(100, 140))
    forced = list(range(200, 248))
    from tallow.bench import rewind

    rewind(llm, prompt)  # the prompt prefilled (as tallow bench's depths are)
    logits = torch.stack([llm.engine.decode_step(t).float().cpu() for t in forced])
    llm.engine.reset()
    tokens = llm.generate(prompt, max_tokens=32, temperature=0.0).tokens
    torch.save({"logits": logits, "tokens": tokens}, out)


def main() -> None:
    if sys.argv[1] == "--child":
        return model_run(sys.argv[2], sys.argv[3])
    path = sys.argv[1]
    switch = next((a for a in sys.argv[2:] if a.startswith("TALLOW_")), "TALLOW_SSM_SCAN_EPILOGUE")
    if "--no-kernel" not in sys.argv:
        kernel()
    res = {}
    for v in ("1", "0"):
        env = dict(os.environ, **{switch: v})
        out = f"/tmp/epi_{v}.pt"
        r = subprocess.run([sys.executable, __file__, "--child", path, out], env=env, capture_output=True, text=True, timeout=240)
        if r.returncode:
            print(f"setting {v} FAILED: {r.stderr[-1500:]}")
            return
        res[v] = torch.load(out)
    on, off = res["1"], res["0"]
    d = (on["logits"] - off["logits"]).abs().max().item()
    top1 = (on["logits"].argmax(-1) == off["logits"].argmax(-1)).float().mean().item()
    print(json.dumps({"model": path, "switch": switch, "decode_logits_max_abs_on_vs_off": d, "bit_equal": d == 0.0, "top1_agree": top1,
                      "logit_std": off["logits"].std().item(), "greedy_equal": on["tokens"] == off["tokens"],
                      "tokens_on": on["tokens"][:16]}))


if __name__ == "__main__":
    main()
