"""Constrained answers through a live server with the openai client (smollm2-135m: its template has
no tool syntax of its own, so tool calls are bare JSON objects)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import httpx
import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from server_utils import serve_model, streamed_tool_calls  # noqa: E402

MODEL = "smollm2-135m"
LIGHT = {
    "type": "function",
    "function": {
        "name": "set_light",
        "description": "Switch a light and set its brightness.",
        "parameters": {
            "$defs": {"level": {"type": "integer", "minimum": 0, "maximum": 100}},
            "type": "object",
            "properties": {"room": {"enum": ["kitchen", "bedroom", "hall"]}, "on": {"type": "boolean"}, "brightness": {"$ref": "#/$defs/level"}},
            "required": ["room", "on"],
        },
    },
}
TIMER = {"type": "function", "function": {"name": "start_timer", "parameters": {"type": "object", "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 600}}, "required": ["minutes"]}}}
ASK = [{"role": "user", "content": "Turn on the kitchen light."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}, "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2}}, "required": ["name", "age", "pets"]}


@pytest.fixture(scope="module")
def live():
    with serve_model(MODEL, ctx=512) as pair:
        yield pair


def _schemas(tools):
    return {t["function"]["name"]: t["function"]["parameters"] for t in tools}


def test_json_schema_answer_validates(live):
    _, client = live
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}], response_format=rf, max_tokens=40, temperature=0)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_object_streams_one_object(live):
    _, client = live
    chunks = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A JSON object with a colour, please."}], response_format={"type": "json_object"},
                                            max_tokens=40, temperature=0.8, seed=3, stream=True)
    pieces = [(c.choices[0].delta.content or "", c.choices[0].finish_reason) for c in chunks if c.choices]
    text = "".join(p for p, _ in pieces)
    assert text.lstrip().startswith("{")
    if pieces[-1][1] == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice_gives_valid_calls(live, stream):
    _, client = live
    kw = dict(model=MODEL, messages=ASK, tools=[LIGHT, TIMER], tool_choice="required", max_tokens=60, temperature=0)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        calls = [SimpleNamespace(**c) for c in streamed_tool_calls(chunks)]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        calls, finish = [tc.function for tc in choice.message.tool_calls or []], [choice.finish_reason]
    assert calls and finish == ["tool_calls"]
    schemas = _schemas([LIGHT, TIMER])
    for fn in calls:
        jsonschema.validate(json.loads(fn.arguments), schemas[fn.name])


def test_named_tool_choice_without_parallel_calls_gives_one_call_to_it(live):
    _, client = live
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello!"}], tools=[LIGHT, TIMER],
                                       tool_choice={"type": "function", "function": {"name": "start_timer"}}, parallel_tool_calls=False, max_tokens=40, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "start_timer"
    jsonschema.validate(json.loads(call.function.arguments), TIMER["function"]["parameters"])


def test_raw_grammar_field_gbnf_and_lark(live):
    server, client = live
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is water wet?"}], max_tokens=8, temperature=0,
                                       extra_body={"grammar": 'root ::= ("yes" | "no") "."'})
    assert r.choices[0].message.content in ("yes.", "no.")
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Count: ", "max_tokens": 12, "temperature": 0, "grammar": 'start: NUM (", " NUM)*\nNUM: /[0-9]{1,2}/'}, timeout=120)
    body = r.json()
    text = body["choices"][0]["text"]
    # The model would count past max_tokens; budget-aware closing ends the list in time.
    assert r.status_code == 200 and re.fullmatch(r"[0-9]{1,2}(, [0-9]{1,2})*", text), text
    assert body["choices"][0]["finish_reason"] == "stop" and body["timings"]["grammar_steered_n"] > 0


def test_unsupported_schema_is_a_400_naming_the_feature(live):
    _, client = live
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, response_format=rf, max_tokens=5)
    body = info.value.body
    assert "uniqueItems" in body["message"] and body["param"] == "response_format.json_schema.schema"
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[bad_tool], tool_choice="required", max_tokens=5)
    assert '"not"' in info.value.body["message"] and info.value.body["param"] == "tools[0].function.parameters"
