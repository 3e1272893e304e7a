"""Gemma 4's answer, split into reasoning, content and tool calls — streaming, any token split.

What the model writes (llama.cpp's parser in common/parsers/gemma4.cpp reads the same):

* thinking: ``<|channel>thought`` + whitespace + the thought + ``<channel|>``, anywhere in the
  answer (it may also close an answer with an empty ``<|channel>thought\\n<channel|>``); a
  ``<|channel>`` that does not open ``thought`` and a stray ``<channel|>`` are dropped;
* tool calls: ``<|tool_call>call:NAME{key:value,…}<tool_call|>``, one after another; values
  are ``<|"|>text<|"|>`` strings (no escapes inside), numbers, ``true``/``false``/``null``,
  ``{…}`` objects with bare keys and ``[…]`` arrays, with optional spaces after ``{``, ``[``,
  ``,`` and ``:``. Arguments become compact JSON (``{"city":"Paris","days":3}``) as
  llama.cpp's gemma4_to_json writes them, and stream as they are read: a call's id and name
  once ``call:NAME{`` is complete, then its arguments piece by piece.

Markers are held back while they may still be forming (``<|tool`` could become
``<|tool_call>``), so no half-marker reaches a client and every split of the text gives the
same result. A ``<|tool_call>`` not followed by ``call:NAME{`` is content; arguments that stop
following the syntax end the call there (like an answer cut by max_tokens) and the rest is
content.
"""

from __future__ import annotations

import json

from .parsers import ParsedDelta, ToolCall, ToolCallDelta, ToolCallParser, _partial_suffix

CHANNEL_OPEN = "<|channel>"
CHANNEL_CLOSE = "<channel|>"
THOUGHT = "thought"
CALL_OPEN = "<|tool_call>"
CALL_CLOSE = "<tool_call|>"
CALL_PREFIX = "call:"
QUOTE = '<|"|>'
MODEL_TURN = "<|turn>model\n"
_SPACE = " \t\r\n"
_LITERAL_CHARS = set("+-.0123456789eEtrufalsn")


class Gemma4ReasoningParser:
    """Thought channels to reasoning, the rest to content (same interface as ReasoningParser)."""

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        # start: the answer may repeat "<|turn>model\n"; content; label: after "<|channel>";
        # space: after "<|channel>thought"; thought: inside the channel.
        self._state = "thought" if starts_in_reasoning else "start"
        self._buf = ""

    def push(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning = content = ""
        while self._buf:
            if self._state == "start":
                if MODEL_TURN.startswith(self._buf):
                    break  # perhaps the turn opener llama.cpp also accepts: wait
                if self._buf.startswith(MODEL_TURN):
                    self._buf = self._buf[len(MODEL_TURN):]
                self._state = "content"
            elif self._state == "content":
                i, j = self._buf.find(CHANNEL_OPEN), self._buf.find(CHANNEL_CLOSE)
                if i == -1 and j == -1:
                    keep = max(_partial_suffix(self._buf, CHANNEL_OPEN), _partial_suffix(self._buf, CHANNEL_CLOSE))
                    content += self._buf[: len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                if j == -1 or (i != -1 and i < j):
                    content += self._buf[:i]
                    self._buf = self._buf[i + len(CHANNEL_OPEN):]
                    self._state = "label"
                else:  # a stray "<channel|>": not text
                    content += self._buf[:j]
                    self._buf = self._buf[j + len(CHANNEL_CLOSE):]
            elif self._state == "label":
                if THOUGHT.startswith(self._buf):
                    break
                if self._buf.startswith(THOUGHT):
                    self._buf = self._buf[len(THOUGHT):]
                    self._state = "space"
                else:
                    self._state = "content"  # an empty channel: the marker alone is dropped
            elif self._state == "space":
                self._buf = self._buf.lstrip(_SPACE)
                if self._buf:
                    self._state = "thought"
            else:  # thought
                i = self._buf.find(CHANNEL_CLOSE)
                if i == -1:
                    keep = _partial_suffix(self._buf, CHANNEL_CLOSE)
                    reasoning += self._buf[: len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                reasoning += self._buf[:i]
                self._buf = self._buf[i + len(CHANNEL_CLOSE):]
                self._state = "content"
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        held, self._buf = self._buf, ""
        state, self._state = self._state, "start"
        if state == "thought":
            return held, ""  # unfinished thinking stays thinking
        if state in ("label", "space"):
            return "", ""
        return "", held  # "start"/"content": a partial marker at the very end is text


class ArgumentsError(ValueError):
    """The arguments stopped following Gemma 4's syntax; `rest` is the text from there on."""

    def __init__(self, message: str, rest: str) -> None:
        super().__init__(message)
        self.rest = rest
        self.json = ""


class Gemma4Arguments:
    """Gemma 4's argument syntax to JSON text, one character at a time (a pushdown machine).

    `feed(text)` returns the JSON that is certain so far; `done` is True once the outer object
    closed, and `rest` is then what followed it. Raises ArgumentsError on text outside the
    syntax.
    """

    def __init__(self) -> None:
        self.stack: list[str] = []  # "{" or "["
        self.state = "value"  # value | first_key | key | key_text | after | first_item | string | literal
        self.pending = ""  # a partial <|"|>, a key or a literal being read
        self.done = False
        self.rest = ""

    def feed(self, text: str) -> str:
        out: list[str] = []
        try:
            self._feed(text, out)
        except ArgumentsError as exc:
            exc.json = "".join(out)  # what was certain before the error, whatever the split
            raise
        return "".join(out)

    def _feed(self, text: str, out: list[str]) -> None:
        i = 0
        while i < len(text):
            if self.done:
                self.rest += text[i:]
                break
            c = text[i]
            state = self.state
            if state == "string":
                # Read up to the closing quote marker; hold back a partial one.
                chunk = self.pending + text[i:]
                end = chunk.find(QUOTE)
                if end == -1:
                    keep = _partial_suffix(chunk, QUOTE)
                    out.append(_escape(chunk[: len(chunk) - keep]))
                    self.pending = chunk[len(chunk) - keep:]
                    break
                out.append(_escape(chunk[:end]) + '"')
                i += end + len(QUOTE) - len(self.pending)
                self.pending = ""
                self.state = "after"
                continue
            if state == "quote":  # a value that starts with "<": must be <|"|>
                self.pending += c
                if self.pending == QUOTE:
                    self.pending, self.state = "", "string"
                    out.append('"')
                elif not QUOTE.startswith(self.pending):
                    raise ArgumentsError(f"unexpected {self.pending!r}", self.pending + text[i + 1:])
            elif state == "literal":
                if c in _LITERAL_CHARS:
                    self.pending += c
                else:
                    out.append(self._literal(text[i:]))
                    self.state = "after"
                    continue  # the delimiter is read in the "after" state
            elif state == "key_text":
                if c == ":":
                    out.append(json.dumps(self.pending, ensure_ascii=False) + ":")
                    self.pending, self.state = "", "value"
                elif c == "}":
                    raise ArgumentsError("a key without a value", text[i:])
                else:
                    self.pending += c
            elif c in _SPACE and state != "key_text":
                pass
            elif state in ("value", "first_item"):
                if state == "first_item" and c == "]":
                    self._close(out, "]")
                elif c == "{":
                    self.stack.append("{")
                    out.append("{")
                    self.state = "first_key"
                elif c == "[":
                    self.stack.append("[")
                    out.append("[")
                    self.state = "first_item"
                elif c == "<":
                    self.pending, self.state = "<", "quote"
                elif c in _LITERAL_CHARS:
                    self.pending, self.state = c, "literal"
                else:
                    raise ArgumentsError(f"unexpected {c!r} where a value belongs", text[i:])
            elif state in ("first_key", "key"):
                if state == "first_key" and c == "}":
                    self._close(out, "}")
                elif c in ":}":
                    raise ArgumentsError(f"unexpected {c!r} where a key belongs", text[i:])
                else:
                    self.pending, self.state = c, "key_text"
            elif state == "after":
                top = self.stack[-1]
                if c == ",":
                    out.append(",")
                    self.state = "key" if top == "{" else "value"
                elif c == ("}" if top == "{" else "]"):
                    self._close(out, c)
                else:
                    raise ArgumentsError(f"unexpected {c!r} after a value", text[i:])
            i += 1

    def _close(self, out: list[str], bracket: str) -> None:
        self.stack.pop()
        out.append(bracket)
        self.state = "after"
        if not self.stack:
            self.done = True

    def _literal(self, rest: str) -> str:
        text, self.pending = self.pending, ""
        if text in ("true", "false", "null"):
            return text
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ArgumentsError(f"{text!r} is not a number, true, false or null", text + rest)
        return text


def _escape(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1] if text else ""


class Gemma4ToolCallParser(ToolCallParser):
    """``<|tool_call>call:NAME{…}<tool_call|>`` calls in the content, streamed (the same
    interface and whitespace rules as ToolCallParser: text around calls stays content)."""

    def __init__(self, tool_names=None) -> None:
        super().__init__(tool_names)
        self._state = "text"  # text | head (after <|tool_call>) | args | tail (before <tool_call|>)
        self._head = ""
        self._args: Gemma4Arguments | None = None
        self._call: ToolCall | None = None
        self._index = 0

    def push(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buf += text
        while self._buf:
            if self._state == "text":
                i = self._buf.find(CALL_OPEN)
                if i == -1:
                    keep = _partial_suffix(self._buf, CALL_OPEN)
                    self._emit_text(self._buf[: len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep:]
                    break
                self._emit_text(self._buf[:i], out)
                self._buf = self._buf[i + len(CALL_OPEN):]
                self._state, self._head = "head", ""
            elif self._state == "head":
                self._read_head(out)
                if self._state == "head":
                    break
            elif self._state == "args":
                self._read_args(out)
                if self._state == "args":
                    break
            else:  # tail: optional spaces, then <tool_call|>
                stripped = self._buf.lstrip(_SPACE)
                if CALL_CLOSE.startswith(stripped):
                    break
                if stripped.startswith(CALL_CLOSE):
                    stripped = stripped[len(CALL_CLOSE):]
                self._buf = stripped
                self._state = "text"
        return out

    def _read_head(self, out: ParsedDelta) -> None:
        """`call:NAME{`: once complete the call opens; anything else makes it content."""
        brace = self._buf.find("{")
        head = self._head + (self._buf if brace == -1 else self._buf[:brace])
        name = head[len(CALL_PREFIX):]
        valid = (CALL_PREFIX.startswith(head) or head.startswith(CALL_PREFIX)) and not any(
            ch in _SPACE or ch in "<>{}:," for ch in name)
        if not valid or (brace != -1 and not name):
            self._emit_text(CALL_OPEN + head, out)
            self._buf = self._buf[len(head) - len(self._head):] if brace == -1 else self._buf[brace:]
            self._state = "text"
            return
        if brace == -1:
            self._head, self._buf = head, ""
            return
        self._buf = self._buf[brace:]
        self._call = ToolCall(name, "")
        self._index = self.n_started
        self.n_started += 1
        out.call_deltas.append(ToolCallDelta(self._index, "", self._call.id, name))
        self._args = Gemma4Arguments()
        self._state = "args"

    def _read_args(self, out: ParsedDelta) -> None:
        args = self._args
        text, self._buf = self._buf, ""
        try:
            piece = args.feed(text)
        except ArgumentsError as exc:
            # Not the syntax any more: the call ends where the syntax did; the rest is content.
            # Only malformed output gets here: the grammar rules it out whenever it constrains a call.
            if exc.json:
                self._call.arguments += exc.json
                out.add_arguments(self._index, exc.json)
            self._buf = exc.rest
            self._finish(out)
            self._state = "text"
            return
        if piece:
            self._call.arguments += piece
            out.add_arguments(self._index, piece)
        if args.done:
            self._buf = args.rest
            self._finish(out)
            self._state = "tail"

    def _finish(self, out: ParsedDelta) -> None:
        self.calls.append(self._call)
        out.tool_calls.append(self._call)
        self._call, self._args = None, None

    def flush(self) -> ParsedDelta:
        out = ParsedDelta()
        held, self._buf = self._buf, ""
        if self._state == "head":
            self._emit_text(CALL_OPEN + self._head + held, out)
        elif self._state == "args":
            self._finish(out)  # cut short (max_tokens): its id, name and arguments are out already
        elif self._state == "text":
            self._emit_text(held, out)
        self._state = "text"
        return out
