"""Mask cost per token next to decode time per token, on real generations (CPU).

    python scripts/grammar_mask_cost.py [/root/models/qwen2.5-coder-1.5b-instruct.gguf ...]

Each generation runs with a grammar (a json_schema answer; a tool_choice "auto" answer under
the triggered grammar, which is the costliest grammar we build: free text checked against
three negated regexes) and the constraint's `mask` and `advance` calls are timed inside the
real decode loop. Reported per committed token: mask+advance ms, decode ms (the engine's own
decode_s / decode_tokens), and their ratio.
"""

from __future__ import annotations

import statistics
import sys
import time

import tallow
from tallow.grammar.constraint import GrammarConstraint

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "hobbies": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "hobbies"]}

times: list[float] = []
_mask, _advance = GrammarConstraint.mask, GrammarConstraint.advance


def timed_mask(self, logits):
    t0 = time.perf_counter()
    _mask(self, logits)
    times.append(time.perf_counter() - t0)


def timed_advance(self, token):
    t0 = time.perf_counter()
    _advance(self, token)
    times[-1] += time.perf_counter() - t0


GrammarConstraint.mask, GrammarConstraint.advance = timed_mask, timed_advance

print("| model | vocab | grammar | tokens | mask+advance ms/token (median / mean / max) | decode ms/token | mask / decode |")
print("|---|---:|---|---:|---:|---:|---:|")
for path in sys.argv[1:] or ["/root/models/qwen2.5-coder-1.5b-instruct.gguf", "/root/models/gemma3-270m.gguf"]:
    llm = tallow.LLM(path, ctx=1024)
    name = path.rsplit("/", 1)[-1].removesuffix(".gguf")
    for label, kw, msgs in (
        ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, [{"role": "user", "content": "Describe a person with many hobbies as JSON."}]),
        ("tools auto (triggered)", {"tools": TOOLS, "tool_choice": "auto"}, [{"role": "user", "content": "Write a short poem about the weather in Paris."}]),
    ):
        llm.chat(msgs, max_tokens=4, **kw)  # warm: grammar tokenizer built and cached
        times.clear()
        out = llm.chat(msgs, max_tokens=64, **kw)
        ms = [t * 1000 for t in times]
        decode = out.stats.decode_s / max(out.stats.decode_tokens, 1) * 1000
        print(f"| {name} | {llm.spec.vocab_size} | {label} | {len(ms)} | {statistics.median(ms):.3f} / {statistics.mean(ms):.3f} / {max(ms):.3f} | {decode:.1f} | {statistics.mean(ms) / decode:.1%} |", flush=True)
