"""Reasoning and tool-call parsing: streamed in any split, the result equals the one-shot parse."""

from __future__ import annotations

import json
import random

import pytest

from tallow.chat.parsers import ChatOutputParser, ParsedDelta, parse_chat_output

TOOLS = ["get_weather", "set_light"]

CASES = [
    # (text, starts_in_reasoning, expected reasoning, content, [(name, args)])
    ("Hello there.", False, "", "Hello there.", []),
    ("<think>Let me see.\nOK</think>\n\nParis.", False, "Let me see.\nOK", "Paris.", []),
    ("I think.\n</think>\n\nAnswer", True, "I think.\n", "Answer", []),
    ("The tag <think> mid-answer is text.", False, "", "The tag <think> mid-answer is text.", []),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        False, "", "", [("get_weather", {"city": "Paris"})],
    ),
    (
        'Sure.\n<tool_call>\n{"name": "set_light", "arguments": {"on": true}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}\n</tool_call>',
        False, "", "Sure.\n", [("set_light", {"on": True}), ("get_weather", {"city": "Rome"})],
    ),
    ('<think>need weather</think><tool_call>{"name": "get_weather", "arguments": {}}</tool_call>', False, "need weather", "", [("get_weather", {})]),
    ("```json\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}\n```", False, "", "", [("get_weather", {"city": "Oslo"})]),
    ('{"name": "set_light", "arguments": {"room": "kitchen"}}', False, "", "", [("set_light", {"room": "kitchen"})]),
    # JSON that is not a declared tool stays an answer
    ('{"name": "unknown_tool", "arguments": {}}', False, "", '{"name": "unknown_tool", "arguments": {}}', []),
    ('{"answer": 42}', False, "", '{"answer": 42}', []),
    # unparseable call: the raw text is returned as content, never lost
    ("<tool_call>\n{not json}\n</tool_call>", False, "", "<tool_call>\n{not json}\n</tool_call>", []),
    ('<tool_call>\n{"name": "get_weather", "argu', False, "", '<tool_call>\n{"name": "get_weather", "argu', []),
    # unclosed but complete call (stopped by max_tokens right after the JSON)
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n', False, "", "", [("get_weather", {"city": "Oslo"})]),
    ("a < b and <tool", False, "", "a < b and <tool", []),
    # fenced calls after prose (what small models write unconstrained), Llama-style `parameters` too
    ('Sure, here is the call:\n```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', False, "", "Sure, here is the call:\n", [("get_weather", {"city": "Oslo"})]),
    ('I will do that.\n```\n{"name": "set_light", "parameters": {"on": false}}\n```\nDone.', False, "", "I will do that.\n\nDone.", [("set_light", {"on": False})]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```\nLet me know.', False, "", "\nLet me know.", [("get_weather", {"city": "Oslo"})]),
    ('Calling:\n```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n', False, "", "Calling:\n", [("get_weather", {"city": "Oslo"})]),  # cut before the closing fence
    ('[{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "set_light", "arguments": {}}]', False, "", "", [("get_weather", {"city": "A"}), ("set_light", {})]),
    # fences that are not calls to declared tools stay content, unchanged
    ("Code:\n```python\nprint('```')\n```\nDone.", False, "", "Code:\n```python\nprint('```')\n```\nDone.", []),
    ('Example:\n```json\n{"a": 1}\n```', False, "", 'Example:\n```json\n{"a": 1}\n```', []),
    ('Try:\n```json\n{"name": "launch_rocket", "arguments": {}}\n```', False, "", 'Try:\n```json\n{"name": "launch_rocket", "arguments": {}}\n```', []),
    ("Unclosed:\n```json\n{\"a\": ", False, "", "Unclosed:\n```json\n{\"a\": ", []),
    ("ticks ` and `` inline", False, "", "ticks ` and `` inline", []),
    # several calls in every syntax the grammar writes
    ('{"name": "get_weather", "arguments": {"city": "A"}}\n{"name": "get_weather", "arguments": {"city": "B"}}', False, "", "", [("get_weather", {"city": "A"}), ("get_weather", {"city": "B"})]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "A"}}\n```\n```json\n{"name": "set_light", "arguments": {"on": true}}\n```', False, "", "", [("get_weather", {"city": "A"}), ("set_light", {"on": True})]),
    ('```json\n[{"name": "get_weather", "arguments": {"city": "A"}},{"name": "set_light", "arguments": {}}]\n```', False, "", "", [("get_weather", {"city": "A"}), ("set_light", {})]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "A"}}\n{"name": "get_weather", "arguments": {"city": "B"}}\n```', False, "", "", [("get_weather", {"city": "A"}), ("get_weather", {"city": "B"})]),
    # arguments holding braces and quotes inside strings, and nested objects
    ('{"name": "set_light", "arguments": {"room": "a}\\"{[", "rgb": {"r": [1, {"g": 2}]}}}', False, "", "", [("set_light", {"room": 'a}"{[', "rgb": {"r": [1, {"g": 2}]}})]),
    # a JSON answer (a response format beside tools) is content, even when its first key is "name"
    ('{"name": "Al", "age": 3}', False, "", '{"name": "Al", "age": 3}', []),
    ('[1, 2]', False, "", "[1, 2]", []),
    ('  {"city": "Oslo"}', False, "", '  {"city": "Oslo"}', []),
    # a streamed call cut by max_tokens stays a call, its arguments as far as they were written
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os', False, "", "", [("get_weather", None)]),
    ("<tool_call>\n</tool_call>", False, "", "<tool_call>\n</tool_call>", []),
]


def _args(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None  # a call cut short


def _check(result: ParsedDelta, reasoning: str, content: str, calls: list) -> None:
    assert result.reasoning == reasoning
    assert result.content == content
    assert [(c.name, _args(c.arguments)) for c in result.tool_calls] == calls
    assert all(c.id.startswith("call_") for c in result.tool_calls)
    assert len({c.id for c in result.tool_calls}) == len(result.tool_calls)
    # the streamed pieces add up to the calls: id and name first, then the arguments as written
    streamed: dict[int, list] = {}
    for d in result.call_deltas:
        if d.id is not None:
            assert d.index == len(streamed) and d.name
            streamed[d.index] = [d.id, d.name, d.arguments]
        else:
            streamed[d.index][2] += d.arguments
    assert [tuple(v) for v in streamed.values()] == [(c.id, c.name, c.arguments) for c in result.tool_calls]


@pytest.mark.parametrize("text,starts,reasoning,content,calls", CASES)
def test_one_shot(text, starts, reasoning, content, calls):
    _check(parse_chat_output(text, TOOLS, parse_tools=True, starts_in_reasoning=starts), reasoning, content, calls)


@pytest.mark.parametrize("text,starts,reasoning,content,calls", CASES)
def test_streamed_in_random_pieces_gives_the_same_result(text, starts, reasoning, content, calls):
    rng = random.Random(len(text))
    for _ in range(20):
        parser = ChatOutputParser(TOOLS, parse_tools=True, starts_in_reasoning=starts)
        total = ParsedDelta()
        i = 0
        while i < len(text):
            n = rng.randint(1, 6)
            delta = parser.push(text[i : i + n])
            # a marker is never released half-printed
            assert "<tool_c" not in delta.content or "<tool_call>" in text
            assert "<thi" not in delta.content or "The tag" in text
            total.extend(delta)
            i += n
        total.extend(parser.flush())
        _check(total, reasoning, content, calls)


def test_without_tools_tool_syntax_is_plain_text():
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    out = parse_chat_output(text, None, parse_tools=False)
    assert out.content == text and not out.tool_calls


def test_arguments_stream_as_they_are_written():
    """A call longer than a few tokens: its arguments reach the client in many deltas, the id
    and name before any of them."""
    text = '{"name": "set_light", "arguments": {"room": "kitchen", "brightness": 80, "note": "warm white please"}}'
    parser = ChatOutputParser(TOOLS, parse_tools=True)
    pieces = []
    for i in range(0, len(text), 4):
        pieces.append(parser.push(text[i : i + 4]))
    pieces.append(parser.flush())
    deltas = [d for p in pieces for d in p.call_deltas]
    assert deltas[0].id and deltas[0].name == "set_light" and deltas[0].arguments == ""
    arg_pushes = [p for p in pieces if any(d.id is None for d in p.call_deltas)]
    assert len(arg_pushes) > 10
    assert "".join(d.arguments for d in deltas) == json.dumps(json.loads(text)["arguments"])
    assert not any(p.content for p in pieces)


# ----------------------------------------------------------------------------- Gemma 4
Q = '<|"|>'
GEMMA4_CASES = [
    # (text, starts_in_reasoning, reasoning, content, [(name, args)])
    ("Paris.", False, "", "Paris.", []),
    ("<|channel>thought\nThe capital.\n<channel|>Paris.", False, "The capital.\n", "Paris.", []),
    ("Paris.<|channel>thought\n<channel|>", False, "", "Paris.", []),  # the trailing empty channel
    ("Paris.<channel|>", False, "", "Paris.", []),  # a stray close
    ("<|channel><|channel>thought x<channel|>y", False, "x", "y", []),  # an empty channel first
    ("still thinking<channel|>done", True, "still thinking", "done", []),
    ("<|turn>model\nHi", False, "", "Hi", []),
    ("<|channel>thought\ncut by max_tokens", False, "cut by max_tokens", "", []),
    ("a <|chan", False, "", "a <|chan", []),  # a partial marker at the end is text
    (f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>", False, "", "", [("get_weather", {"city": "Paris"})]),
    (f"<|channel>thought\nNeed data.<channel|><|tool_call>call:get_weather{{city:{Q}Zürich \"q\" {{x}}{Q},days:3,"
     f"detail:{{metric:true,hours:[1, -2.5e1, {Q}n{Q}],note:null}}}}<tool_call|>", False, "Need data.", "",
     [("get_weather", {"city": 'Zürich "q" {x}', "days": 3, "detail": {"metric": True, "hours": [1, -25.0, "n"], "note": None}})]),
    (f"Sure.<|tool_call>call:set_light{{on:true}}<tool_call|><|tool_call>call:get_weather{{ city: {Q}A{Q} , n: [ ] }}<tool_call|>",
     False, "", "Sure.", [("set_light", {"on": True}), ("get_weather", {"city": "A", "n": []})]),
    ("<|tool_call>call:set_light{}<tool_call|>", False, "", "", [("set_light", {})]),
    ("<|tool_call>call:any_name{k:1}<tool_call|>", False, "", "", [("any_name", {"k": 1})]),  # the tag says it is a call
    # not a call: the text is kept
    ("<|tool_call>oops", False, "", "<|tool_call>oops", []),
    ("<|tool_call>call:{a:1}<tool_call|>", False, "", "<|tool_call>call:{a:1}<tool_call|>", []),
    ("<|tool_call>call:bad name{a:1}", False, "", "<|tool_call>call:bad name{a:1}", []),
    # arguments that leave the syntax end the call there; the rest is content
    ("<|tool_call>call:set_light{on:maybe}<tool_call|>", False, "", "maybe}<tool_call|>", [("set_light", None)]),
    # cut by max_tokens inside the arguments: still a call, its arguments as far as written
    (f"<|tool_call>call:get_weather{{city:{Q}Pa", False, "", "", [("get_weather", None)]),
    (f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}", False, "", "", [("get_weather", {"city": "Paris"})]),
]


def _gemma4_parser(starts: bool) -> ChatOutputParser:
    return ChatOutputParser(TOOLS, parse_tools=True, starts_in_reasoning=starts, syntax="gemma4")


@pytest.mark.parametrize("text,starts,reasoning,content,calls", GEMMA4_CASES)
def test_gemma4_one_shot(text, starts, reasoning, content, calls):
    _check(parse_chat_output(text, TOOLS, parse_tools=True, starts_in_reasoning=starts, syntax="gemma4"), reasoning, content, calls)


@pytest.mark.parametrize("text,starts,reasoning,content,calls", GEMMA4_CASES)
def test_gemma4_streamed_in_any_split(text, starts, reasoning, content, calls):
    rng = random.Random(len(text))
    for k in range(30):
        parser = _gemma4_parser(starts)
        total = ParsedDelta()
        i = 0
        while i < len(text):
            n = 1 if k == 0 else rng.randint(1, 7)  # one character at a time once, then random pieces
            delta = parser.push(text[i : i + n])
            assert "<|tool_c" not in delta.content or "<|tool_call>" in content
            assert "<|chan" not in delta.content or "<|chan" in content
            total.extend(delta)
            i += n
        total.extend(parser.flush())
        _check(total, reasoning, content, calls)


def test_gemma4_arguments_are_llama_cpp_json_and_stream():
    """Compact JSON as llama.cpp's gemma4_to_json writes it, streamed in many pieces."""
    text = f"<|tool_call>call:set_light{{room:{Q}kitchen, by the window{Q},brightness:80,rgb:[255,200,150]}}<tool_call|>"
    parser = _gemma4_parser(False)
    pieces = [parser.push(text[i : i + 3]) for i in range(0, len(text), 3)] + [parser.flush()]
    deltas = [d for p in pieces for d in p.call_deltas]
    assert deltas[0].id and deltas[0].name == "set_light" and deltas[0].arguments == ""
    assert "".join(d.arguments for d in deltas) == '{"room":"kitchen, by the window","brightness":80,"rgb":[255,200,150]}'
    assert sum(1 for p in pieces if any(d.id is None for d in p.call_deltas)) > 10
    assert not any(p.content for p in pieces)


def test_gemma4_without_tools_calls_are_text_but_thoughts_split():
    text = "<|channel>thought\nhm<channel|><|tool_call>call:f{}<tool_call|>"
    out = parse_chat_output(text, None, parse_tools=False, syntax="gemma4")
    assert (out.reasoning, out.content, out.tool_calls) == ("hm", "<|tool_call>call:f{}<tool_call|>", [])


def test_syntax_for_template():
    from tallow.chat.parsers import syntax_for_template

    assert syntax_for_template("{{- '<|tool_call>call:' + function['name'] + '{' -}}") == "gemma4"
    assert syntax_for_template("<tool_call>{{ tool_call | tojson }}</tool_call>") == "default"
