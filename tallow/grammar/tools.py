"""Tool calls as grammars, in the model's own syntax.

A call is `{"name": "...", "arguments": {...}}`, written in any of the forms `chat/parsers.py`
reads: bare objects one after another, a JSON array of them, either inside ```json fences, and —
for templates with `<tool_call>` tags ("hermes": Qwen2.5 and others) — each call in its tags,
`<tool_call>\\n{...}\\n</tool_call>`. `parallel_tool_calls: false` makes every form one call.
Gemma 4 ("gemma4") writes calls in a syntax of its own, built in gemma4_calls.py.

The call envelope is fixed text and the arguments are the tool's own JSON schema (`%json`), so
`$ref`s inside a tool resolve against that tool's schema. With `tool_choice: "auto"` the grammar
is the union OpenAI promises: free text (or, with a response format, the formatted answer) or
calls. It is lazy: once the answer opens a call — the tag anywhere, or a bare or fenced JSON
object or array at the start of the answer (the places the parser looks for one) — the rest of
the call is constrained and its name must be a declared tool.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import GrammarError
from .gemma4_calls import CALL_CLOSE as GEMMA4_CALL_CLOSE
from .gemma4_calls import CALL_OPEN as GEMMA4_CALL_OPEN
from .gemma4_calls import gemma4_tool_grammar
from .schema import json_rule
from .vocab import special_ids, special_token

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"
GEMMA4_MARKER = "'<|tool_call>call:'"  # Gemma 4's templates write calls in its own syntax (gemma4_calls.py)


def tool_syntax(template_source: str) -> str:
    if GEMMA4_MARKER in (template_source or ""):
        return "gemma4"
    return "hermes" if TAG_OPEN in (template_source or "") else "json"


def _lit(text: str) -> str:
    """A Lark string literal (JSON escapes are Lark's escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _tag(tok, text: str) -> str:
    """The tag as a special token when the vocabulary has it as one, else as text."""
    return f"<{text[1:-1]}>" if special_token(tok, text) else _lit(text)


def _ranges(ids: list[int]) -> str:
    """Token ids as llguidance's `<[a-b,c]>` set, runs merged."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return "<[" + ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs) + "]>"


def _functions(tools: list[dict[str, Any]], only: str | None) -> tuple[list[str], list[str]]:
    """Lark rules `fn_i` (one per callable tool) and the names of those rules."""
    rules, names = [], []
    for i, tool in enumerate(tools):
        fn = tool.get("function") or {}
        name = fn.get("name")
        if only is not None and name != only:
            continue
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        args = json_rule(params, f"tools[{i}].function.parameters")
        pieces = ["{", json.dumps("name"), ": ", json.dumps(name, ensure_ascii=False), ", ", json.dumps("arguments"), ": "]
        rules.append(f"fn_{i}: {' '.join(_lit(p) for p in pieces)} args_{i} \"}}\"")
        rules.append(f"args_{i}: {args}")
        names.append(f"fn_{i}")
    if not names:
        raise GrammarError(f"'tool_choice' names function {only!r}, which is not among the declared tools.", "tool_choice")
    return rules, names


def tool_grammar(tok, tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool, syntax: str,
                 answer: str | None = None) -> str | None:
    """Lark for the request's tool calls, or None when nothing is constrained (choice "none").

    `answer`: the response format's rule. Under "auto" the answer is then that format or calls
    (OpenAI's promise: a call, or the formatted answer), instead of free text or calls."""
    if not tools or choice == "none":
        return None
    only = choice["function"]["name"] if isinstance(choice, dict) else None
    many = parallel and only is None
    if syntax == "gemma4":
        markers = {tok.token_to_id.get(t) for t in (GEMMA4_CALL_OPEN, GEMMA4_CALL_CLOSE)}
        others = [i for i in special_ids(tok) if i not in tok.eog_ids and i not in markers]
        return gemma4_tool_grammar(tok, tools, only, many, choice if isinstance(choice, str) else "named",
                                   _ranges(others) if others else None, answer)
    rules, names = _functions(tools, only)
    lines = ["%llguidance {}", "fn: " + " | ".join(names), *rules]
    # Every call syntax the parser (chat/parsers.py) reads: bare objects one after another, a
    # JSON array, the same inside ```json fences, and (templates that have them) tags. With
    # parallel_tool_calls false each form holds exactly one call.
    if many:
        lines += ["seq: fn (WS fn)*", 'items: fn ("," WS? fn)* "]"', "fences: fenced (WS fenced)*"]
    else:
        lines += ["seq: fn", 'items: fn "]"', "fences: fenced"]
    lines.append('objs: seq | "[" items')
    # A fence opening an array is one terminal (FENCE_ARRAY), for the reason given at FENCE.
    lines.append('fenced: FENCE seq "\\n```" | FENCE_ARRAY items "\\n```"')
    if syntax == "hermes":
        lines.append("tags: tag (WS tag)*" if many else "tags: tag")
        lines.append(f"tag: {_tag(tok, TAG_OPEN)} \"\\n\" fn \"\\n\" {_tag(tok, TAG_CLOSE)}")
    # Whitespace may follow the last call: a model that writes "</tool_call>\n" before its
    # end-of-turn token must not be forced into another call.
    json_calls = "BLANK? objs WS? | fences WS?"
    calls = ("tags WS? | " + json_calls) if syntax == "hermes" else json_calls
    lines.append("calls: " + calls)
    # The openers are single terminals: a lexeme split across rules ("```" then "json", or the
    # fence then "[") loses against TEXT in llguidance's lexer and the call is never entered.
    lexemes = [r"WS: /[ \t\n]+/", r"BLANK: /[ \t\n]+/", r"FENCE: /[ \t\n]*```(json)?[ \t]*\n/", r"FENCE_ARRAY: /[ \t\n]*```(json)?[ \t]*\n\[/"]
    if choice != "auto":
        lines.insert(1, "start: calls")
        return "\n".join(lines + lexemes)
    if answer is not None:
        # The formatted answer or calls: a JSON answer and a bare call both open with a brace,
        # and the Earley parser keeps both alive until the call's fixed envelope rules one out.
        lines.insert(1, "start: BLANK? answer | calls")
        lines.append("answer: " + answer)
        return "\n".join(lines + lexemes)
    # auto: free text, unless the answer opens a call. TEXT may not start like a JSON call (a
    # brace, an array of objects, or a code fence then either) nor contain the tag spelled out
    # as text: those prefixes can only continue as a constrained call.
    text = r"TEXT: /(?s:.+)/ & ~/(?s:\s*\[?\{.*)/ & ~/(?s:\s*```(json)?\s*\[?\{.*)/"
    # Free text may hold the model's other special tokens (a reasoning model's <think> block),
    # never the call tags or an end-of-generation token (that ends the grammar).
    tags = {tok.token_to_id.get(TAG_OPEN), tok.token_to_id.get(TAG_CLOSE)}
    others = [i for i in special_ids(tok) if i not in tok.eog_ids and i not in tags]
    # After such a token the text is free of the start-of-answer rules (TAIL), but still
    # cannot spell the tag.
    tail = r"TAIL: /(?s:.+)/"
    if others:
        lines.append("free: TEXT (special TAIL?)* | (special TAIL?)+")
        lines.append("special: " + _ranges(others))
    else:
        lines.append("free: TEXT")
    if syntax == "hermes":
        text += r" & ~/(?s:.*<tool_call>.*)/"
        tail += r" & ~/(?s:.*<tool_call>.*)/"
        lines.insert(1, f"start: free? | free? tags WS? | {json_calls}")
    else:
        lines.insert(1, f"start: free? | {json_calls}")
    return "\n".join(lines + [text, tail] + lexemes)
