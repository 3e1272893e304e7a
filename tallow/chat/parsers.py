"""Split a model's chat output into reasoning, answer text and tool calls — streaming or not.

Models write their thinking and their tool calls as plain text with markers:

* reasoning: ``<think>…</think>`` at the start of the answer (Qwen3/DeepSeek style). A
  template may open the block itself (its generation prompt ends with ``<think>``), so the
  parser can start inside it (`starts_in_reasoning`).
* tool calls: Qwen/Hermes ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (several
  per turn), and for every model the forms the tool grammar (grammar/tools.py) also writes:
  an answer that opens with bare JSON objects one after another or a JSON array of them, and
  ```json fenced blocks holding the same, each object's ``name`` a declared tool and its
  ``arguments`` (Llama 3 says ``parameters``) an object.

The parsers are incremental because the server streams: each `push` returns what can be
shown *now*, and holds back text that may still turn into a marker (``<too`` could become
``<tool_call>``), so no half-marker ever reaches a client. A call streams too: once its
envelope (``{"name": "…", "arguments": {``) is read, its id and name go out, then its
arguments as they are written (`ParsedDelta.call_deltas`). The non-streaming result is the
same machine run over the whole text (`parse_chat_output`), so both paths always agree, and
the API (`LLM.chat_events`) and the server share it. A tool call whose JSON does not parse is
returned as content, never dropped (unless its arguments had already streamed: then it stays a
call, cut where the answer was cut).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import regex  # partial matching: is this prefix still the start of a call?

__all__ = [
    "ChatOutputParser",
    "ParsedDelta",
    "ReasoningParser",
    "ToolCall",
    "ToolCallDelta",
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
    """What one push released: thinking text, answer text, tool calls — `call_deltas` as they
    stream (what a streaming client sends), `tool_calls` once complete (what a whole answer holds)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    call_deltas: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls or self.call_deltas)

    def add_arguments(self, index: int, text: str) -> None:
        """More arguments of call `index`, merged into the previous piece when that is its too."""
        last = self.call_deltas[-1] if self.call_deltas else None
        if last is not None and last.index == index and last.id is None:
            last.arguments += text
        else:
            self.call_deltas.append(ToolCallDelta(index, text))

    def extend(self, other: ParsedDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)
        self.call_deltas.extend(other.call_deltas)


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


_SPACE = " \t\r\n"
# A call opening the way the grammar writes it (any spacing), up to its arguments' brace:
# from there its arguments stream as written.
_ENVELOPE = r'\s*\{\s*"name"\s*:\s*"(%s)"\s*,\s*"arguments"\s*:\s*\{'
# The first key of an object that may still be a call of another shape (Llama's
# "parameters", the arguments first, OpenAI's {"function": ...}): held whole, then tried.
_CALL_KEY = regex.compile(r'\s*\{\s*"(?:name|arguments|parameters|function)"\s*:')


@dataclass
class ToolCallDelta:
    """A piece of a streamed call in OpenAI's shape: a call's first piece carries its id and
    name, the next ones its `arguments` text as the model writes it."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def to_openai(self) -> dict[str, Any]:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class _JsonDepth:
    """Nesting depth of JSON text fed one character at a time (strings and escapes skipped)."""

    def __init__(self) -> None:
        self.depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, ch: str) -> None:
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1


class _CallRegion:
    """Calls written as JSON: after a ``<tool_call>`` tag, inside a ```json fence, or as the
    whole answer — objects one after another, or a JSON array of them.

    An object that opens in the call envelope sends its id and name at once and then streams
    its arguments; any other object is held whole and tried as a call (other shapes). Text
    that is not a call turns the region into content; if no call was made yet, everything
    the region held (its opener included) is released as content, so nothing is lost.
    `end` is the marker that closes the region (None: the answer's end)."""

    def __init__(self, parser: ToolCallParser, opener: str, end: str | None, any_name: bool) -> None:
        self.parser = parser
        self.opener = opener
        self.end = end
        self.any_name = any_name  # a tag says it is a call: any name; elsewhere only declared tools
        spelled = {json.dumps(n, ensure_ascii=False)[1:-1]: n for n in parser.tool_names}
        self.names = spelled
        names = r'(?:[^"\\]|\\.)+' if any_name else "|".join(regex.escape(s) for s in sorted(spelled, key=len, reverse=True)) or "(?!)"
        self.envelope = regex.compile(_ENVELOPE % names)
        self.state = "between"  # between objects | envelope | args | rest (after the arguments) | held | content
        self.raw = ""  # consumed since the region opened or since its last call
        self.obj = ""  # the object being read
        self.depth = _JsonDepth()
        self.array = False
        self.expect_object = False  # in an array, right after "[" or ","
        self.objects = 0
        self.calls = 0
        self.call: ToolCall | None = None
        self.index = 0

    def push(self, buf: str, out: ParsedDelta) -> tuple[str, bool]:
        """Consume what can be decided of `buf`; returns (what is left, whether the region ended)."""
        while buf:
            if self.state == "content":
                return self._content(buf, out)
            if self.state == "between":
                stripped = buf.lstrip(_SPACE)
                self.raw += buf[: len(buf) - len(stripped)]
                buf = stripped
                if not buf:
                    break
                if self.end is not None and buf.startswith(self.end):
                    if not self.calls:  # an empty region: all of it, the marker too, is content
                        self.parser._emit_text(self.opener + self.raw + self.end, out)
                    return buf[len(self.end) :], True
                if self.end is not None and self.end.startswith(buf):
                    return buf, False  # perhaps the closing marker: wait for more
                c = buf[0]
                if c == "{" and (self.expect_object or not self.array):
                    self.state, self.obj, self.depth = "envelope", "", _JsonDepth()
                    continue
                if c == "[" and not self.array and not self.objects:
                    self.array = self.expect_object = True
                elif c == "," and self.array and not self.expect_object:
                    self.expect_object = True
                elif c == "]" and self.array and not self.expect_object:
                    self.array = False
                else:
                    self._to_content(out)
                    continue
                self.raw += c
                buf = buf[1:]
                continue
            c, buf = buf[0], buf[1:]  # inside an object: one character at a time keeps the depth exact
            self.obj += c
            self.depth.feed(c)
            if self.state == "envelope":
                m = self.envelope.match(self.obj, partial=True)
                if m and not m.partial:
                    self._open_call(m.group(1))
                    out.call_deltas.append(ToolCallDelta(self.index, "", self.call.id, self.call.name))
                    out.add_arguments(self.index, "{")
                elif not m:
                    k = _CALL_KEY.match(self.obj, partial=True)
                    if k and not k.partial:
                        self.state = "held"
                    elif not k:  # not a call: this object and what follows are content
                        buf, self.obj = self.obj + buf, ""
                        self._to_content(out)
            elif self.state == "args":
                if self.depth.depth >= 2 or c == "}":
                    self.call.arguments += c
                    out.add_arguments(self.index, c)
                if self.depth.depth == 1:
                    self.state = "rest"
            elif self.state == "rest":
                if self.depth.depth == 0:
                    self._finish_call(out)
            if self.state == "held" and self.depth.depth == 0:
                self._end_held(out)
        return "", False

    def _open_call(self, spelled: str) -> None:
        name = json.loads('"' + spelled + '"') if self.any_name else self.names[spelled]
        self.call = ToolCall(name, "{")
        self.index = self.parser.n_started
        self.parser.n_started += 1
        self.state = "args"

    def _finish_call(self, out: ParsedDelta) -> None:
        self.parser.calls.append(self.call)
        out.tool_calls.append(self.call)
        self.call, self.obj, self.raw = None, "", ""
        self.calls += 1
        self.objects += 1
        self.expect_object = False
        self.state = "between"

    def _end_held(self, out: ParsedDelta) -> None:
        """A whole object that did not open like a call: a call if it decodes as one, else content."""
        try:
            call = _as_call(json.loads(self.obj), None if self.any_name else self.parser.tool_names)
        except json.JSONDecodeError:
            call = None
        if call is None:
            self.raw, self.obj = self.raw + self.obj, ""
            self._to_content(out)
            return
        self.call, self.index = call, self.parser.n_started
        self.parser.n_started += 1
        out.call_deltas.append(ToolCallDelta(self.index, call.arguments, call.id, call.name))
        self._finish_call(out)

    def _to_content(self, out: ParsedDelta) -> None:
        """Not (more) calls: what was held becomes content, and the rest streams as content."""
        self.state = "content"
        self.parser._emit_text(("" if self.calls else self.opener) + self.raw, out)
        self.opener = self.raw = ""

    def _content(self, buf: str, out: ParsedDelta) -> tuple[str, bool]:
        if self.end is None:
            self.parser._emit_text(buf, out)
            return "", False
        i = buf.find(self.end)
        if i != -1:
            self.parser._emit_text(buf[: i + len(self.end)], out)
            return buf[i + len(self.end) :], True
        keep = _partial_suffix(buf, self.end)
        self.parser._emit_text(buf[: len(buf) - keep], out)
        return buf[len(buf) - keep :], False

    def flush(self, rest: str, out: ParsedDelta) -> None:
        """The answer ended inside the region (max_tokens, a stop string, or a bare answer);
        `rest` is what the last push left undecided."""
        if self.state == "content":
            self.parser._emit_text(rest, out)
        elif self.state in ("args", "rest"):
            # A streamed call cut short: its id, name and arguments are out already, so it stays
            # a call (finish_reason "length" tells the client its arguments were cut).
            self._finish_call(out)
        elif not self.calls:
            self.parser._emit_text(self.opener + self.raw + self.obj + rest, out)
        elif self.obj:  # an unfinished object after the calls; spacing and "]" between them are not text
            self.parser._emit_text(self.raw + self.obj + rest, out)


class ToolCallParser:
    """Finds tool calls in answer text (after reasoning has been split off), streaming them.

    Hermes tags are recognised anywhere; text between and around calls stays content
    (whitespace-only text once a call was made is dropped). With declared `tool_names`: an
    answer that *starts* with ``{`` or ``[`` is read as calls (bare objects one after another,
    or an array), and so is a ```json (or bare ```) fenced block anywhere — small models like
    to write "Sure:" and then the call in a fence. Calls in the envelope the grammar writes
    (``{"name": …, "arguments": {``) stream: `call_deltas` carry the id and name first, then
    the arguments as written. What is not a call to a declared tool is released as content
    unchanged (a JSON answer as soon as its first key shows it is no call). Other fences
    (```python) stream through as they come.
    """

    def __init__(self, tool_names: Iterable[str] | None = None) -> None:
        self.tool_names = set(tool_names or ())
        self._buf = ""
        self._started = False  # any non-whitespace seen yet
        self._region: _CallRegion | None = None
        self._other_fence = False  # inside a fence that is not JSON: streamed through
        self._ws = ""  # whitespace after a call, held until we know whether text follows
        self.calls: list[ToolCall] = []
        self.n_started = 0  # calls opened (their index in the stream)

    def push(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buf += text
        while self._buf:
            if self._region is not None:
                self._buf, ended = self._region.push(self._buf, out)
                if not ended:
                    break
                self._region = None
                continue
            if not self._started:
                stripped = self._buf.lstrip(_SPACE)
                if not stripped:
                    break
                self._started = True
                if self.tool_names and stripped[0] in "[{":
                    self._region = _CallRegion(self, self._buf[: len(self._buf) - len(stripped)], None, any_name=False)
                    self._buf = stripped
                    continue
            if self._other_fence:
                i = self._buf.find(FENCE)
                if i == -1:
                    keep = _partial_suffix(self._buf, FENCE)
                    self._emit_text(self._buf[: len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                self._emit_text(self._buf[: i + len(FENCE)], out)
                self._buf = self._buf[i + len(FENCE) :]
                self._other_fence = False
                continue
            i = self._buf.find(TOOL_OPEN)
            f = self._buf.find(FENCE) if self.tool_names else -1
            if f != -1 and (i == -1 or f < i):
                self._emit_text(self._buf[:f], out)
                self._buf = self._buf[f:]
                eol = self._buf.find("\n")
                if eol == -1:
                    break  # the fence's opening line is not complete yet
                line, self._buf = self._buf[: eol + 1], self._buf[eol + 1 :]
                if line[len(FENCE) :].strip().lower() in ("", "json"):
                    self._region = _CallRegion(self, line, FENCE, any_name=False)
                else:
                    self._emit_text(line, out)
                    self._other_fence = True
                continue
            if i != -1:
                self._emit_text(self._buf[:i], out)
                self._buf = self._buf[i + len(TOOL_OPEN) :]
                self._region = _CallRegion(self, TOOL_OPEN, TOOL_CLOSE, any_name=True)
                continue
            keep = max(_partial_suffix(self._buf, TOOL_OPEN), _partial_suffix(self._buf, FENCE) if self.tool_names else 0)
            self._emit_text(self._buf[: len(self._buf) - keep], out)
            self._buf = self._buf[len(self._buf) - keep :]
            break
        return out

    def flush(self) -> ParsedDelta:
        out = ParsedDelta()
        held, self._buf = self._buf, ""
        if self._region is not None:
            self._region.flush(held, out)
            self._region = None
        else:
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


class ChatOutputParser:
    """Reasoning split first, then tool calls in the answer part; `push` per delta, `flush` once.

    syntax: "default" (``<think>``, Hermes tags and JSON calls) or "gemma4" (thought channels
    and ``<|tool_call>call:NAME{…}<tool_call|>``, see gemma4_parse.py); `syntax_for_template`
    picks it from the chat template."""

    def __init__(self, tool_names: Iterable[str] | None = None, parse_tools: bool = False, starts_in_reasoning: bool = False,
                 syntax: str = "default") -> None:
        if syntax == "gemma4":
            from .gemma4_parse import Gemma4ReasoningParser, Gemma4ToolCallParser  # it builds on this module

            self.reasoning: Any = Gemma4ReasoningParser(starts_in_reasoning)
            self.tools: Any = Gemma4ToolCallParser(tool_names) if parse_tools else None
            return
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


def syntax_for_template(source: str) -> str:
    """The output syntax a chat template's model writes: "gemma4" or "default"."""
    return "gemma4" if "'<|tool_call>call:'" in source else "default"


def parse_chat_output(text: str, tool_names: Iterable[str] | None = None, parse_tools: bool = False, starts_in_reasoning: bool = False,
                      syntax: str = "default") -> ParsedDelta:
    """The whole answer at once: the same machine as streaming, so both paths agree."""
    parser = ChatOutputParser(tool_names, parse_tools, starts_in_reasoning, syntax)
    out = parser.push(text)
    out.extend(parser.flush())
    return out
