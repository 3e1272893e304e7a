"""Where a twin's activations first turn non-finite: an eager forward pass traced op by op.

    python scripts/gpu_nan_hunt.py TWIN.gguf [--tokens 200] [--devices cuda,cpu] [--rows 12]

The study's rewind check (gpu_study.sh step 3) read NaN logits for the Mamba-1.4B and Falcon-H1-3B twins on
the H200 after a 200-token context, where the CPU gives finite logits. This runs the same context eagerly
(model.forward: the kernels the graphs replay, launched one by one), then one decode token, on each device,
and records every traced op's output per layer: the largest |value| of the decode row and its count of
non-finite values (every layer's linears, norms, the mixer's conv and scan, the block's stream and delta).
It prints the first non-finite op of each device and, side by side, the two devices' magnitudes along the
decode step, so a divergence (an overflow on one side, a 0·inf on the other) shows where it starts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RECORD: list[tuple[int, str, float, int]] = []  # (layer, op, max |decode row|, non-finite count)
LAYER = [-1]


def _tensor_of(out):
    """The tensor an op returned: a LazyInput's / SharedQ8's input is the value not yet normed or quantized."""
    if isinstance(out, tuple):
        return _tensor_of(out[-1])
    if isinstance(out, torch.Tensor):
        return out
    return getattr(out, "x", None)


def _note(op: str, out) -> None:
    t = _tensor_of(out)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return
    row = t.reshape(t.shape[0], -1)[-1].float() if t.dim() > 1 else t.float()
    bad = int((~torch.isfinite(t)).sum())
    RECORD.append((LAYER[0], op, float(row.nan_to_num(nan=0.0, posinf=3e38, neginf=-3e38).abs().max()), bad))


def _traced_call(obj, op: str) -> None:
    """obj's calls recorded as op: a subclass of its own class, so isinstance checks keep choosing its paths."""
    cls = obj.__class__

    def __call__(self, *a, **k):
        out = cls.__call__(self, *a, **k)
        _note(op, out)
        return out

    obj.__class__ = type("Traced" + cls.__name__, (cls,), {"__call__": __call__})


def _traced_method(holder, name: str, op: str) -> None:
    fn = getattr(holder, name)

    def wrapper(*a, **k):
        out = fn(*a, **k)
        _note(op, out)
        return out

    setattr(holder, name, wrapper)


def instrument(llm) -> None:
    model = llm.model
    for layer in model.layers:
        for key, value in layer.tensors.items():
            if callable(value) and not isinstance(value, torch.Tensor):
                _traced_call(value, key)
    for name in ("add_norm", "norm", "glu"):
        if hasattr(model.ops, name):
            _traced_method(model.ops, name, name)
    for name in ("conv", "scan"):
        _traced_method(model.ssm_ops, name, name)
    for name in ("attend", "attention_inputs"):
        if hasattr(model, name):
            _traced_method(model, name, name)
    block = model.block

    def traced_block(w, x, delta, step, kv):
        LAYER[0] = w.index
        x, delta = block(w, x, delta, step, kv)
        _note("block stream", x)
        _note("block delta", delta)
        return x, delta

    model.block = traced_block


def run(path: str, device: str, n_tokens: int) -> tuple[list, torch.Tensor, float]:
    import os

    import tallow

    # the CPU's one-call C layer and mixer would hide the ops from the trace: their composed form (the same bits)
    for name in ("TALLOW_CPU_C_LAYER", "TALLOW_CPU_C_MIXER"):
        os.environ[name] = "0" if device == "cpu" else os.environ.get(name, "1")

    llm = tallow.load(path, ctx=n_tokens + 16, device=device, progress=False)
    instrument(llm)
    kv = llm.engine.kv
    context = list(range(100, 100 + n_tokens))  # the rewind check's context (gpu_study.sh step 3)
    t0 = time.perf_counter()
    llm.engine.reset()
    LAYER[0] = -1
    llm.model.forward(context, 0, kv)
    RECORD.clear()  # the decode step's ops only
    logits = llm.model.forward([7], n_tokens, kv)[-1].float().cpu()
    seconds = time.perf_counter() - t0
    states = []
    for i in range(len(llm.model.layers)):
        for kind in ("conv", "scan"):
            s = getattr(kv.state, kind)[i]
            states.append((i, kind, float(s.float().nan_to_num(nan=0.0).abs().max()), int((~torch.isfinite(s)).sum())))
    rec = list(RECORD)
    del llm
    if device == "cuda":
        torch.cuda.empty_cache()
    return rec + [(i, "state " + k, m, b) for i, k, m, b in states], logits, seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--devices", default="cuda,cpu")
    ap.add_argument("--rows", type=int, default=12, help="rows printed before the first non-finite op")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    runs = {}
    for device in args.devices.split(","):
        rec, logits, seconds = run(args.model, device, args.tokens)
        runs[device] = rec
        n_nan = int(logits.isnan().sum())
        print(f"{Path(args.model).name} on {device}: {args.tokens} tokens then one, {seconds:.1f} s; logits NaN "
              f"{n_nan}, inf {int(logits.isinf().sum())}, max |finite| {float(logits.nan_to_num(0).abs().max()):.4g}, "
              f"all zero {bool((logits == 0).all())}")
        first = next((k for k, r in enumerate(rec) if r[3]), None)
        if first is None:
            print("  every traced op finite; the first layer's:")
        for layer, op, amax, bad in rec[max(0, (first or args.rows) - args.rows) : (first or args.rows) + 3]:
            print(f"  layer {layer:3d} {op:18s} max|row| {amax:11.4g} non-finite {bad}")
    if len(runs) == 2:  # aligned by (layer, op, its count so far): a device may trace an op the other does not
        (da, ra), (db, rb) = runs.items()
        keyed = []
        for rec in (ra, rb):
            seen, out = {}, {}
            for layer, op, amax, bad in rec:
                k = (layer, op, seen.setdefault((layer, op), 0))
                seen[(layer, op)] += 1
                out[k] = (amax, bad)
            keyed.append(out)
        print(f"\nthe decode step side by side (max |row|): {da} / {db}, the mixer's ops of layers 0, 1, the last")
        last = max(k[0] for k in keyed[0])
        for k, (ma, ba) in keyed[0].items():
            if k in keyed[1] and k[0] in (0, 1, last):
                mb, bb = keyed[1][k]
                print(f"  layer {k[0]:3d} {k[1]:18s} {ma:11.4g} {mb:11.4g}  non-finite {ba} / {bb}")

if __name__ == "__main__":
    main()
