"""Whether switches that should not change bits leave a model's decode as it was, on the GPU.

    python scripts/gpu_switch_bits.py MODEL.gguf TALLOW_X [TALLOW_Y=1 ...] [ctx=N ...] [--steps 48] [--ctx 512]

One process per setting (the default; each switch =0, or the value given; `ctx=N`: the default with a cache of N
slots instead of --ctx's): a 40-token prompt, then `--steps` teacher-forced
decode steps through the CUDA graph (their logits kept), then 32 greedy tokens from the prompt (the
sampler's path, so TALLOW_GPU_ARGMAX is in it). Prints per switch the logits' max |Δ| against the
default (0.0: the same bits), the NaN counts and whether the greedy tokens are equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def child(path: str, out: str, steps: int, ctx: int) -> None:
    import tallow
    from tallow.bench import rewind

    llm = tallow.load(path, ctx=ctx, device="cuda", progress=False)
    prompt, forced = list(range(3, 43)), list(range(50, 50 + steps))
    rewind(llm, prompt)
    logits = torch.stack([llm.engine.decode_step(t).float().cpu() for t in forced])
    llm.engine.reset()
    tokens = llm.generate(prompt, max_tokens=32, temperature=0.0).tokens
    torch.save({"logits": logits, "tokens": tokens}, out)


def main() -> None:
    if sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    path = sys.argv[1]
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 48
    ctx = int(sys.argv[sys.argv.index("--ctx") + 1]) if "--ctx" in sys.argv else 512
    switches = [a for a in sys.argv[2:] if a.startswith(("TALLOW_", "ctx="))]
    runs = {}
    for name in ["default"] + switches:
        env, n_ctx = dict(os.environ), ctx
        if name.startswith("ctx="):
            n_ctx = int(name[4:])
        elif name != "default":
            var, _, val = name.partition("=")
            env[var] = val or "0"
        out = f"/tmp/bits_{Path(path).stem}_{name}.pt"
        r = subprocess.run([sys.executable, __file__, "--child", path, out, str(steps), str(n_ctx)], env=env,
                           capture_output=True, text=True, timeout=300)
        if r.returncode:
            print(f"{Path(path).name} {name} FAILED: {r.stderr[-1500:]}")
            return
        runs[name] = torch.load(out)
    base = runs["default"]
    for name in switches:
        got = runs[name]
        d = (got["logits"] - base["logits"]).abs()
        print(json.dumps({"model": Path(path).name, "setting": name if "=" in name else name + "=0", "ctx": ctx, "steps": steps,
                          "max_abs": d.nan_to_num(nan=float("inf")).max().item() if d.numel() else 0.0,
                          "same_bits": bool(torch.equal(got["logits"].nan_to_num(7.0), base["logits"].nan_to_num(7.0))),
                          "nan_default": int(base["logits"].isnan().sum()), "nan_off": int(got["logits"].isnan().sum()),
                          "logit_std": base["logits"].std().item(),
                          "greedy_equal": got["tokens"] == base["tokens"], "tokens": base["tokens"][:8]}))


if __name__ == "__main__":
    main()
