"""Tool calls through the server on qwen2.5-coder-1.5b (Hermes `<tool_call>` syntax), the
rendering of tool history, and the loading state (no model needed for that one)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

openai = pytest.importorskip("openai")

from server_utils import LiveServer, require_model, serve_model, streamed_tool_calls  # noqa: E402

QWEN = "qwen2.5-coder-1.5b-instruct"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def test_health_is_503_while_loading_then_200():
    release = threading.Event()

    class FakeLLM:  # stands in for a model: only /health and the queue are exercised
        pass

    def slow_loader() -> FakeLLM:
        release.wait(30)
        return FakeLLM()

    server = LiveServer(slow_loader, "fake")
    try:
        r = httpx.get(server.url + "/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading" and r.headers["retry-after"]
        release.set()
        server.wait_ready(30)
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        release.set()
        server.stop()


def test_tool_history_renders_through_the_qwen_template():
    from tallow.chat.template import ChatTemplate
    from tallow.gguf_file import GGUFFile

    template = ChatTemplate.from_gguf(GGUFFile(require_model(QWEN)))
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    ]
    text = template.render(messages, tools=[WEATHER_TOOL])
    assert '"name": "get_weather"' in text and '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<tool_response>\n{"temp_c": 21}\n</tool_response>' in text


@pytest.fixture(scope="module")
def qwen():
    with serve_model(QWEN, ctx=1024, timeout=300) as pair:
        yield pair


@pytest.mark.slow
def test_tool_call_is_parsed_into_tool_calls(qwen):
    _, client = qwen
    r = client.chat.completions.create(model=QWEN, messages=ASK, tools=[WEATHER_TOOL], max_tokens=40, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"].lower() == "paris"
    assert not choice.message.content


@pytest.mark.slow
def test_named_tool_choice_streams_a_call_and_history_round_trips(qwen):
    _, client = qwen
    chunks = list(client.chat.completions.create(model=QWEN, messages=ASK, tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=40, temperature=0, stream=True))
    calls = streamed_tool_calls(chunks)
    assert len(calls) == 1 and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"])["city"].lower() == "paris"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0]["id"], "type": "function", "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"temp_c": 21, "sky": "sunny"}'},
    ]
    # The server's own ids and arguments are accepted back as history (what the answer says
    # next is the model's business; the rendering is checked above).
    r = client.chat.completions.create(model=QWEN, messages=history, tools=[WEATHER_TOOL], max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens > 0


ORDER_TOOL = {
    "type": "function",
    "function": {
        "name": "place_order",
        "description": "Order items for delivery.",
        "parameters": {
            "$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 12}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["sku", "qty"]}},
            "type": "object",
            "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 2}, "express": {"type": "boolean"}},
            "required": ["items", "express"],
        },
    },
}


@pytest.mark.slow
def test_required_tool_choice_is_a_grammar_with_nested_arguments(qwen):
    jsonschema = pytest.importorskip("jsonschema")
    _, client = qwen
    ask = [{"role": "user", "content": "Hi there, how are you today?"}]  # nothing here asks for a tool: the grammar must
    r = client.chat.completions.create(model=QWEN, messages=ask, tools=[WEATHER_TOOL, ORDER_TOOL], tool_choice="required", parallel_tool_calls=False, max_tokens=60, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    schema = {"get_weather": WEATHER_TOOL, "place_order": ORDER_TOOL}[call.function.name]["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)
