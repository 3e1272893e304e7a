"""Decode speed with and without prompt-lookup speculation, greedy, on input-grounded and open work.

    python scripts/speculate_bench.py [-m qwen2.5-coder-1.5b-instruct smollm2-135m] [-t TASK ...] [-n 160] [-r 3] [--json]

Tasks: tool calls that copy names and ids from a device list in the system prompt, once as free
text (the tools described in the prompt: what tool_choice "auto" leaves to the model) and once
as an agent loop through the tools API with tool_choice "required" (the grammar forces a call;
8 turns, each adding the model's call and an "ok" result to the conversation); editing a
code snippet (the function repeated with a variable renamed); open-ended prose. Each run is a
fresh request (KV pool reset) at temperature 0; runs with and without speculation alternate so
that a busy machine slows both alike. Reports the median decode tok/s of each, the speedup (ratio
of the medians), the paired speedup (median over reps of each speculative run's tok/s over the
plain run just before it), the acceptance rate (accepted / drafted tokens), and checks that the
two texts are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass

DEVICES = """\
| id | name | room | kind |
|---|---|---|---|
| lt-kit-0193 | kitchen ceiling light | kitchen | dimmable light |
| lt-kit-0194 | kitchen counter strip | kitchen | dimmable light |
| lt-liv-0311 | living room floor lamp | living room | dimmable light |
| lt-liv-0312 | living room reading lamp | living room | dimmable light |
| bl-bed-0720 | bedroom blinds | bedroom | blinds |
| bl-liv-0721 | living room blinds | living room | blinds |
| th-hal-0005 | hallway thermostat | hallway | thermostat |
| sp-kit-0440 | kitchen speaker | kitchen | speaker |
| pl-off-0902 | office smart plug | office | plug |
| lk-fro-0017 | front door lock | entrance | lock |"""

TOOLS_SYSTEM = f"""You are the home assistant of a smart home. You act only through these tools:
- set_light(device_id: string, brightness: integer 0-100)
- set_blinds(device_id: string, position: integer 0-100)
- set_thermostat(device_id: string, celsius: number)
- lock(device_id: string, locked: boolean)
Answer with one JSON object per line and nothing else, for example:
{{"name": "set_light", "arguments": {{"device_id": "lt-kit-0193", "brightness": 40}}}}
Use only these devices, with their exact ids:
{DEVICES}"""

DEVICE_ID = "^[a-z]{2}-[a-z]{3}-[0-9]{4}$"  # the ids' format, as a harness would declare it


def _tool(name: str, description: str, value: str, value_schema: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {"device_id": {"type": "string", "pattern": DEVICE_ID}, value: value_schema},
        "required": ["device_id", value]}}}


# The same four tools for the API (tools=..., tool_choice="required": an agent harness that forces
# calls; the grammar then constrains every token and drafts must pass its mask).
TOOLS = [
    _tool("set_light", "Set a light's brightness (0 = off).", "brightness", {"type": "integer", "minimum": 0, "maximum": 100}),
    _tool("set_blinds", "Set blinds' position (0 = closed).", "position", {"type": "integer", "minimum": 0, "maximum": 100}),
    _tool("set_thermostat", "Set a thermostat's target temperature.", "celsius", {"type": "number"}),
    _tool("lock", "Lock or unlock a lock.", "locked", {"type": "boolean"}),
]
DEVICES_SYSTEM = f"""You are the home assistant of a smart home. Act through the tools: in one answer, make every
call the request needs, one call per device.
Use only these devices, with their exact ids:
{DEVICES}"""

TOOLS_USER = ("Good night routine: dim the kitchen ceiling light and the kitchen counter strip to 10, turn off both "
              "living room lamps, close the bedroom blinds and the living room blinds, set the hallway thermostat "
              "to 18.5 and lock the front door.")

CODE = '''def summarize_orders(orders, currency="EUR"):
    """Total, average and largest order amount per customer."""
    per_customer = {}
    for order in orders:
        if order.get("currency", currency) != currency:
            continue
        customer = order["customer_id"]
        amount = float(order["amount"])
        entry = per_customer.setdefault(customer, {"count": 0, "total": 0.0, "largest": 0.0})
        entry["count"] += 1
        entry["total"] += amount
        if amount > entry["largest"]:
            entry["largest"] = amount
    summary = []
    for customer, entry in sorted(per_customer.items()):
        average = entry["total"] / entry["count"]
        summary.append({"customer_id": customer, "total": round(entry["total"], 2),
                        "average": round(average, 2), "largest": entry["largest"]})
    return summary
'''

TASKS = {
    # tools described in the system prompt, free text: what tool_choice "auto" leaves to the model
    "tool calls": [{"role": "system", "content": TOOLS_SYSTEM}, {"role": "user", "content": TOOLS_USER}],
    "tool calls, required": [{"role": "system", "content": DEVICES_SYSTEM}, {"role": "user", "content": TOOLS_USER}],
    "code edit": [{"role": "user", "content": "Repeat this function exactly, but rename the variable `entry` to "
                   "`stats` everywhere. Answer with the code only.\n\n```python\n" + CODE + "```"}],
    "prose": [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in "
               "a bottle. Make it vivid and original."}],
}
AGENT_TASK = "tool calls, required"  # an agent loop: tools API, tool_choice "required", AGENT_TURNS turns
AGENT_TURNS, AGENT_TURN_TOKENS = 8, 60  # one turn per device of the routine; a call is ~35 tokens
INPUT_GROUNDED = ("tool calls", "tool calls, required", "code edit")


@dataclass
class RunStats:
    """What one run decoded, summed over its requests (an agent run is several turns)."""
    decode_tokens: int = 0
    decode_s: float = 0.0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def add(self, stats) -> None:
        self.decode_tokens += stats.decode_tokens
        self.decode_s += stats.decode_s
        self.draft_tokens += stats.draft_tokens
        self.accepted_tokens += stats.accepted_tokens

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


def run(llm, task: str, enabled: bool, max_tokens: int) -> tuple[list[int], RunStats]:
    """One run of `task`, from a fresh KV pool. The agent task is AGENT_TURNS requests: each turn
    the model's calls and an "ok" result per call join the conversation (ids fixed so that every
    run renders the same prompt), and the next turn reuses the pool's prefix."""
    os.environ["TALLOW_SPECULATE"] = "1" if enabled else "0"
    llm.engine.reset()  # every run a fresh request: the same prefill, a decode measured from cold
    total, tokens = RunStats(), []
    if task != AGENT_TASK:
        out = llm.chat(TASKS[task], max_tokens=max_tokens, temperature=0.0)
        total.add(out.stats)
        return out.tokens, total
    messages = list(TASKS[task])
    for turn in range(AGENT_TURNS):
        out = llm.chat(messages, tools=TOOLS, tool_choice="required", max_tokens=AGENT_TURN_TOKENS, temperature=0.0)
        total.add(out.stats)
        tokens += out.tokens
        calls = [{"id": f"call_{turn}_{j}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for j, c in enumerate(out.tool_calls)]
        messages.append({"role": "assistant", "content": out.text, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    return tokens, total


def bench_model(name: str, tasks: list[str], max_tokens: int, reps: int) -> list[dict]:
    import tallow

    llm = tallow.load(name, ctx=2048, progress=False)
    rows = []
    for task in tasks:
        run(llm, task, True, 8)  # warm-up
        speeds = {False: [], True: []}
        drafted = accepted = 0
        texts = {}
        for _ in range(reps):
            for enabled in (False, True):
                tokens, stats = run(llm, task, enabled, max_tokens)
                speeds[enabled].append(stats.decode_tok_s)
                texts.setdefault(enabled, tokens)
                if texts[enabled] != tokens:
                    sys.exit(f"{name} {task}: two runs with speculation={enabled} gave different tokens")
                if enabled:
                    drafted, accepted = drafted + stats.draft_tokens, accepted + stats.accepted_tokens
        plain, spec = statistics.median(speeds[False]), statistics.median(speeds[True])
        rows.append(dict(model=name, task=task, tokens=len(texts[True]), plain_tok_s=round(plain, 2),
                         spec_tok_s=round(spec, 2), speedup=round(spec / plain, 3),
                         # each speculative run over the plain run just before it: robust to load that drifts
                         paired_speedup=round(statistics.median(s / p for p, s in zip(speeds[False], speeds[True])), 3),
                         acceptance=round(accepted / drafted, 3) if drafted else 0.0,
                         drafted_per_run=drafted // reps, identical=texts[True] == texts[False],
                         plain_runs=[round(s, 1) for s in speeds[False]], spec_runs=[round(s, 1) for s in speeds[True]]))
        print(_line(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _line(r: dict) -> str:
    return (f"| {r['model']} | {r['task']} | {r['tokens']} | {r['plain_tok_s']:.1f} | {r['spec_tok_s']:.1f} | "
            f"{r['speedup']:.2f}× | {r['paired_speedup']:.2f}× | {r['acceptance'] * 100:.0f}% | {'yes' if r['identical'] else 'NO'} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--models", nargs="+", default=["qwen2.5-coder-1.5b-instruct", "smollm2-135m"])
    ap.add_argument("-n", "--max-tokens", type=int, default=160)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-t", "--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    print("| model | task | tokens | plain tok/s | speculative tok/s | speedup | paired | acceptance | same text |", file=sys.stderr)
    print("|---|---|---:|---:|---:|---:|---:|---:|---|", file=sys.stderr)
    rows = [r for name in args.models for r in bench_model(name, args.tasks, args.max_tokens, args.reps)]
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
