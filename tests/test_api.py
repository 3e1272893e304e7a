"""The Python API, the product: tallow.load / generate / chat / stats."""

from __future__ import annotations

import json
import os

import pytest

import tallow
from tallow.errors import UsageError

from model_paths import model_path


@pytest.fixture(scope="module")
def llm():
    path = model_path("smollm2-135m")
    if path is None:
        if os.environ.get("TALLOW_REQUIRE_MODELS") == "1":
            pytest.fail("smollm2-135m is required but missing")
        pytest.skip("smollm2-135m not found")
    return tallow.load(path, ctx=512)


def test_generate_greedy_is_deterministic(llm):
    a = llm.generate("The capital of France is", max_tokens=8)
    b = llm.generate("The capital of France is", max_tokens=8)
    assert a.text == b.text and "Paris" in a.text
    assert a.finish_reason == "length" and len(a.tokens) == 8
    assert a.stats.prompt_tokens == len(llm.tokenize("The capital of France is"))


def test_stream_equals_non_stream(llm):
    full = llm.generate("def add(a, b):", max_tokens=20)
    streamed = "".join(llm.generate("def add(a, b):", max_tokens=20, stream=True))
    assert streamed == full.text


def test_prefix_reuse_counts_and_keeps_output(llm):
    system = {"role": "system", "content": "You are a terse assistant for a smart home. " * 12}  # > 64 + 40 tokens
    first = llm.chat([system, {"role": "user", "content": "Turn on the lights."}], max_tokens=8)
    second = llm.chat([system, {"role": "user", "content": "Turn off the fan."}], max_tokens=8)
    assert second.stats.reused_tokens > 40
    assert second.stats.prefill_tokens == second.stats.prompt_tokens - second.stats.reused_tokens
    llm.engine.reset()
    cold = llm.chat([system, {"role": "user", "content": "Turn off the fan."}], max_tokens=8)
    assert cold.stats.reused_tokens == 0
    assert cold.text == second.text
    assert first.text


def test_seeded_sampling_reproducible(llm):
    kw = dict(max_tokens=12, temperature=0.9, top_k=50, seed=1234)
    assert llm.generate("Once upon a time", **kw).text == llm.generate("Once upon a time", **kw).text


def test_stop_string_cuts_and_holds_back(llm):
    out = llm.generate("1, 2, 3, 4,", max_tokens=20, stop=[" 7"])
    assert " 7" not in out.text and out.finish_reason == "stop"
    assert out.text.strip().startswith("5")


def test_should_stop_cancels_between_tokens(llm):
    count = {"n": 0}

    def stop_after_three() -> bool:
        count["n"] += 1
        return count["n"] >= 3

    out = llm.generate("Once upon a time", max_tokens=50, should_stop=stop_after_three)
    assert len(out.tokens) == 3


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=4, temperature=-0.5), "temperature"),
        (dict(max_tokens=4, top_p=1.5), "top_p"),
    ],
)
def test_bad_arguments_raise_usage_error(llm, kwargs, needle):
    with pytest.raises(UsageError, match=needle):
        llm.generate("hello", **kwargs)


def test_prompt_longer_than_context_is_refused(llm):
    with pytest.raises(UsageError, match="context"):
        llm.generate(list(range(100, 700)), max_tokens=4)


def test_load_stats(llm):
    load = llm.stats.load
    assert load.load_s > 0 and load.weights_bytes > 50e6 and load.kv_bytes > 0


def test_logprobs_are_the_models_distribution(llm):
    import torch

    out = llm.generate("The capital of France is", max_tokens=3, logprobs=2)
    assert len(out.logprobs) == len(out.tokens) == 3
    first = out.logprobs[0]
    assert first.token == out.tokens[0] and len(first.top) == 2
    assert first.top[0][0] == first.token  # greedy: the chosen token is the most likely one
    assert first.logprob <= 0 and first.top[0][3] >= first.top[1][3]
    # the same number from a direct forward pass over the prompt
    llm.engine.reset()
    ids = llm.tokenize("The capital of France is")
    logits = llm.model.forward(ids, 0, llm.engine.kv)[-1]
    assert abs(torch.log_softmax(logits, -1)[first.token].item() - first.logprob) < 1e-5
    assert llm.generate("Hi", max_tokens=2).logprobs is None
    with pytest.raises(UsageError, match="logprobs"):
        llm.generate("Hi", max_tokens=2, logprobs=99)


def test_chat_events_stream_the_calls_chat_returns(llm):
    """LLM.chat_events runs the server's parser: a call's id and name first, then its arguments
    in pieces, adding up to the call a non-streamed chat returns."""
    tool = {"type": "function", "function": {"name": "save_note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "minLength": 20, "maxLength": 60}}, "required": ["text"]}}}
    ask = [{"role": "user", "content": "Save a note: buy milk and bread."}]
    whole = llm.chat(ask, tools=[tool], tool_choice="required", parallel_tool_calls=False, max_tokens=40)
    events = list(llm.chat_events(ask, tools=[tool], tool_choice="required", parallel_tool_calls=False, max_tokens=40))
    pieces = [d for e in events for d in e.call_deltas]
    assert pieces[0].name == "save_note" and pieces[0].id and pieces[0].arguments == ""
    assert len([e for e in events if any(d.id is None for d in e.call_deltas)]) > 3
    streamed = "".join(d.arguments for d in pieces)
    (call,) = [c for e in events for c in e.tool_calls]
    assert streamed == call.arguments and [(c.name, c.arguments) for c in whole.tool_calls] == [("save_note", streamed)]
    assert len(json.loads(streamed)["text"]) >= 20


def test_chat_splits_reasoning_as_the_server_does(llm, monkeypatch):
    """LLM.chat parses a whole answer with the server's parser (LLM.prepare_chat), tools or not:
    the thinking goes to `reasoning`, the answer to `text`. The model's output is stubbed."""
    from tallow.api import Completion

    answer = "<think>the user greets</think>Hello!"

    def run(ids, max_tokens, stream, *rest):
        return iter([answer[:9], answer[9:30], answer[30:]]) if stream else Completion(answer, [], "stop", llm.stats.last)

    monkeypatch.setattr(llm, "_run", run)
    ask = [{"role": "user", "content": "Hi"}]
    out = llm.chat(ask)
    assert (out.reasoning, out.text, out.tool_calls) == ("the user greets", "Hello!", None)
    events = list(llm.chat_events(ask))  # what the server streams
    assert "".join(e.reasoning for e in events) == out.reasoning and "".join(e.content for e in events) == out.text
    prepared = llm.prepare_chat(ask)
    assert "".join(e.content for e in llm.chat_events(prepared)) == "Hello!"
    assert prepared.ids == llm.chat_prompt(ask) and prepared.tools is None


def test_tool_choice_none_offers_no_tools_in_one_place(llm):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    ask = [{"role": "user", "content": "Hi"}]
    assert llm.prepare_chat(ask, [tool], tool_choice="none").tools is None
    assert llm.render_chat(ask, [tool], tool_choice="none") == llm.render_chat(ask)
    assert llm.context_used == len(llm.engine.kv.tokens)


def test_the_server_goes_through_the_api():
    """The server maps LLM's events to JSON/SSE: it never reaches into the engine, the template
    or the parser, and the tool-choice rule lives in tallow/api.py alone."""
    from pathlib import Path

    server = Path(tallow.__file__).parent / "server"
    for path in server.glob("*.py"):
        text = path.read_text()
        assert ".engine" not in text and "ChatOutputParser" not in text and "chat_parser" not in text, path.name
        assert 'tool_choice != "none"' not in text, path.name
        assert "template.render" not in text, path.name
    assert (Path(tallow.__file__).parent / "api.py").read_text().count('tool_choice != "none"') == 1
