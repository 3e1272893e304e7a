"""Python and C calls per eager forward step: the per-step Python overhead, counted instead of
timed (timing it on a shared CPU is noise). Run from a checkout:

    PYTHONPATH=$PWD python scripts/step_calls.py ~/.cache/tallow/models/smollm2-135m.gguf

prints the counts of one decode step and of one 4-row CPU verification pass after a 19-token
prefill. (Against a checkout from before models/step.Step, verification is exact_verifier's.)
"""

from __future__ import annotations

import sys

from tallow.gguf_file import GGUFFile
from tallow.memory.kv_pool import KVPool
from tallow.models import build_model
from tallow.spec import spec_from_gguf


def verify(model, kv) -> None:
    try:
        from tallow.models.step import VERIFY
    except ImportError:  # before the Step design
        from tallow.engine.speculate import exact_verifier

        exact_verifier(model).forward([5, 6, 7, 8], 19, kv, all_logits=True)
        return
    model.forward([5, 6, 7, 8], 19, kv, all_logits=True, phase=VERIFY)


def main(path: str) -> None:
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    kv = KVPool(spec, 256)
    model.forward(list(range(1, 20)), 0, kv)
    counts = {"call": 0, "c_call": 0}

    def profile(frame, event, arg):
        if event in counts:
            counts[event] += 1

    for name, run in (("decode", lambda: model.forward([5], 19, kv)), ("verify", lambda: verify(model, kv))):
        kv.truncate(19)
        counts.update(call=0, c_call=0)
        sys.setprofile(profile)
        run()
        sys.setprofile(None)
        print(f"{name}: {counts['call']} Python calls, {counts['c_call']} C calls ({spec.n_layers} layers)")


if __name__ == "__main__":
    main(sys.argv[1])
