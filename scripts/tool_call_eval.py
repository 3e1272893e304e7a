"""Issue 6's tool-call and JSON targets, measured through the Python API (the server's code path).

    python scripts/tool_call_eval.py [--models DIR] [--required 100] [--auto 100] [--json 2]

1. tool_choice "required": N varied requests over four tools with nested argument schemas on
   qwen2.5-coder-1.5b-instruct; a call is valid when it names a declared tool and its arguments
   validate (jsonschema) against that tool's parameters.
2. tool_choice "auto" on prompts that clearly need a tool, with the triggered grammar
   (default) and without it (TALLOW_GRAMMAR_AUTO=0): how many answers carry tool_calls, and
   how many of those are valid.
3. response_format json_schema over a set of schemas on all three models: how many outputs
   parse and validate, how many were closed early to fit max_tokens (grammar/closing.py) and
   what the closing cost per sampled token.
Greedy decoding (temperature 0) throughout, so a rerun gives the same counts. This measures
validity, not speed: it runs on one torch thread by default.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import jsonschema

import tallow
from tallow.grammar.constraint import GrammarConstraint

TOOLS = [
    {"type": "function", "function": {
        "name": "create_event", "description": "Create a calendar event.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"},
            "start": {"type": "object", "properties": {"date": {"type": "string", "description": "YYYY-MM-DD"}, "time": {"type": "string", "description": "HH:MM"}}, "required": ["date", "time"]},
            "attendees": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "email": {"type": "string"}}, "required": ["name"]}},
        }, "required": ["title", "start"]}}},
    {"type": "function", "function": {
        "name": "set_thermostat", "description": "Set the target temperature of a room.",
        "parameters": {"$defs": {"temp": {"type": "object", "properties": {"value": {"type": "number"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["value", "unit"]}},
                       "type": "object", "properties": {"room": {"enum": ["kitchen", "bedroom", "living_room", "office"]}, "target": {"$ref": "#/$defs/temp"}}, "required": ["room", "target"]}}},
    {"type": "function", "function": {
        "name": "search_products", "description": "Search the shop's catalogue.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object", "properties": {"max_price": {"type": "number"}, "categories": {"type": "array", "items": {"type": "string"}}, "in_stock": {"type": "boolean"}}},
        }, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "send_message", "description": "Send a chat message to a contact.",
        "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}, "priority": {"enum": ["low", "normal", "high"]}}, "required": ["to", "body"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

PEOPLE = ["Alice", "Bob", "Chen", "Dana", "Emeka"]
ROOMS = ["kitchen", "bedroom", "living room", "office"]
THINGS = ["running shoes", "a coffee grinder", "noise-cancelling headphones", "a desk lamp", "a yoga mat"]
REQUIRED_PROMPTS = (
    [f"Schedule a meeting called 'Sprint review' with {p} on 2026-12-{d:02d} at {h}:30." for p, d, h in zip(PEOPLE * 5, range(1, 26), itertools.cycle([9, 11, 14, 16]))]
    + [f"Set the {r} to {t} degrees {u}." for r, t, u in zip(ROOMS * 7, range(16, 41), itertools.cycle(["celsius", "fahrenheit"]))]
    + [f"Find {x} under {p} dollars{' that are in stock' if i % 2 else ''}." for i, (x, p) in enumerate(zip(THINGS * 5, range(20, 520, 20)))]
    + [f"Tell {p} that {m}." for p, m in zip(PEOPLE * 5, itertools.cycle(["dinner is at eight", "the build is green", "I am running late", "the package arrived", "we won the match"]))]
)
AUTO_PROMPTS_WRITTEN = [
    "Please schedule lunch with Bob tomorrow, 2026-12-03 at 12:00.",
    "It's freezing in the bedroom, set it to 22 celsius.",
    "Search the shop for a kettle under 40 dollars.",
    "Send Alice a message saying the meeting moved to 3pm.",
    "Make the office 70 fahrenheit please.",
    "Create an event 'Dentist' on 2026-12-10 at 08:15.",
    "Look for hiking boots in stock, max 150 dollars.",
    "Message Dana: the report is ready, high priority.",
    "Book a call titled 'Budget' with Chen and Emeka on 2026-12-04 at 16:00.",
    "Turn the kitchen thermostat down to 18 celsius.",
    "Find me a mechanical keyboard.",
    "Let Bob know I'll be there in ten minutes.",
    "Set up 'Team standup' on 2026-12-07 at 09:00 with Alice.",
    "The living room should be at 21 celsius.",
    "Search for wireless earbuds under 80 dollars.",
    "Send a low priority note to Emeka: thanks for the help.",
    "Add 'Gym' to my calendar on 2026-12-05 at 18:30.",
    "Heat the office to 23 celsius.",
    "Is there a standing desk in the catalogue under 300 dollars?",
    "Tell Chen the server is back up.",
]
# 80 more, generated like REQUIRED_PROMPTS but worded differently (questions, complaints,
# notes-to-self, imperatives), 20 per tool, each template filled with 4 different values.
EVENT_TITLES = ["Design review", "Piano lesson", "Quarterly planning", "Car service", "Book club", "Vet appointment", "Board sync", "Haircut", "Parent-teacher meeting", "Release retro"]
EVENT_TEMPLATES = [
    "Could you put '{title}' in my calendar for {date} at {time}?",
    "I have {title} on {date} at {time}, with {person}. Add it to my schedule.",
    "Don't let me forget: {title}, {date}, {time}. Create the event.",
    "Please book '{title}' on {date} starting {time} and invite {person}.",
    "New calendar entry please: {title} at {time} on {date}.",
]
THERMO_TEMPLATES = [
    "Could you warm the {room} up to {value} degrees {unit}?",
    "It's way too hot in the {room}; bring it down to {value} {unit}.",
    "I'd like the {room} thermostat at {value} {unit} tonight.",
    "Change the {room} temperature to {value} {unit}, please.",
    "Adjust the heating in the {room} so it targets {value} degrees {unit}.",
]
SHOP_ITEMS = ["a cast iron pan", "a rain jacket", "a bike helmet", "a mechanical pencil set", "a travel backpack", "an electric toothbrush", "a bluetooth speaker", "a chess board", "a water bottle", "a laptop stand"]
SHOP_TEMPLATES = [
    "Do you have {item} for less than {price} dollars?",
    "I'm shopping for {item}; check the catalogue, budget {price} dollars.",
    "Show me {item} that is in stock right now.",
    "Look up {item} in the store, nothing above {price} dollars.",
    "Can you find {item} in the shop's catalogue?",
]
NOTES = ["the train is delayed", "lunch is on me today", "the keys are under the mat", "the demo moved to Friday", "I fixed the failing test", "call me back when you can", "the invoice was paid", "the meeting room changed to B2"]
MESSAGE_TEMPLATES = [
    "Drop {person} a line: {note}.",
    "Ping {person} and say {note}, high priority.",
    "Could you text {person} that {note}?",
    "Notify {person} right away: {note}.",
    "Write to {person}, low priority, that {note}.",
]


def _generated_auto_prompts() -> list[str]:
    prompts = []
    for i, template in enumerate(EVENT_TEMPLATES * 4):
        date, time_ = f"2027-01-{(11 * i) % 28 + 1:02d}", f"{8 + (3 * i) % 11:02d}:{(15 * i) % 60:02d}"
        prompts.append(template.format(title=EVENT_TITLES[i % len(EVENT_TITLES)], date=date, time=time_, person=PEOPLE[(3 * i + i // 5) % len(PEOPLE)]))
    for i, template in enumerate(THERMO_TEMPLATES * 4):
        unit = ("celsius", "fahrenheit")[(i // 5) % 2]
        value = 16 + i // 2 if unit == "celsius" else 60 + i
        prompts.append(template.format(room=ROOMS[(3 * i + i // 5) % 4], value=value, unit=unit))
    for i, template in enumerate(SHOP_TEMPLATES * 4):
        prompts.append(template.format(item=SHOP_ITEMS[(i + i // 5) % len(SHOP_ITEMS)], price=15 + 25 * (i % 9)))
    for i, template in enumerate(MESSAGE_TEMPLATES * 4):
        prompts.append(template.format(person=PEOPLE[(i + i // 5) % len(PEOPLE)], note=NOTES[i % len(NOTES)]))
    return prompts


AUTO_PROMPTS = AUTO_PROMPTS_WRITTEN + _generated_auto_prompts()
JSON_SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}, "population": {"type": "integer"}, "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}, "required": ["city", "country", "landmarks"]},
    {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}, "confidence": {"type": "number"}}, "required": ["sentiment", "confidence"]},
    {"$defs": {"item": {"type": "object", "properties": {"product": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}, "required": ["product", "qty"]}},
     "type": "object", "properties": {"customer": {"type": "string"}, "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 3}}, "required": ["customer", "items"]},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 60}, "done": {"type": "boolean"}, "tags": {"type": "array", "items": {"enum": ["home", "work", "urgent"]}}}, "required": ["title", "done", "tags"]},
    # Added with budget-aware closing: deeper nesting, unbounded arrays and strings, optional keys.
    {"$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city"]}},
     "type": "object", "properties": {"name": {"type": "string"}, "home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"}, "phones": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "home", "phones"]},
    {"type": "object", "properties": {"recipe": {"type": "string"}, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
     "ingredients": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "amount": {"type": "number"}, "unit": {"enum": ["g", "ml", "cup", "tbsp", "piece"]}}, "required": ["name", "amount", "unit"]}, "minItems": 2},
     "steps": {"type": "array", "items": {"type": "string"}}}, "required": ["recipe", "servings", "ingredients", "steps"]},
    {"type": "object", "properties": {"summary": {"type": "string"}, "keywords": {"type": "array", "items": {"type": "string"}, "minItems": 1}, "scores": {"type": "object", "properties": {"clarity": {"type": "number", "minimum": 0, "maximum": 1}, "accuracy": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["clarity"]},
     "language": {"enum": ["en", "fr", "de"]}}, "required": ["summary", "keywords", "scores", "language"]},
]
JSON_PROMPTS = ["Describe an example as JSON.", "Make up a realistic record and give it as JSON."]


def valid_call(call) -> bool:
    schema = SCHEMAS.get(call.name)
    if schema is None:
        return False
    try:
        jsonschema.validate(json.loads(call.arguments), schema)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def required_eval(llm, n: int, max_tokens: int) -> dict:
    valid = calls = answers_with_calls = tokens = 0
    t0 = time.perf_counter()
    for k, prompt in enumerate((REQUIRED_PROMPTS * 4)[:n]):
        if k and k % 10 == 0:
            print(f"  required {k}/{n}: {valid} valid so far", flush=True)
        out = llm.chat([{"role": "user", "content": prompt}], tools=TOOLS, tool_choice="required", max_tokens=max_tokens)
        tokens += len(out.tokens)
        calls += len(out.tool_calls)
        answers_with_calls += bool(out.tool_calls)
        ok = bool(out.tool_calls) and all(valid_call(c) for c in out.tool_calls)
        valid += ok
        if not ok:
            print("  invalid:", prompt, "->", repr(out.text[:200]), out.finish_reason, flush=True)
    return {"requests": n, "valid_answers": valid, "answers_with_calls": answers_with_calls, "calls": calls, "tokens": tokens, "s": round(time.perf_counter() - t0, 1)}


def auto_eval(llm, triggered: bool, n: int, max_tokens: int) -> dict:
    os.environ["TALLOW_GRAMMAR_AUTO"] = "1" if triggered else "0"
    with_calls = valid = 0
    prompts = AUTO_PROMPTS[:n]
    for prompt in prompts:
        out = llm.chat([{"role": "user", "content": prompt}], tools=TOOLS, tool_choice="auto", max_tokens=max_tokens)
        with_calls += bool(out.tool_calls)
        valid += bool(out.tool_calls) and all(valid_call(c) for c in out.tool_calls)
        if not out.tool_calls:
            print(f"  no call (triggered={triggered}):", prompt, "->", repr(out.text[:120]), out.finish_reason, flush=True)
        elif not all(valid_call(c) for c in out.tool_calls):
            print(f"  invalid call (triggered={triggered}):", prompt, "->", [(c.name, c.arguments[:120]) for c in out.tool_calls], flush=True)
    os.environ.pop("TALLOW_GRAMMAR_AUTO", None)
    return {"prompts": len(prompts), "with_tool_calls": with_calls, "valid": valid}


def json_eval(llm, per_schema: int, max_tokens: int) -> dict:
    ok = total = truncated = closed = tokens = 0
    closing_s = [0.0]
    close = GrammarConstraint._close_within_budget

    def timed_close(self, x):  # the closing's own cost per token, measured in place
        t0 = time.perf_counter()
        close(self, x)
        closing_s[0] += time.perf_counter() - t0

    GrammarConstraint._close_within_budget = timed_close
    for schema in JSON_SCHEMAS:
        for prompt in JSON_PROMPTS[:per_schema]:
            rf = {"type": "json_schema", "json_schema": {"name": "record", "schema": schema}}
            out = llm.chat([{"role": "user", "content": prompt + " Fields: " + ", ".join(schema["properties"])}], response_format=rf, max_tokens=max_tokens)
            total += 1
            truncated += out.finish_reason == "length"
            closed += out.stats.grammar_steered > 0
            tokens += len(out.tokens) + (out.finish_reason == "stop")
            if out.stats.grammar_steered:
                print(f"  closed early ({out.stats.grammar_steered} tokens steered):", repr(out.text[-100:]), flush=True)
            try:
                jsonschema.validate(json.loads(out.text), schema)
                ok += 1
            except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
                print("  invalid json:", repr(out.text[:160]), out.finish_reason, type(exc).__name__, flush=True)
    GrammarConstraint._close_within_budget = close
    return {"outputs": total, "valid": ok, "cut_by_max_tokens": truncated, "closed_early": closed, "sampled_tokens": tokens,
            "closing_us_per_token": round(closing_s[0] / max(tokens, 1) * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="/root/models")
    ap.add_argument("--required", type=int, default=100)
    ap.add_argument("--json", type=int, default=2, help="prompts per schema")
    ap.add_argument("--auto", type=int, default=len(AUTO_PROMPTS), help=f"tool_choice auto prompts (at most {len(AUTO_PROMPTS)})")
    ap.add_argument("--skip-auto", action="store_true")
    ap.add_argument("--skip-json", action="store_true")
    ap.add_argument("--json-models", default="qwen2.5-coder-1.5b-instruct,smollm2-135m,gemma3-270m")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 keeps a shared machine's scheduler from stalling every op)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    results = {}
    json_models = args.json_models.split(",") if not args.skip_json else []
    qwen = None
    if args.required or (args.auto and not args.skip_auto) or "qwen2.5-coder-1.5b-instruct" in json_models:
        qwen = tallow.load(f"{args.models}/qwen2.5-coder-1.5b-instruct.gguf", ctx=2048, progress=False)
    if args.required:
        results["required"] = required_eval(qwen, args.required, 120)
        print("required:", results["required"], flush=True)
    if args.skip_auto:
        args.auto = 0
    if args.auto:
        results["auto_triggered"] = auto_eval(qwen, True, args.auto, 100)
        print("auto with triggered grammar:", results["auto_triggered"], flush=True)
        results["auto_free"] = auto_eval(qwen, False, args.auto, 100)
        print("auto without it:", results["auto_free"], flush=True)
    results["json_schema"] = {}
    for name in json_models:
        llm = qwen if name == "qwen2.5-coder-1.5b-instruct" else tallow.load(f"{args.models}/{name}.gguf", ctx=2048, progress=False)
        results["json_schema"][name] = json_eval(llm, args.json, 160)
        print("json_schema:", results["json_schema"], flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
