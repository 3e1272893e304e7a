"""Gemma 4's chat path end to end on a tiny random-weight gemma4 model carrying the real vocabulary
and chat template: the model's output is noise, so only what the grammar and the parser guarantee
is checked — a required tool call comes back parsed into OpenAI `tool_calls`, through the Python
API and through the server's streamed and blocking answers."""

from __future__ import annotations

import json

import pytest

from shared_data import vocab_gguf
from tiny_models import write_tiny_gemma4_vocab

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    import tallow

    path = tmp_path_factory.mktemp("gemma4") / "tiny-gemma4-vocab.gguf"
    write_tiny_gemma4_vocab(vocab_gguf("gemma-4"), path)
    return tallow.LLM(path, ctx=512, device="cpu")


def test_required_tool_call_is_parsed_into_tool_calls(llm):
    out = llm.chat(MESSAGES, tools=[TOOL], tool_choice="required", max_tokens=48, temperature=0,
                   parallel_tool_calls=False)
    assert out.tool_calls, f"no tool call parsed from {out.text!r}"
    call = out.tool_calls[0]
    assert call.name == "get_weather"
    args = json.loads(call.arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)


def test_server_streams_and_answers_the_required_call(llm):
    import openai

    from server_utils import LiveServer, streamed_tool_calls

    server = LiveServer(lambda: llm, "tiny-gemma4", llm.path)
    try:
        server.wait_ready(60)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
        kwargs = dict(model="tiny-gemma4", messages=MESSAGES, tools=[TOOL], tool_choice="required", max_tokens=48,
                      temperature=0, parallel_tool_calls=False)
        blocking = client.chat.completions.create(**kwargs)
        calls = blocking.choices[0].message.tool_calls
        assert blocking.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather"
        assert set(json.loads(calls[0].function.arguments)) == {"city"}
        streamed = streamed_tool_calls(client.chat.completions.create(**kwargs, stream=True))
        assert [c["name"] for c in streamed] == ["get_weather"]
        assert json.loads(streamed[0]["arguments"]) == json.loads(calls[0].function.arguments)  # same greedy call
    finally:
        server.stop()


def test_gemma4_prompt_uses_its_turn_markers(llm):
    ids = llm.chat_prompt(MESSAGES)
    text = llm.tokenizer.decode(ids)  # special tokens kept
    assert text.startswith("<bos>") and "<|turn>user\nWhat is the weather in Paris?<turn|>" in text
    assert text.endswith("<|turn>model\n")
    assert llm.tokenize("<|turn>", add_special=False) == [ids[1]]  # one control token, not its characters
