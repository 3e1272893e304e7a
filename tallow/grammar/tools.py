"""Tool calls as grammars, in the model's own syntax.

Two syntaxes, chosen from the chat template:
* "hermes" (Qwen2.5 and other templates with `<tool_call>` tags): each call is
  `<tool_call>\\n{"name": "...", "arguments": {...}}\\n</tool_call>`, calls separated by a newline;
* "json" (every other model, e.g. Llama-style): the answer is the call object itself, or a
  JSON array of them when parallel calls are allowed — what `chat/parsers.py` recognises.

The call envelope is fixed text and the arguments are the tool's own JSON schema (`%json`), so
`$ref`s inside a tool resolve against that tool's schema. With `tool_choice: "auto"` the grammar
is lazy: free text is allowed, but once the answer opens a call — the tag anywhere, or a bare
or fenced JSON object at the start of the answer (the places the parser looks for one) — the
rest of the call is constrained and its name must be a declared tool.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import GrammarError
from .schema import json_rule
from .vocab import special_ids, special_token

TAG_OPEN, TAG_CLOSE = "<tool_call>", "</tool_call>"


def tool_syntax(template_source: str) -> str:
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
        rules.append(f"fn_{i}: {_lit('{' + json.dumps('name') + ': ' + json.dumps(name, ensure_ascii=False) + ', ' + json.dumps('arguments') + ': ')} args_{i} \"}}\"")
        rules.append(f"args_{i}: {args}")
        names.append(f"fn_{i}")
    if not names:
        raise GrammarError(f"'tool_choice' names function {only!r}, which is not among the declared tools.", "tool_choice")
    return rules, names


def tool_grammar(tok, tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool, syntax: str) -> str | None:
    """Lark for the request's tool calls, or None when nothing is constrained (choice "none")."""
    if not tools or choice == "none":
        return None
    only = choice["function"]["name"] if isinstance(choice, dict) else None
    rules, names = _functions(tools, only)
    many = parallel and only is None
    lines = ["%llguidance {}", "fn: " + " | ".join(names), *rules]
    if syntax == "hermes":
        lines.append(f"call: {_tag(tok, TAG_OPEN)} \"\\n\" fn \"\\n\" {_tag(tok, TAG_CLOSE)}")
        # Whitespace may follow the last call: a model that writes "</tool_call>\n" before its
        # end-of-turn token must not be forced into another call.
        lines.append("calls: call (WS call)* WS?" if many else "calls: call WS?")
    else:
        lines.append('calls: fn | "[" fn (", " fn)* "]"' if many else "calls: fn")
    if choice != "auto":
        lines.insert(1, "start: calls")
        return "\n".join(lines + [r"WS: /[ \t\n]+/"])
    # auto: free text, unless the answer opens a call. TEXT may not start like a JSON call (a
    # brace, or a code fence then a brace) nor contain the tag spelled out as text: those
    # prefixes can only continue as a constrained call.
    text = r"TEXT: /(?s:.+)/ & ~/(?s:\s*\{.*)/ & ~/(?s:\s*```(json)?\s*\{.*)/"
    # The openers are single terminals: a lexeme split across rules ("```" then "json") loses
    # against TEXT in llguidance's lexer and the call is never entered.
    json_starts = 'fn | BLANK fn | FENCE fn "\\n```"'
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
        lines.insert(1, f"start: free? | free? calls | {json_starts}")
    else:
        lines.insert(1, f"start: free? | {json_starts}")
    lines += [text, tail, r"WS: /[ \t\n]+/", r"BLANK: /[ \t\n]+/", r"FENCE: /[ \t\n]*```(json)?[ \t]*\n/"]
    return "\n".join(lines)
