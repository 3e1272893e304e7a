"""The deep pairs' results (scripts/deep_pair_run.sh OUT_DIR ...) as one table and one plot:

    python scripts/deep_pair_table.py SOURCE... [PLOT.png] [--save ROWS.json]

A SOURCE is a run's OUT_DIR or a ROWS.json an earlier call saved (the logs live in /tmp and do not outlast the
machine; the rows do, in docs/architectures_cpu_rows.json). A later source's row for a (model, depth) replaces an
earlier one's, and so does OUT_DIR/NAME-redo's for NAME (a depth timed again on its fill's files).

Per model and depth: llama.cpp's tg64 before and after tallow's in the same hold (llama-server's own
predicted_per_second), tallow's tg64 (samples hydrated from the fill's file at that depth), the ratio of tallow's
mean to the mean of llama.cpp's six; then each engine's fill rate from the previous depth to this one (tokens per
second on two threads, one engine after the other, both at autogroup nice 19), and tallow's memory plan at the
depth (weights, KV, recurrent state, scratch: `tallow plan --ctx DEPTH+64`, header only). The plot: tg64 against
depth (tallow solid, llama.cpp dashed) and the plan's total against depth, one colour per model."""
import ast
import json
import os
import re
import sys
from statistics import mean

from tallow.memory.budget import plan_memory

MIB = 1 << 20


def model_rows(d: str) -> list[dict]:
    name = os.path.basename(d.rstrip("/"))
    llama, tallow, llama_fill, at = {}, {}, {}, 0
    for line in open(os.path.join(d, "pair.log")):
        if line.startswith("filled "):  # llama-server's segment: its timings dict, then wall seconds
            depth = int(line.split()[1])
            t = ast.literal_eval(line[line.index("{"):line.rindex("}") + 1])
            llama_fill[depth] = t["prompt_n"] / (t["prompt_ms"] / 1000)
        elif line.startswith("{"):
            r = json.loads(line)
            (tallow if "tallow_tg64" in r else llama)[r.get("tallow_tg64", r.get("llama_server_tg64"))] = r
    tallow_fill = {}
    fill_log = os.path.join(d, "fill.log")  # "filled D at S s (HH:MM:SS)": seconds since the load started
    for line in open(fill_log) if os.path.exists(fill_log) else ():  # none: a pair re-timed on an earlier fill's files
        m = re.match(r"filled (\d+) at (\d+) s", line)
        if m:
            tallow_fill[int(m[1])] = int(m[2])
    rows, prev_depth, prev_s = [], 0, None
    spec = os.path.join(d, "model.json")  # {"model": path}: for the plan
    model = json.load(open(spec))["model"] if os.path.exists(spec) else None
    for depth in sorted(tallow):
        lr, tr = llama.get(depth), tallow[depth]
        both = (lr["samples"] + lr.get("after", [])) if lr else []
        s = tallow_fill.get(depth)
        row = {"model": name, "depth": depth, "tallow": tr["mean"], "tallow_samples": tr["samples"],
               "llama_before": mean(lr["samples"]) if lr else None, "llama_after": lr.get("mean_after") if lr else None,
               "ratio": tr["mean"] / mean(both) if both else None, "end": tr["end"], "load": tr["load"],
               "llama_fill": llama_fill.get(depth),
               "tallow_fill": (depth - prev_depth) / (s - prev_s) if s and prev_s and s > prev_s else None}
        if model:
            p = plan_memory(model, n_ctx=depth + 64)
            row["plan"] = {"weights": p.weights, "kv": p.kv, "state": p.state, "scratch": p.scratch, "total": p.total}
        rows.append(row)
        prev_depth, prev_s = depth, s
    return rows


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def main() -> None:
    args = sys.argv[1:]
    save = args.pop(args.index("--save") + 1) if "--save" in args else None
    args = [a for a in args if a != "--save"]
    plot = next((a for a in args if a.endswith(".png")), None)
    rows = {}  # (model, depth) -> row; later sources replace earlier ones
    for src in (a for a in args if a != plot):
        if src.endswith(".json"):
            found = json.load(open(src))
        else:
            found = [dict(r, source=os.path.basename(src.rstrip("/"))) for d in sorted(os.listdir(src))
                     if os.path.exists(os.path.join(src, d, "pair.log")) for r in model_rows(os.path.join(src, d))]
        for r in found:
            r["model"] = r["model"].removesuffix("-redo")
            rows[r["model"], r["depth"]] = r
    rows = [rows[k] for k in sorted(rows)]
    if save:
        with open(save, "w") as f:
            json.dump(rows, f, indent=1)
    print("| twin | depth | llama.cpp before / after | tallow (samples) | ratio | fill tok/s llama.cpp / tallow | plan MiB (KV + state) | hold end, load |")
    print("|---|---:|---:|---|---:|---:|---:|---|")
    for r in rows:
        p = r.get("plan")
        mem = f"{p['total'] / MIB:.0f} ({p['kv'] / MIB:.0f} + {p['state'] / MIB:.0f})" if p else "-"
        print(f"| {r['model']} | {r['depth']} | {fmt(r['llama_before'])} / {fmt(r['llama_after'])} | "
              f"{r['tallow']:.1f} ({', '.join(f'{s:.1f}' for s in r['tallow_samples'])}) | **{fmt(r['ratio'], '.2f')}×** | "
              f"{fmt(r['llama_fill'], '.0f')} / {fmt(r['tallow_fill'], '.0f')} | {mem} | {r['end']}, {r['load']:.1f} |")
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax_tg, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.2))
        for name in dict.fromkeys(r["model"] for r in rows):
            rs = [r for r in rows if r["model"] == name]
            d = [r["depth"] for r in rs]
            line, = ax_tg.plot(d, [r["tallow"] for r in rs], "o-", label=f"{name} (tallow)")
            ax_tg.plot(d, [mean(x for x in (r["llama_before"], r["llama_after"]) if x) for r in rs], "x--",
                       color=line.get_color(), label=f"{name} (llama.cpp)")
            if all(r.get("plan") for r in rs):
                ax_mem.plot(d, [r["plan"]["total"] / MIB for r in rs], "o-", color=line.get_color(), label=name)
        for ax, title in ((ax_tg, "decode tg64 on 2 CPU threads (tok/s)"), (ax_mem, "tallow's memory plan (MiB)")):
            ax.set_title(title)
            ax.set_xlabel("context depth (tokens)")
            ax.grid(alpha=0.3)
        ax_tg.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(plot, dpi=80)


if __name__ == "__main__":
    main()
