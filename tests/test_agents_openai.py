"""What agent harnesses rely on, through the official `openai` SDK against a live server on
smollm2-135m: `parse()`, strict tools, streaming with usage, a multi-turn tool loop, streamed
tool-call arguments, honest counters, special tokens in logprobs and text, /apply-template.

Each test asserts what tallow controls — calls that parse and validate, schemas honoured,
streams well-formed to `[DONE]`, counters that count what happened — never what the small
model chooses to say.
"""

from __future__ import annotations

import json
import os
import re
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")

from server_utils import serve_model, streamed_tool_calls  # noqa: E402

MODEL = os.environ.get("TALLOW_AGENT_MODEL", "smollm2-135m")  # the hand-run: qwen2.5-coder-1.5b-instruct
NOTE = {
    "type": "function",
    "function": {
        "name": "save_note",
        "description": "Save a note with a title and a body.",
        "parameters": {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40}, "body": {"type": "string", "minLength": 30, "maxLength": 120}},
                       "required": ["title", "body"], "additionalProperties": False},
    },
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city.", "strict": True,
                 "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"], "additionalProperties": False}},
}


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)
    population: int


@pytest.fixture(scope="module")
def live():
    with serve_model(MODEL, ctx=1024, timeout=float(os.environ.get("TALLOW_AGENT_TIMEOUT", "300"))) as pair:  # room for the 1.5B model on a busy machine
        yield pair


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def _read_sse(url: str, body: dict) -> list[dict]:
    """Every event of a stream, read to `data: [DONE]` (asserted), as JSON objects."""
    events, done = [], False
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            assert not done, "data after [DONE]"
            if line == "data: [DONE]":
                done = True
                continue
            events.append(json.loads(line[6:]))
    assert done
    return events


def test_parse_returns_an_instance_of_the_model(live):
    _, client = live
    r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Describe Paris as a city record."}], response_format=City, max_tokens=60, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)


def test_strict_function_tool_parses_into_its_model(live):
    _, client = live

    class GetWeather(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=30)

    tool = openai.pydantic_function_tool(GetWeather, name="get_weather")
    assert tool["function"]["strict"] is True
    r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Oslo?"}], tools=[tool], tool_choice="required", max_tokens=40, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls[:1]
    assert call.function.name == "get_weather" and isinstance(call.function.parsed_arguments, GetWeather)


def test_streaming_with_usage_is_well_formed(live):
    server, client = live
    events = _read_sse(server.url, {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    ids = {e["id"] for e in events}
    assert len(ids) == 1 and all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [e["choices"][0]["finish_reason"] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finishes) == 1 and finishes[0] in ("stop", "length")
    assert all(e["usage"] is None for e in events[:-1])
    last = events[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + last["usage"]["completion_tokens"]
    # the SDK reads the same stream into the same shape
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == last["usage"]["completion_tokens"]


def test_streamed_arguments_arrive_in_pieces_and_validate(live):
    _, client = live
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Save a note about buying milk, eggs and bread tomorrow morning."}],
                                                 tools=[NOTE], tool_choice="required", parallel_tool_calls=False, max_tokens=120, temperature=0, stream=True))
    calls = streamed_tool_calls(chunks)
    assert len(calls) == 1 and calls[0]["name"] == "save_note" and calls[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(calls[0]["arguments"]), NOTE["function"]["parameters"])
    assert calls[0]["pieces"] > 3  # a body of 30+ characters is many tokens: it streamed as written
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_a_multi_turn_tool_loop(live):
    """Call, answer the call, go on: every turn is accepted and every call validates."""
    server, client = live
    messages = [{"role": "user", "content": "What is the weather in Rome?"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="required", max_tokens=40, temperature=0)
    call = r.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "temp_c": 24}'}]
    # the tool's answer is in the prompt of the next turn
    prompt = httpx.post(server.url + "/apply-template", json={"messages": messages, "tools": [WEATHER]}).json()["prompt"]
    assert '"temp_c": 24' in prompt
    r2 = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=12, temperature=0)
    choice = r2.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    for c in choice.message.tool_calls or []:
        jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])
    if choice.finish_reason != "tool_calls":
        assert choice.message.content is not None


def test_response_format_beside_tools_is_a_call_or_the_format(live):
    _, client = live
    schema = City.model_json_schema()
    for question in ("What is the weather in Rome?", "Describe Rome as a city record."):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}], tools=[WEATHER], max_tokens=40, temperature=0,
                                           response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
        choice = r.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for c in choice.message.tool_calls:
                assert c.function.name == "get_weather"
                jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])
        else:
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.message.content), schema)


def test_cancelled_counts_only_clients_that_went_away(live):
    server, _ = live
    before_cancelled = _metric(server.url, "tallow_requests_cancelled_total")
    before_total = _metric(server.url, "tallow_requests_total")
    for i in range(6):
        _read_sse(server.url, {"model": MODEL, "messages": [{"role": "user", "content": f"Count to {i + 2}."}], "max_tokens": 4, "temperature": 0, "stream": True})
    assert _metric(server.url, "tallow_requests_total") == before_total + 6
    assert _metric(server.url, "tallow_requests_cancelled_total") == before_cancelled
    decode_speed = _metric(server.url, "tallow_decode_tokens_per_second")
    assert decode_speed > 0
    # a client that leaves mid-stream is counted once
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write a long story about the sea."}], "max_tokens": 300, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for n, line in enumerate(r.iter_lines()):
            if n >= 6:
                break
    t0 = time.time()
    while server.worker.running is not None and time.time() - t0 < 30:
        time.sleep(0.02)
    assert _metric(server.url, "tallow_requests_cancelled_total") == before_cancelled + 1
    # a request with nothing to decode (one token) leaves the speed gauge at its last real value
    httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=60)
    assert _metric(server.url, "tallow_decode_tokens_per_second") > 0


def test_special_tokens_show_in_logprobs_and_on_request_in_text(live):
    server, _ = live
    # A grammar makes the answer hold a special token, whatever the model would say.
    body = {"prompt": "Say hi:", "max_tokens": 5, "temperature": 0, "logprobs": 2, "grammar": 'start: "Hi" <|im_start|> "!"'}
    plain = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    kept = httpx.post(server.url + "/v1/completions", json={**body, "skip_special_tokens": False}, timeout=60).json()["choices"][0]
    assert plain["text"] == "Hi!" and kept["text"] == "Hi<|im_start|>!"
    assert plain["logprobs"]["tokens"] == ["Hi", "<|im_start|>", "!"] == kept["logprobs"]["tokens"]
    assert kept["logprobs"]["text_offset"] == [0, 2, 14] and plain["logprobs"]["text_offset"] == [0, 2, 2]
    r = httpx.post(server.url + "/v1/completions", json={**body, "skip_special_tokens": "no"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "skip_special_tokens"


def test_apply_template_renders_without_generating(live):
    server, _ = live
    llm = server.worker.llm
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r = httpx.post(server.url + "/apply-template", json={"messages": messages})
    assert r.status_code == 200
    assert r.json() == {"prompt": llm.template.render(messages, add_generation_prompt=True)}
    assert r.json()["prompt"].endswith("<|im_start|>assistant\n") and "Hi there" in r.json()["prompt"]
    bad = httpx.post(server.url + "/apply-template", json={"messages": [{"role": "wizard", "content": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages[0].role"
