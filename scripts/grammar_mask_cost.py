"""Mask cost per token next to decode time per token, on real generations (CPU).

    python scripts/grammar_mask_cost.py [/root/models/qwen2.5-coder-1.5b-instruct.gguf ...]
    python scripts/grammar_mask_cost.py --walk [MODEL.gguf ...]

--walk skips the model: it times mask+advance while walking fixed texts (a JSON instance; prose
under the tool_choice "auto" grammar) token by token — seconds instead of minutes, the same
per-token work the decode loop does.

Each generation runs with a grammar (a json_schema answer; a tool_choice "auto" answer under
the triggered grammar, which is the costliest grammar we build: free text checked against
three negated regexes) and the constraint's `mask` and `advance` calls are timed inside the
real decode loop, in thread CPU time (the mask runs on the sampling thread; CPU time is not
inflated when a busy machine preempts us). Reported per committed token: mask+advance ms, decode
ms (wall: the engine's own decode_s / decode_tokens), their ratio, and a checksum of the tokens
(two runs under different switches, e.g. TALLOW_GPU_MASK=0, must print the same).
"""

from __future__ import annotations

import statistics
import sys
import time
import zlib

import tallow
from tallow.grammar.constraint import GrammarConstraint

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "hobbies": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "hobbies"]}

times: list[float] = []  # per committed token: prepare + mask + advance, thread CPU seconds
_pending = [0.0]
_prepare, _mask, _advance = GrammarConstraint.prepare, GrammarConstraint.mask, GrammarConstraint.advance


def _timed(fn, commit: bool = False):
    def run(self, *args):
        t0 = time.thread_time()
        fn(self, *args)
        _pending[0] += time.thread_time() - t0
        if commit:
            times.append(_pending[0])
            _pending[0] = 0.0
    return run


GrammarConstraint.prepare, GrammarConstraint.mask = _timed(_prepare), _timed(_mask)
GrammarConstraint.advance = _timed(_advance, commit=True)


def walk(paths: list[str]) -> None:
    import json

    import torch

    from tallow.chat.template import ChatTemplate
    from tallow.gguf_file import GGUFFile
    from tallow.grammar import GrammarSpec, build_constraint
    from tallow.tokenizer import Tokenizer

    prose = "The weather in Paris is mild today, with a light breeze from the west and a few clouds drifting over the Seine. " * 2
    instance = json.dumps({"name": "Ada Lovelace", "age": 36, "hobbies": ["mathematics", "poetry", "analytical engines", "music"]})
    print("| model | vocab | grammar | tokens | mask+advance ms/token (median / mean / max) |")
    print("|---|---:|---|---:|---:|")
    for path in paths:
        gf = GGUFFile(path)
        tok, src = Tokenizer.from_gguf(gf), ChatTemplate.from_gguf(gf).source
        for label, spec, text in (("json_schema", GrammarSpec(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}), instance),
                                  ("tools auto, prose", GrammarSpec(tools=TOOLS, tool_choice="auto"), prose)):
            c = build_constraint(tok, tok.vocab_size, spec, src)
            x = torch.randn(tok.vocab_size)
            ms = []
            for t in tok.encode(text, add_special=False):
                y = torch.from_numpy(x.numpy().copy())
                t0 = time.thread_time()
                _mask(c, y)
                _advance(c, t)
                ms.append((time.thread_time() - t0) * 1000)
            ms = ms[1:]  # the first mask includes llguidance's lazy compile
            name = path.rsplit("/", 1)[-1].removesuffix(".gguf")
            print(f"| {name} | {tok.vocab_size} | {label} | {len(ms)} | {statistics.median(ms):.3f} / {statistics.mean(ms):.3f} / {max(ms):.3f} |", flush=True)


if sys.argv[1:2] == ["--walk"]:
    walk(sys.argv[2:] or [f"/root/models/{n}.gguf" for n in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct")])
    sys.exit(0)

print("| model | vocab | grammar | tokens | mask+advance ms/token (median / mean / max) | decode ms/token | mask / decode | tokens crc |")
print("|---|---:|---|---:|---:|---:|---:|---:|")
for path in sys.argv[1:] or ["/root/models/qwen2.5-coder-1.5b-instruct.gguf", "/root/models/gemma3-270m.gguf"]:
    llm = tallow.LLM(path, ctx=1024)
    name = path.rsplit("/", 1)[-1].removesuffix(".gguf")
    for label, kw, msgs in (
        ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, [{"role": "user", "content": "Describe a person with many hobbies as JSON."}]),
        ("tools auto (triggered)", {"tools": TOOLS, "tool_choice": "auto"}, [{"role": "user", "content": "Write a short poem about the weather in Paris."}]),
    ):
        llm.chat(msgs, max_tokens=4, **kw)  # warm: grammar tokenizer built and cached
        times.clear()
        _pending[0] = 0.0
        out = llm.chat(msgs, max_tokens=64, **kw)
        ms = [t * 1000 for t in times]
        decode = out.stats.decode_s / max(out.stats.decode_tokens, 1) * 1000
        print(f"| {name} | {llm.spec.vocab_size} | {label} | {len(ms)} | {statistics.median(ms):.3f} / {statistics.mean(ms):.3f} / {max(ms):.3f} | {decode:.1f} | {statistics.mean(ms) / decode:.1%} | {zlib.crc32(str(out.tokens).encode()):08x} |", flush=True)
