"""Split a model's chat output into reasoning, answer text and tool calls — streaming or not.

Models write their thinking and their tool calls as plain text with markers:

* reasoning: ``<think>…</think>`` at the start of the answer (Qwen3/DeepSeek style). A
  template may open the block itself (its generation prompt ends with ``<think>``), so the
  parser can start inside it (`starts_in_reasoning`).
* tool calls: Qwen/Hermes ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (several
  per turn), and a generic fallback for models without a syntax of their own: an answer that
  is nothing but a fenced ```json block or a bare JSON object (or list of them) whose
  ``name`` is a declared tool and whose ``arguments`` (Llama 3 says ``parameters``) is an
  object.

The parsers are incremental because the server streams: each `push` returns what can be
shown *now*, and holds back text that may still turn into a marker (``<too`` could become
``<tool_call>``), so no half-marker ever reaches a client. The non-streaming result is the
same machine run over the whole text (`parse_chat_output`), so both paths always agree.
A tool call whose JSON does not parse is returned as content, never dropped.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChatOutputParser",
    "ParsedDelta",
    "ReasoningParser",
    "ToolCall",
    "ToolCallParser",
    "parse_chat_output",
]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
FENCE = "```"


def new_tool_call_id() -> str:
    """A unique id in OpenAI's shape (`call_` + 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    name: str
    arguments: str  # always a JSON text, as the OpenAI wire format wants
    id: str = field(default_factory=new_tool_call_id)

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


@dataclass
class ParsedDelta:
    """What one push released: thinking text, answer text, completed tool calls."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def extend(self, other: ParsedDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """Routes a leading ``<think>…</think>`` block to reasoning, everything else to content.

    Only a block at the very start of the answer (after whitespace) counts as thinking: a
    model that writes ``<think>`` in the middle of an answer is talking about the tag.
    """

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        # "start": not yet known whether a block opens; "think": inside it; "gap": whitespace
        # after it; "content": the answer.
        self._state = "think" if starts_in_reasoning else "start"
        self._buf = ""

    def push(self, text: str) -> tuple[str, str]:
        """Add generated text; return (reasoning, content) that is safe to release now."""
        self._buf += text
        reasoning = content = ""
        while self._buf:
            if self._state == "start":
                stripped = self._buf.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self._buf = stripped[len(THINK_OPEN) :]
                    self._state = "think"
                    continue
                if not stripped or THINK_OPEN.startswith(stripped):
                    break  # could still become "<think>": wait for more text
                self._state = "content"
                continue
            if self._state == "think":
                i = self._buf.find(THINK_CLOSE)
                if i != -1:
                    reasoning += self._buf[:i]
                    self._buf = self._buf[i + len(THINK_CLOSE) :]
                    self._state = "gap"
                    continue
                keep = _partial_suffix(self._buf, THINK_CLOSE)
                reasoning += self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep :]
                break
            if self._state == "gap":
                # Templates put blank lines between the block and the answer: not content.
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self._state = "content"
            content += self._buf
            self._buf = ""
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        """The answer ended: release what was held back (unfinished thinking stays thinking)."""
        held, self._buf = self._buf, ""
        if self._state == "think":
            return held, ""
        if self._state == "gap":
            return "", ""
        return "", held


def _as_call(obj: Any, tool_names: set[str] | None) -> ToolCall | None:
    """A ToolCall from a decoded JSON object, or None when it does not look like one.

    `tool_names` None accepts any name (an explicit ``<tool_call>`` tag says it is a call);
    a set restricts the generic fallback to declared tools, so ordinary JSON answers stay text.
    """
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if isinstance(obj.get("function"), dict) and name is None:  # {"function": {"name", "arguments"}}
        return _as_call(obj["function"], tool_names)
    if not isinstance(name, str) or not name:
        return None
    if tool_names is not None and name not in tool_names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL)


def _generic_calls(text: str, tool_names: set[str]) -> list[ToolCall] | None:
    """Tool calls from an answer that is only JSON (bare or in a ```json fence), else None."""
    body = text.strip()
    m = _FENCE.match(body)
    if m:
        body = m.group(1).strip()
    if not body or body[0] not in "[{":
        return None
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    calls = [_as_call(item, tool_names) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


class ToolCallParser:
    """Finds tool calls in answer text (after reasoning has been split off).

    Hermes tags are recognised anywhere; text between and around calls stays content
    (whitespace-only text once a call was made is dropped). With declared `tool_names`:
    an answer that *starts* with ``{`` or ``[`` is held back to the end and then tried as a
    generic JSON call; a ```json (or bare ```) fenced block anywhere — small models like to
    write "Sure:" and then the call in a fence — is held until its closing fence and tried as
    one. Either way, what is not a call to a declared tool is released as content unchanged.
    Other fences (```python) stream through as they come.
    """

    def __init__(self, tool_names: Iterable[str] | None = None) -> None:
        self.tool_names = set(tool_names or ())
        self._buf = ""
        self._in_call = False
        self._started = False  # any non-whitespace seen yet
        self._generic = False  # holding the whole answer for the generic fallback
        self._fence: str | None = None  # inside a fenced block: "json" (held) or "other" (streamed)
        self._fence_open = ""  # the held block's opening line
        self._ws = ""  # whitespace after a call, held until we know whether text follows
        self.calls: list[ToolCall] = []

    def push(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buf += text
        if not self._started:
            stripped = self._buf.lstrip()
            if not stripped:
                return out
            self._started = True
            if self.tool_names and stripped[0] in "[{":
                self._generic = True
        if self._generic:
            return out
        while self._buf:
            if self._in_call:
                i = self._buf.find(TOOL_CLOSE)
                if i == -1:
                    break
                self._finish_call(self._buf[:i], out)
                self._buf = self._buf[i + len(TOOL_CLOSE) :]
                self._in_call = False
                continue
            if self._fence is not None:
                if not self._in_fence(out):
                    break
                continue
            i = self._buf.find(TOOL_OPEN)
            f = self._buf.find(FENCE) if self.tool_names else -1
            if f != -1 and (i == -1 or f < i):
                if not self._open_fence(f, out):
                    break
                continue
            if i != -1:
                self._emit_text(self._buf[:i], out)
                self._buf = self._buf[i + len(TOOL_OPEN) :]
                self._in_call = True
                continue
            keep = max(_partial_suffix(self._buf, TOOL_OPEN), _partial_suffix(self._buf, FENCE) if self.tool_names else 0)
            self._emit_text(self._buf[: len(self._buf) - keep], out)
            self._buf = self._buf[len(self._buf) - keep :]
            break
        return out

    def _open_fence(self, at: int, out: ParsedDelta) -> bool:
        """A fence starts at `at`: once its opening line is complete, decide whether to hold it.
        False when that line is not complete yet (wait for more text)."""
        self._emit_text(self._buf[:at], out)
        self._buf = self._buf[at:]
        eol = self._buf.find("\n")
        if eol == -1:
            return False
        line, self._buf = self._buf[: eol + 1], self._buf[eol + 1 :]
        if line[len(FENCE) :].strip().lower() in ("", "json"):
            self._fence, self._fence_open = "json", line
        else:
            self._fence = "other"
            out.content += line
        return True

    def _in_fence(self, out: ParsedDelta) -> bool:
        """Inside a fence: at its close, a held block becomes calls or content. False: wait."""
        i = self._buf.find(FENCE)
        if i == -1:
            if self._fence == "other":  # stream code through, keeping a possible closing fence
                keep = _partial_suffix(self._buf, FENCE)
                out.content += self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep :]
            return False
        block, self._buf = self._buf[: i + len(FENCE)], self._buf[i + len(FENCE) :]
        if self._fence == "other":
            out.content += block
        else:
            self._calls_or_text(self._fence_open + block, out)
        self._fence = None
        return True

    def _calls_or_text(self, text: str, out: ParsedDelta) -> None:
        """`text` as tool calls to declared tools if it holds any, else as content."""
        calls = _generic_calls(text, self.tool_names)
        if calls:
            self.calls.extend(calls)
            out.tool_calls.extend(calls)
        else:
            out.content += text

    def flush(self) -> ParsedDelta:
        out = ParsedDelta()
        held, self._buf = self._buf, ""
        if self._generic:
            self._calls_or_text(held, out)
            return out
        if self._fence == "json":  # ended inside a held fence (max_tokens): a complete call still counts
            self._fence = None
            self._calls_or_text(self._fence_open + held + ("" if held.rstrip().endswith(FENCE) else "\n" + FENCE), out)
            if not out.tool_calls:
                out.content = self._fence_open + held
            return out
        if self._fence == "other":
            self._fence = None
            out.content += held
            return out
        if self._in_call:
            # The answer ended inside a call (no closing tag, e.g. max_tokens or a stop string):
            # keep it if its JSON is complete, else hand the raw text back.
            self._in_call = False
            self._finish_call(held, out, closed=False)
            return out
        self._emit_text(held, out)
        return out

    def _emit_text(self, text: str, out: ParsedDelta) -> None:
        # Once a call was made, whitespace is held until real text follows (then it is kept)
        # or the answer ends (then it is dropped), so every split of the stream agrees.
        if self.calls:
            text, self._ws = self._ws + text, ""
            if not text.strip():
                self._ws = text
                return
        out.content += text

    def _finish_call(self, body: str, out: ParsedDelta, closed: bool = True) -> None:
        """Parse one call's JSON; if it is not a call, its raw text (tags included) is content."""
        try:
            call = _as_call(json.loads(body.strip()), None)
        except json.JSONDecodeError:
            call = None
        if call is None:
            out.content += TOOL_OPEN + body + (TOOL_CLOSE if closed else "")
            return
        self.calls.append(call)
        out.tool_calls.append(call)


class ChatOutputParser:
    """Reasoning split first, then tool calls in the answer part; `push` per delta, `flush` once."""

    def __init__(self, tool_names: Iterable[str] | None = None, parse_tools: bool = False, starts_in_reasoning: bool = False) -> None:
        self.reasoning = ReasoningParser(starts_in_reasoning)
        self.tools = ToolCallParser(tool_names) if parse_tools else None

    def push(self, text: str) -> ParsedDelta:
        reasoning, content = self.reasoning.push(text)
        return self._route(reasoning, content, final=False)

    def flush(self) -> ParsedDelta:
        reasoning, content = self.reasoning.flush()
        return self._route(reasoning, content, final=True)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self.tools.calls if self.tools else []

    def _route(self, reasoning: str, content: str, final: bool) -> ParsedDelta:
        out = ParsedDelta(reasoning=reasoning)
        if self.tools is None:
            out.content = content
            return out
        if content:
            out.extend(self.tools.push(content))
        if final:
            out.extend(self.tools.flush())
        return out


def parse_chat_output(text: str, tool_names: Iterable[str] | None = None, parse_tools: bool = False, starts_in_reasoning: bool = False) -> ParsedDelta:
    """The whole answer at once: the same machine as streaming, so both paths agree."""
    parser = ChatOutputParser(tool_names, parse_tools, starts_in_reasoning)
    out = parser.push(text)
    out.extend(parser.flush())
    return out
