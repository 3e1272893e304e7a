"""Decode steps against llama.cpp b11434, logit for logit (dev only; issue 14).

  TALLOW_NUMERICS=ggml PYTHONPATH=$PWD:/tmp/llcp python scripts/numerics_decode.py MODEL [--prompt N] [--steps N]

scripts/numerics_conformance.py --live compares teacher-forced prompt logits: every row goes
through prefill, whose attention sums in llamafile's order. A decode step sums in another
(ggml_vec_dot_f16 for one query row) and, under TALLOW_NUMERICS=ggml, runs the one-token C attention
(kernels/cpu/ggml_ops.c). Here both engines prefill the first N tokens of the conformance text, then
take the following tokens one at a time (teacher-forced, so a near-tie cannot make them part), and
every logit of every step is compared. llama.cpp runs in scripts/numerics_reference.py's configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=20, help="tokens prefilled before the decode steps")
    ap.add_argument("--steps", type=int, default=100, help="one-token steps compared")
    args = ap.parse_args()

    from model_paths import require_model
    from numerics_reference import Reference

    import tallow

    path = require_model(args.model)
    ids = json.loads((ROOT / "tests" / "fixtures" / f"conformance_{args.model}.json").read_text())["teacher_forced"]["ids"]
    ids = ids[: args.prompt + args.steps]
    t0 = time.time()
    ref = Reference(path)
    ref.reset()
    theirs = [ref._decode(ids[: args.prompt], 0, all_logits=False)[-1]]
    theirs += [ref._decode([tok], pos, all_logits=False)[-1] for pos, tok in enumerate(ids[args.prompt : -1], args.prompt)]
    ref.close()
    llm = tallow.LLM(path, ctx=1024)
    eng = llm.engine
    eng.reset()
    ours = [eng.prefill_chunk_at(ids[: args.prompt], 0)[-1]]
    for tok in ids[args.prompt : -1]:
        ours.append(eng.decode_step(tok).reshape(-1))
    a = torch.stack([o.float() for o in ours]).numpy()
    b = np.stack(theirs).astype(np.float32)
    same = a.view(np.int32) == b.view(np.int32)
    rows = same.all(1)
    print(f"{args.model}: TALLOW_NUMERICS={os.environ.get('TALLOW_NUMERICS', '')} TALLOW_GGML_C_OPS="
          f"{os.environ.get('TALLOW_GGML_C_OPS', '(default)')}, prompt {args.prompt}, {len(ours) - 1} decode steps: "
          f"{int(same.sum()):,} of {same.size:,} logits bit-identical; rows identical {int(rows.sum())}/{len(rows)}"
          f" (prefill row {bool(rows[0])}); max |Δ| {float(np.abs(a - b).max()):.3g}; argmax agree "
          f"{int((a.argmax(1) == b.argmax(1)).sum())}/{len(rows)}; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
