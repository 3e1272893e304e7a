"""Gemma 4's tool calls as a grammar: ``<|tool_call>call:NAME{key:value,…}<tool_call|>``.

The syntax is the one chat/gemma4_parse.py reads: ``<|"|>`` quotes strings (the quote is a
special token, so free text can never forge one), keys are bare, numbers, ``true``, ``false``
and ``null`` are written as in JSON, objects and arrays as in JSON with optional spaces after
``{``, ``[``, ``,`` and ``:``. The call markers and the quote are special tokens, named here
by id (``<[48]>``).

Arguments follow the tool's JSON schema where the schema says something this syntax can hold:
objects with `properties` (their keys in sorted order — how Gemma 4's template writes calls
and declarations, so how the model learnt them; `required` ones present; no other keys),
string/number/integer/boolean/null types, `enum`/`const`, `items`, `anyOf`/`oneOf` and type
lists. Anything else (`pattern`, lengths, bounds, `$ref`, free objects) is held only to the
syntax: any value, as llama.cpp's own Gemma 4 grammar holds every argument. A thought channel
may come first (``<|channel>thought…<channel|>``), as llama.cpp's grammar allows.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import GrammarError

CALL_OPEN, CALL_CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
CHANNEL_OPEN, CHANNEL_CLOSE = "<|channel>", "<channel|>"
_MAX_DEPTH = 12  # deeper schemas fall back to any value (a guard, not a limit real tools meet)


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class _Rules:
    """Lark rules for Gemma 4 values, built from JSON schemas; shared rules named once."""

    def __init__(self, tok) -> None:
        self.lines: list[str] = []
        self.n = 0
        ids = {}
        for text in (CALL_OPEN, CALL_CLOSE, QUOTE, CHANNEL_OPEN, CHANNEL_CLOSE):
            tid = tok.token_to_id.get(text)
            if tid is None:
                raise GrammarError(f"The model's vocabulary has no {text!r} token, which Gemma 4's tool calls need.", "tool_choice")
            ids[text] = f"<[{tid}]>"
        self.ids = ids
        q = ids[QUOTE]
        self.lines += [
            f"g_value: g_string | g_object | g_array | G_NUMBER | \"true\" | \"false\" | \"null\"",
            f"g_string: {q} G_TEXT? {q}",
            'g_object: "{" G_WS? ("}" | g_member ("," G_WS? g_member)* G_WS? "}")',
            "g_member: G_KEY \":\" G_WS? g_value",
            'g_array: "[" G_WS? ("]" | g_value ("," G_WS? g_value)* G_WS? "]")',
            r"G_NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/",
            r"G_INTEGER: /-?(0|[1-9][0-9]*)/",
            r"G_TEXT: /(?s:.+)/",
            r"G_KEY: /[^:{}\[\],<>\s][^:{}\[\],<>\n]*/",
            'G_WS: " "',  # one space at most where the syntax allows space: no padding to max_tokens
        ]

    def rule(self, body: str) -> str:
        self.n += 1
        name = f"g_{self.n}"
        self.lines.append(f"{name}: {body}")
        return name

    def value(self, schema: Any, depth: int = 0) -> str:
        """The rule (or terminal) for values of `schema`; "g_value" when the schema says nothing usable."""
        if not isinstance(schema, dict) or depth > _MAX_DEPTH:
            return "g_value"
        if "const" in schema:
            return self._literal(schema["const"]) or "g_value"
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            alts = [self._literal(v) for v in schema["enum"]]
            return self.rule(" | ".join(alts)) if all(alts) else "g_value"
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return self.rule(" | ".join(self.value(s, depth + 1) for s in schema[key]))
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return self.rule(" | ".join(self.value({**schema, "type": k}, depth + 1) for k in kind))
        if kind == "string":
            return "g_string"
        if kind == "integer":
            return "G_INTEGER"
        if kind == "number":
            return "G_NUMBER"
        if kind == "boolean":
            return self.rule('"true" | "false"')
        if kind == "null":
            return self.rule('"null"')
        if kind == "array":
            items = self.value(schema.get("items"), depth + 1) if isinstance(schema.get("items"), dict) else "g_value"
            return self.rule(f'"[" G_WS? ("]" | {items} ("," G_WS? {items})* G_WS? "]")')
        if kind == "object" or "properties" in schema:
            return self.object(schema, depth)
        return "g_value"

    def object(self, schema: dict[str, Any], depth: int = 0) -> str:
        props = schema.get("properties")
        if not isinstance(props, dict) or schema.get("additionalProperties") not in (None, False):
            return "g_object"  # a free object: any keys, any values
        if not props:
            return self.rule('"{" G_WS? "}"')
        required = set(schema.get("required") or ())
        names = sorted(props)  # dictsort: the order Gemma 4's template writes keys in
        members = [self.rule(f"{_lit(k + ':')} G_WS? {self.value(props[k], depth + 1)}") for k in names]
        # rest_i: members i.. after one was written (each after a comma); first_i: the first
        # member written is i or a later one. Optional members may be skipped, required not.
        n = len(names)
        rest = [""] * (n + 1)
        first = [""] * n
        for i in range(n - 1, -1, -1):
            item = f'"," G_WS? {members[i]}'
            if names[i] not in required:
                item = f"({item})?"
            rest[i] = self.rule(f"{item} {rest[i + 1]}".strip())
            alts = [f"{members[i]} {rest[i + 1]}".strip()]
            if names[i] not in required and i + 1 < n:
                alts.append(first[i + 1])
            first[i] = self.rule(" | ".join(alts))
        body = first[0] if required else f"{first[0]}?"
        return self.rule(f'"{{" G_WS? {body} G_WS? "}}"')

    def _literal(self, value: Any) -> str | None:
        q = self.ids[QUOTE]
        if isinstance(value, str):
            return f"{q} {_lit(value)} {q}" if value else f"{q} {q}"
        if isinstance(value, bool):
            return _lit("true" if value else "false")
        if value is None:
            return '"null"'
        if isinstance(value, (int, float)):
            return _lit(json.dumps(value))
        return None


def gemma4_tool_grammar(tok, tools: list[dict[str, Any]], only: str | None, many: bool, choice: str,
                        free_special: str | None, answer: str | None) -> str:
    """Lark for Gemma 4 calls to `tools` (only the one named `only`, if given); `many`: several
    calls in a row. choice "auto": free text (which may hold the `free_special` tokens, a Lark
    token set), then calls; `answer`: under "auto", the response format's rule instead."""
    r = _Rules(tok)
    fns = []
    for tool in tools:
        fn = tool.get("function") or {}
        name = fn.get("name")
        if only is not None and name != only:
            continue
        fns.append(r.rule(f"{_lit(name)} {_args(r, fn.get('parameters'))}"))
    if not fns:
        raise GrammarError(f"'tool_choice' names function {only!r}, which is not among the declared tools.", "tool_choice")
    ids = r.ids
    lines = ["%llguidance {}"]
    call = f'{ids[CALL_OPEN]} "call:" g_fn {ids[CALL_CLOSE]}'
    body = [f"g_fn: {' | '.join(fns)}", f"g_call: {call}", "g_calls: g_call+" if many else "g_calls: g_call",
            f"g_thought: {ids[CHANNEL_OPEN]} G_THOUGHT {ids[CHANNEL_CLOSE]}", r"G_THOUGHT: /thought(?s:.*)/"]
    if choice != "auto":
        lines.append("start: g_thought? g_calls")
    elif answer is not None:
        lines.append("start: g_thought? (answer | g_calls)")
        body.append("answer: " + answer)
    else:
        # Free text (thought channels and other special tokens included), then calls or nothing:
        # a call opens only with its marker token, which free text cannot hold.
        lines.append("start: g_free? | g_free? g_calls")
        body.append(r"G_FREE: /(?s:.+)/")
        if free_special:
            body += ["g_free: G_FREE (g_special G_FREE?)* | (g_special G_FREE?)+", "g_special: " + free_special]
        else:
            body.append("g_free: G_FREE")
    return "\n".join(lines + body + r.lines)


def _args(r: _Rules, params: Any) -> str:
    """A call's arguments: always an object (a tool without parameters takes `{}`)."""
    if params is None:
        return r.rule('"{" G_WS? "}"')
    return r.object(params) if isinstance(params, dict) and params.get("type", "object") == "object" else "g_object"


def gemma4_answer_grammar(tok, answer: str) -> str:
    """A response format for Gemma 4: the formatted answer, after an optional thought channel
    (Gemma 4 thinks by default; llama.cpp's Gemma 4 grammar allows the thought here too)."""
    channel_open, channel_close = (f"<[{tok.token_to_id[t]}]>" for t in (CHANNEL_OPEN, CHANNEL_CLOSE))
    return "\n".join(["%llguidance {}", "start: g_thought? answer", f"g_thought: {channel_open} G_THOUGHT {channel_close}",
                      r"G_THOUGHT: /thought(?s:.*)/", "answer: " + answer])
