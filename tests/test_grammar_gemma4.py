"""Gemma 4's tool-call grammar (grammar/gemma4_calls.py) on the real Gemma 4 vocabulary: it
accepts the calls Gemma 4's template writes and the parser reads, and refuses malformed ones."""

from __future__ import annotations

import copy
import json
import re

import pytest

from shared_data import vocab_gguf
from tallow.chat.parsers import parse_chat_output
from tallow.chat.template import ChatTemplate
from tallow.grammar import GrammarSpec, build_constraint

Q = '<|"|>'
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                                         "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "set_light", "parameters": {
        "type": "object", "properties": {"on": {"type": "boolean"}, "rgb": {"type": "array", "items": {"type": "number"}},
                                         "scene": {"type": "object", "properties": {"name": {"type": "string"}, "fade": {"type": ["number", "null"]}},
                                                   "required": ["name"]},
                                         "extra": {"type": "object"}}, "required": ["on"]}}},
    {"type": "function", "function": {"name": "ping"}},
]


@pytest.fixture(scope="module")
def gemma4():
    from tallow.gguf_file import GGUFFile
    from tallow.tokenizer import Tokenizer

    gf = GGUFFile(vocab_gguf("gemma-4"))  # skips when the shared folder is absent
    return Tokenizer.from_gguf(gf), ChatTemplate.from_gguf(gf)


def walk(gemma4, spec: GrammarSpec, text: str) -> tuple[bool, bool]:
    """(every token of `text` was allowed, an end-of-generation token is allowed after it)."""
    tok, tmpl = gemma4
    matcher = build_constraint(tok, tok.vocab_size, spec, tmpl.source).matcher
    ids = tok.encode(text, add_special=False, parse_special=True)
    if matcher.try_consume_tokens(ids) != len(ids):  # (no mask per token: 262k-token masks are slow)
        return False, False
    return True, matcher.is_accepting()


def call(name: str, body: str) -> str:
    return f"<|tool_call>call:{name}{{{body}}}<tool_call|>"


REQUIRED = GrammarSpec(tools=TOOLS, tool_choice="required")
CASES = [
    # (spec, text, accepted, may end there)
    (REQUIRED, call("get_weather", f"city:{Q}Paris{Q}"), True, True),
    (REQUIRED, call("get_weather", f"city:{Q}Zürich, CH{Q},days:3,unit:{Q}celsius{Q}"), True, True),
    (REQUIRED, call("set_light", f"extra:{{a:[1,{Q}x{Q}]}},on:true,rgb:[1, 2.5e0],scene:{{fade:null,name:{Q}eve{Q}}}"), True, True),
    (REQUIRED, call("ping", ""), True, True),
    (REQUIRED, call("set_light", "on:true") + call("ping", ""), True, True),  # parallel calls
    (REQUIRED, f"<|channel>thought\nThe user wants light.<channel|>" + call("set_light", "on:false"), True, True),
    (REQUIRED, call("get_weather", f"city:{Q}Paris{Q}")[: -len("<tool_call|>")], True, False),  # not closed yet
    (REQUIRED, call("get_weather", "days:3"), False, False),  # 'city' is required
    (REQUIRED, call("get_weather", f"city:{Q}Paris{Q},unit:{Q}kelvin{Q}"), False, False),  # not in the enum
    (REQUIRED, call("get_weather", f"city:{Q}Paris{Q},wind:1"), False, False),  # no such key
    (REQUIRED, call("get_weather", f"unit:{Q}celsius{Q},city:{Q}Paris{Q}"), False, False),  # keys in sorted order
    (REQUIRED, call("get_weather", "city:Paris"), False, False),  # an unquoted string
    (REQUIRED, call("get_weather", f"city:{Q}Paris{Q},days:2.5"), False, False),  # not an integer
    (REQUIRED, call("set_light", "on:yes"), False, False),
    (REQUIRED, call("launch_rocket", ""), False, False),  # not a declared tool
    (REQUIRED, "Sure. " + call("ping", ""), False, False),  # required: nothing but calls
    (REQUIRED, '<|tool_call>{"name": "ping", "arguments": {}}<tool_call|>', False, False),  # JSON is not Gemma's syntax
    (GrammarSpec(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), call("ping", "") + call("ping", ""), False, False),
    (GrammarSpec(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "ping"}}), call("ping", ""), True, True),
    (GrammarSpec(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "ping"}}), call("set_light", "on:true"), False, False),
    (GrammarSpec(tools=TOOLS), "Just an answer.", True, True),  # auto: free text
    (GrammarSpec(tools=TOOLS), "<|channel>thought\nhm<channel|>Let me check." + call("get_weather", f"city:{Q}Oslo{Q}"), True, True),
    (GrammarSpec(tools=TOOLS), "Let me check." + call("get_weather", "city:Oslo"), False, False),  # a call, once opened, is constrained
    (GrammarSpec(tools=TOOLS), call("ping", "") + " and more text", False, False),
    # a response format alone: the JSON answer, after an optional thought
    (GrammarSpec(response_format={"type": "json_object"}), '{"a": [1, true]}', True, True),
    (GrammarSpec(response_format={"type": "json_object"}), '<|channel>thought\nJSON, then.<channel|>{"a": 1}', True, True),
    (GrammarSpec(response_format={"type": "json_object"}), 'Here: {"a": 1}', False, False),
]


@pytest.mark.parametrize("spec,text,accepted,ends", CASES, ids=[str(i) for i in range(len(CASES))])
def test_grammar_walks(gemma4, spec, text, accepted, ends):
    assert walk(gemma4, spec, text) == (accepted, ends)


ARGUMENTS = [
    ("get_weather", {"city": "Zürich \"quoted\" {braces}", "days": 10, "unit": "fahrenheit"}),
    ("get_weather", {"city": ""}),
    # (no None: the template prints a null argument as nothing, `fade:,`, which neither llama.cpp's
    # parser nor ours reads back; the grammar has the model write `null`)
    ("set_light", {"on": True, "rgb": [0, 127.5, -1], "scene": {"name": "night", "fade": 0.5}, "extra": {"k": [True, "v", {"n": 1}]}}),
    ("set_light", {"on": False, "rgb": []}),
    ("ping", {}),
]


@pytest.mark.parametrize("name,args", ARGUMENTS)
def test_template_calls_are_accepted_and_parsed_back(gemma4, name, args):
    """A call as Gemma 4's template writes it in the history (the syntax the model learnt):
    the required-call grammar accepts it and the parser returns the same arguments."""
    _, tmpl = gemma4
    history = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": copy.deepcopy(args)}}]}]
    text = re.search(r"<\|tool_call>.*?<tool_call\|>", tmpl.render(history, tools=TOOLS, add_generation_prompt=False), re.S).group(0)
    assert walk(gemma4, REQUIRED, text) == (True, True), text
    parsed = parse_chat_output(text, [t["function"]["name"] for t in TOOLS], parse_tools=True, syntax="gemma4")
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [(name, args)] and parsed.content == ""


def test_random_model_under_the_grammar_ends_with_a_valid_call_inside_max_tokens(gemma4):
    """Random logits sampled under tool_choice required with a small budget: the answer still
    ends (closing reaches `<|"|>` and `<channel|>`, the markers that end Gemma's free text), and
    the parser reads one call to a declared tool whose arguments are JSON."""
    import torch

    from tallow.sampling import Sampler, SamplingParams

    tok, tmpl = gemma4
    budget = 24
    spec = GrammarSpec(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    c = build_constraint(tok, tok.vocab_size, spec, tmpl.source, budget=budget)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=1), tok.vocab_size, constraint=c)
    gen = torch.Generator().manual_seed(1)
    ids: list[int] = []
    for _ in range(budget):
        t = sampler.sample(torch.randn(tok.vocab_size, generator=gen) * 3, ids)
        if t in tok.eog_ids:
            break
        ids.append(t)
    else:
        pytest.fail("the constrained answer did not end inside its budget")
    parsed = parse_chat_output(tok.decode(ids), [t["function"]["name"] for t in TOOLS], parse_tools=True, syntax="gemma4")
    assert len(parsed.tool_calls) == 1 and parsed.content == ""
    assert isinstance(json.loads(parsed.tool_calls[0].arguments), dict)
