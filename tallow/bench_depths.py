"""`tallow bench --depths 0,1024,4096 MODEL [MODEL...]`: the architecture study as a command.

For each model and context depth D: prefill pp N tokens and decode tg N tokens after D tokens of
context (llama-bench's -d), and the memory the engine holds there, part by part:
  weights   what the loaded model holds (model.nbytes)
  KV        the plan's KV for a context of D + pp tokens (memory/budget.py: what a pool sized
            for that context allocates; 0 for a pure state-space model)
  state     the recurrent layers' live state plus the checkpoints held right then (allocated)
  scratch   the plan's prefill scratch at that context
  measured  the process's resident size (CPU) or the allocated GPU memory, right after the test
Each depth loads the model with a pool sized for D + N tokens, as llama-bench sizes its context per test
(n_prompt + n_gen + depth), so the pool's size is the depth's, as in the memory column; --one-pool loads
once for the largest depth instead (a server's fixed pool).
The depth's tokens are prefilled once, untimed; every repetition rewinds the memory to them
(a truncation, or for a recurrent state the checkpoint kept there) and runs the test again.
Each test runs once to warm up and then `-r` times; the table gives the mean.

With --llama-bench PATH, llama-bench runs on the same file in the same run (`-d` for the depths,
`-o jsonl`), and its steady speed — the mean of its repetitions after the first, whose prompt
test runs 1.5-3x slower — stands beside tallow's.

Exit codes: 2 a bad flag (depths, missing model, a depth beyond a model's context, --plot without
matplotlib), 3 a model that does not fit the memory budget, 5 llama-bench failed on a model (the
tallow figures are still printed).
"""

from __future__ import annotations

import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from .bench import _sync, fill, rewind
from .errors import TallowError, UsageError
from .sampling import greedy

MIB = 2**20


class LlamaBenchError(TallowError):
    """llama-bench could not measure a model; the tallow figures stand."""

    exit_code = 5


def parse_depths(text: str) -> list[int]:
    try:
        depths = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"--depths takes comma-separated token counts, e.g. 0,1024,4096, not {text!r}.") from None
    if not depths or any(d < 0 for d in depths):
        raise UsageError(f"--depths takes one or more non-negative token counts, not {text!r}.")
    return sorted(set(depths))


def _one_length(text: str | None, default: int, flag: str) -> int:
    if text is None:
        return default
    try:
        n = int(text)
    except ValueError:
        raise UsageError(f"{flag} takes one token count with --depths, not {text!r}.") from None
    if n < 1:
        raise UsageError(f"{flag} takes a positive token count with --depths, not {n}.")
    return n


# ------------------------------------------------------------------------------ llama-bench


def steady(samples: list[float]) -> float:
    """The mean of a test's repetitions after the first (all of them when there is one)."""
    xs = samples[1:] or samples
    return sum(xs) / len(xs)


def llama_bench_rows(lines) -> dict[tuple[str, int], dict]:
    """llama-bench's `-o jsonl` lines -> {(test, depth): {"tok_s", "samples"}}, test "pp512"/"tg64"."""
    out = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        out[(test, int(r.get("n_depth", 0)))] = {"tok_s": steady(r["samples_ts"]), "samples": r["samples_ts"]}
    return out


def run_llama_bench(exe: str, model: Path, depths: list[int], pp: int, tg: int, reps: int, threads: int,
                    extra: str = "") -> dict[tuple[str, int], dict]:
    cmd = [exe, "-m", str(model), "-t", str(threads), "-p", str(pp), "-n", str(tg), "-r", str(reps + 1),
           "-d", ",".join(map(str, depths)), "-o", "jsonl", *shlex.split(extra)]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(Path(exe).resolve().parent), env.get("LD_LIBRARY_PATH")) if p)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rows = llama_bench_rows(r.stdout.splitlines())
    if r.returncode != 0 or not rows:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaBenchError(f"llama-bench exited with {r.returncode} on {model.name}: {last}")
    return rows


# ------------------------------------------------------------------------------ tallow


def time_prefill(llm, context: list[int], tokens: list[int]) -> float:
    rewind(llm, context)
    _sync(llm)
    t0 = time.perf_counter()
    fill(llm, tokens, len(context))
    _sync(llm)
    return len(tokens) / (time.perf_counter() - t0)


def time_decode(llm, context: list[int], first: int, n: int) -> float:
    rewind(llm, context)
    token = first
    _sync(llm)
    t0 = time.perf_counter()
    for _ in range(n):
        token = greedy(llm.engine.decode_step(token))  # the sampler's greedy path
    return n / (time.perf_counter() - t0)


def measured_bytes(llm) -> int:
    """What the process holds now: resident size on the CPU, allocated memory on a GPU."""
    if llm.model.device.type == "cuda":
        return int(torch.cuda.memory_allocated(llm.model.device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def memory_at(llm, depth: int, n: int) -> dict[str, int]:
    """The engine's account at a context of depth + n tokens (module doc)."""
    plan = llm.memory.with_ctx(max(16, depth + n))
    kv = llm.engine.kv
    state = kv.state.nbytes + kv.checkpoint_bytes if hasattr(kv, "state") else 0
    parts = {"weights": int(llm.model.nbytes), "kv": int(plan.kv), "state": int(state), "scratch": int(plan.scratch)}
    return parts | {"total": sum(parts.values()), "measured": measured_bytes(llm)}


def check_depths(path: Path, depths: list[int], n: int) -> None:
    """One sentence before anything is loaded when a depth does not fit the model's context."""
    from .memory.budget import scan_header
    from .spec import spec_from_gguf

    ctx = spec_from_gguf(scan_header(path)).context_length
    if n > ctx:
        raise UsageError(f"{path.name}: a test of {n} tokens (-p/-n) exceeds the model's context of {ctx} tokens.")
    if max(depths) + n > ctx:
        raise UsageError(f"{path.name}: depth {max(depths)} + {n} test tokens exceeds the model's context of {ctx} "
                         f"tokens; its largest depth is {max(0, ctx - n)}.")


def study_model(path: Path, depths: list[int], pp: int, tg: int, reps: int, args) -> list[dict]:
    from .api import load
    from .registry import display_name

    n = max(pp, tg)

    def loaded(ctx: int):
        return load(str(path), ctx=max(16, ctx), mem_budget=getattr(args, "mem_budget", None),
                    reserve=getattr(args, "reserve", None), device=getattr(args, "device", None),
                    kv_dtype=getattr(args, "kv_dtype", None), progress=False)

    # As llama-bench sizes its context per test (n_prompt + n_gen + depth), each depth gets a pool sized
    # for it, which is also what the memory column accounts; --one-pool loads once for the largest depth.
    one_pool = getattr(args, "one_pool", False)
    llm = loaded(max(depths) + n) if one_pool else None
    g = torch.Generator().manual_seed(0)
    rows = []
    for depth in depths:
        if not one_pool:
            llm = None  # the previous depth's model and pool go before the next load
            _free_memory()
            llm = loaded(depth + n)
        vocab = llm.spec.vocab_size
        context = torch.randint(0, vocab, (depth,), generator=g).tolist()
        prompt = torch.randint(0, vocab, (pp,), generator=g).tolist()
        first = int(torch.randint(0, vocab, (1,), generator=g))
        pps, tgs, peak = [], [], 0
        for rep in range(reps + 1):  # the first is the warm-up
            pps.append(time_prefill(llm, context, prompt))
            peak = max(peak, measured_bytes(llm))
            tgs.append(time_decode(llm, context, first, tg))
        mem = memory_at(llm, depth, pp) | {"measured": peak}
        row = {"model": display_name(str(path)), "file": str(path), "architecture": llm.spec.architecture,
               "depth": depth, "device": str(llm.model.device), "threads": torch.get_num_threads(),
               f"pp{pp}": statistics.mean(pps[1:]), f"tg{tg}": statistics.mean(tgs[1:]),
               f"pp{pp}_samples": pps[1:], f"tg{tg}_samples": tgs[1:], "memory": mem,
               "kv_allocated": int(llm.engine.kv.nbytes) - (int(llm.engine.kv.state.nbytes) if hasattr(llm.engine.kv, "state") else 0),
               "ctx_loaded": llm.n_ctx}
        rows.append(row)
        print(f"  {row['model']} d{depth}: pp{pp} {row[f'pp{pp}']:.1f} tok/s, tg{tg} {row[f'tg{tg}']:.1f} tok/s, "
              f"{mem['total'] / MIB:.0f} MiB in the account, {mem['measured'] / MIB:.0f} MiB measured", file=sys.stderr)
    del llm  # the next model's measured figure must not include this one's memory
    _free_memory()
    return rows


def _free_memory() -> None:
    """Give back what dropped models held (the next load's measured figure must not include it)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ output


def table(rows: list[dict], pp: int, tg: int) -> str:
    llama = any("llama" in r for r in rows)
    head = (f"| model | depth | pp{pp} t/s | tg{tg} t/s | weights MiB | KV MiB | state MiB | scratch MiB | total MiB | measured MiB |"
            + (f" llama.cpp pp{pp} | llama.cpp tg{tg} | tg ratio |" if llama else ""))
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        m = r["memory"]
        line = (f"| {r['model']} | {r['depth']} | {r[f'pp{pp}']:.1f} | {r[f'tg{tg}']:.2f} | {m['weights'] / MIB:.0f} | "
                f"{m['kv'] / MIB:.1f} | {m['state'] / MIB:.1f} | {m['scratch'] / MIB:.0f} | {m['total'] / MIB:.0f} | "
                f"{m['measured'] / MIB:.0f} |")
        if llama:
            lb = r.get("llama") or {}
            lp, lt = lb.get(f"pp{pp}"), lb.get(f"tg{tg}")
            line += (f" {lp:.1f} |" if lp else " - |") + (f" {lt:.2f} |" if lt else " - |")
            line += f" {r[f'tg{tg}'] / lt:.2f}x |" if lt else " - |"
        lines.append(line)
    return "\n".join(lines)


def plot(rows: list[dict], pp: int, tg: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for model in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == model]
        d = [r["depth"] for r in rs]
        line, = axes[0].plot(d, [r[f"tg{tg}"] for r in rs], "o-", label=model)
        axes[1].plot(d, [r[f"pp{pp}"] for r in rs], "o-", color=line.get_color())
        axes[2].plot(d, [r["memory"]["total"] / MIB for r in rs], "o-", color=line.get_color())
        lb = [(r["depth"], r["llama"]) for r in rs if r.get("llama")]
        if lb:
            axes[0].plot([x for x, _ in lb], [v.get(f"tg{tg}") for _, v in lb], "x--", color=line.get_color(),
                         label=f"{model} (llama.cpp)")
            axes[1].plot([x for x, _ in lb], [v.get(f"pp{pp}") for _, v in lb], "x--", color=line.get_color())
    for ax, title in zip(axes, (f"decode tg{tg} (tok/s)", f"prefill pp{pp} (tok/s)", "memory held (MiB)")):
        ax.set_title(title)
        ax.set_xlabel("context depth (tokens)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def run_depth_study(args) -> int:
    from .registry import resolve_model

    depths = parse_depths(args.depths if args.depths is not None else "0")
    pp = _one_length(args.n_prompt, 512, "-p")
    tg = _one_length(args.n_gen, 64, "-n")
    if args.repetitions < 1:
        raise UsageError("-r takes a positive number of repetitions.")
    names = list(args.models or []) + ([args.model] if args.model else [])
    if not names:
        raise UsageError("name at least one model: tallow bench --depths 0,1024 MODEL [MODEL...].")
    paths = [resolve_model(name, pull_missing=False) for name in names]  # a missing model: one sentence, before any run
    for path in paths:
        check_depths(path, depths, max(pp, tg))
    if args.llama_bench and not (os.path.isfile(args.llama_bench) and os.access(args.llama_bench, os.X_OK)):
        raise UsageError(f"--llama-bench: no executable file at {args.llama_bench}.")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib, which is not installed (pip install matplotlib).") from None
        if not Path(args.plot).expanduser().resolve().parent.is_dir():
            raise UsageError(f"--plot: the folder of {args.plot} does not exist.")
    rows, failures = [], []
    for path in paths:
        model_rows = study_model(path, depths, pp, tg, args.repetitions, args)
        if args.llama_bench:
            try:
                lb = run_llama_bench(args.llama_bench, path, depths, pp, tg, args.repetitions,
                                     torch.get_num_threads(), args.llama_args or "")
                for r in model_rows:
                    r["llama"] = {f"pp{pp}": lb.get((f"pp{pp}", r["depth"]), {}).get("tok_s"),
                                  f"tg{tg}": lb.get((f"tg{tg}", r["depth"]), {}).get("tok_s"),
                                  "samples": {k[0]: v["samples"] for k, v in lb.items() if k[1] == r["depth"]}}
                    print(f"  llama.cpp {r['model']} d{r['depth']}: pp{pp} {r['llama'][f'pp{pp}'] or 0:.1f} tok/s, "
                          f"tg{tg} {r['llama'][f'tg{tg}'] or 0:.1f} tok/s", file=sys.stderr)
            except LlamaBenchError as exc:
                failures.append(exc)
                print(f"tallow: {exc}", file=sys.stderr)
        rows.extend(model_rows)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows, pp, tg))
    if args.plot:
        plot(rows, pp, tg, Path(args.plot).expanduser())
        print(f"plot written to {args.plot}", file=sys.stderr)
    return LlamaBenchError.exit_code if failures else 0
