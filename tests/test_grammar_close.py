"""Budget-aware closing (tallow/grammar/closing.py): the closing policy on a bare matcher, and
constrained answers that end valid inside a tight max_tokens instead of being cut."""

from __future__ import annotations

import json

import llguidance
import pytest

from model_paths import require_model
from tallow.grammar import GrammarSpec, grammar_tokenizer
from tallow.grammar.closing import closing_path, closing_vocab

jsonschema = pytest.importorskip("jsonschema")

# Unbounded on purpose: a small model fills `tags` with the same tag until max_tokens.
TODO = {"type": "object", "properties": {
    "title": {"type": "string"},
    "tags": {"type": "array", "items": {"enum": ["home", "work", "urgent"]}},
    "steps": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}, "what": {"type": "string", "minLength": 2}}, "required": ["n", "what"]}},
}, "required": ["title", "tags"]}
TODO_RF = {"type": "json_schema", "json_schema": {"name": "todo", "schema": TODO}}
PROMPT = [{"role": "user", "content": "Give a todo item as JSON with a title and as many tags as you can. Fields: title, tags"}]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from tallow.gguf_file import GGUFFile
    from tallow.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(require_model("smollm2-135m")))


@pytest.mark.parametrize("prefix", [
    "",
    '{"title": "Buy ]] milk',  # brackets inside a string are text, not closers
    '{"title": "Buy milk", "tags": ["home", "wor',
    '{"title": "Buy milk", "tags": ["home", "work", ',
    '{"title": "x", "tags": [], "steps": [{"n": ',
    '{"title": "x", "tags": [], "steps": [{"n": 4, "what": "',
])
def test_closing_path_ends_valid_json_from_any_prefix(smollm2_tokenizer, prefix):
    tok = smollm2_tokenizer
    ll = grammar_tokenizer(tok)
    matcher = llguidance.LLMatcher(ll, GrammarSpec(response_format=TODO_RF).lark(tok, ""), log_level=0)
    assert matcher.consume_tokens(tok.encode(prefix, add_special=False, parse_special=False))
    path = closing_path(matcher, closing_vocab(tok, ll.vocab_size), 64)
    assert path is not None and len(path) <= 30
    assert not matcher.is_accepting() or prefix == ""  # the matcher itself is left where it was
    jsonschema.validate(json.loads(prefix + tok.decode(path)), TODO)
    assert closing_path(matcher, closing_vocab(tok, ll.vocab_size), len(path) - 1) is None  # the limit holds


@pytest.fixture(scope="module")
def smollm2():
    import tallow

    return tallow.LLM(require_model("smollm2-135m"), ctx=512)


@pytest.mark.parametrize("max_tokens", [14, 24, 40])
def test_json_schema_answer_closes_inside_max_tokens(smollm2, max_tokens):
    out = smollm2.chat(PROMPT, max_tokens=max_tokens, response_format=TODO_RF)
    assert out.finish_reason == "stop" and len(out.tokens) < max_tokens, out.text
    jsonschema.validate(json.loads(out.text), TODO)
    assert out.stats.grammar_steered > 0  # unsteered, this answer repeats "home" past max_tokens


def test_switch_off_cuts_the_answer_as_before(smollm2, monkeypatch):
    monkeypatch.setenv("TALLOW_GRAMMAR_CLOSE", "0")
    out = smollm2.chat(PROMPT, max_tokens=24, response_format=TODO_RF)
    assert out.finish_reason == "length" and out.stats.grammar_steered == 0
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_sampled_answers_and_raw_grammars_close_too(smollm2):
    for seed in range(3):
        out = smollm2.chat(PROMPT, max_tokens=20, response_format=TODO_RF, temperature=1.0, seed=seed)
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), TODO)
    out = smollm2.generate("A long list of fruits:", max_tokens=8, grammar='start: " " item (", " item)* "."\nitem: /[a-z]+/')
    assert out.finish_reason == "stop" and out.text.endswith("."), out.text


def test_forced_tool_calls_close_but_free_text_is_left_alone(smollm2):
    tools = [{"type": "function", "function": {"name": "tag_items", "parameters": {
        "type": "object", "properties": {"tags": TODO["properties"]["tags"]}, "required": ["tags"]}}}]
    ask = [{"role": "user", "content": "Tag my todo list with as many tags as possible."}]
    out = smollm2.chat(ask, tools=tools, tool_choice="required", max_tokens=20)
    assert out.finish_reason == "stop" and len(out.tool_calls) == 1, out.text
    jsonschema.validate(json.loads(out.tool_calls[0].arguments), tools[0]["function"]["parameters"])
    # tool_choice auto promises no grammar: prose at max_tokens is cut, not ended early
    out = smollm2.chat([{"role": "user", "content": "Write a long poem."}], tools=tools, tool_choice="auto", max_tokens=10)
    assert out.finish_reason == "length" and out.stats.grammar_steered == 0
