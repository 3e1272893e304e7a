"""Constrained decoding: the Sampler's constraint hook, the grammars tallow/grammar builds (walked
token by token over real vocabularies), their errors, and JSON answers from all three models."""

from __future__ import annotations

import json

import pytest
import torch

from model_paths import require_model
from tallow.grammar import GrammarError, GrammarSpec, build_constraint
from tallow.sampling import Sampler, SamplingParams

jsonschema = pytest.importorskip("jsonschema")

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "set_light", "parameters": {
        "$defs": {"rgb": {"type": "object", "properties": {"r": {"type": "integer"}}, "required": ["r"]}},
        "type": "object", "properties": {"room": {"type": "string"}, "color": {"$ref": "#/$defs/rgb"}}, "required": ["room", "color"]}}},
]
CALL = '{"name": "set_light", "arguments": {"room": "kitchen", "color": {"r": 3}}}'
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]}


# --------------------------------------------------------------------------- the Sampler hook


class OnlyTokens:
    """A constraint allowing a fixed set; records what it was advanced with."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed, self.seen = allowed, []

    def mask(self, logits: torch.Tensor) -> None:
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep[list(self.allowed)] = True
        logits.masked_fill_(~keep, float("-inf"))

    def advance(self, token: int) -> None:
        self.seen.append(token)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.3, seed=5)])
def test_sampler_never_picks_a_masked_token_and_advances_once(params):
    logits = torch.randn(500) * 5
    logits[7] = 100.0  # the unconstrained favourite is masked
    raw = logits.clone()
    c = OnlyTokens({3, 11, 42})
    s = Sampler(params, 500, constraint=c)
    picks = [s.sample(logits, [7, 11, 11]) for _ in range(30)]
    assert set(picks) <= {3, 11, 42} and c.seen == picks
    assert torch.equal(logits, raw)  # the caller's logits (e.g. for logprobs) stay raw


def test_sampler_without_constraint_is_unchanged():
    logits = torch.randn(300)
    assert Sampler(SamplingParams(temperature=0), 300).sample(logits, []) == int(torch.argmax(logits))


# --------------------------------------------------------------------------- grammars on real vocabularies


@pytest.fixture(scope="module")
def vocabs():
    from tallow.chat.template import ChatTemplate
    from tallow.gguf_file import GGUFFile
    from tallow.tokenizer import Tokenizer

    out = {}
    for name in ("smollm2-135m", "qwen2.5-coder-1.5b-instruct"):
        gf = GGUFFile(require_model(name))
        out[name] = (Tokenizer.from_gguf(gf), ChatTemplate.from_gguf(gf).source)
    return out


def walk(tok, source, spec: GrammarSpec, text: str) -> tuple[bool, bool]:
    """(every token of `text` was allowed, an end-of-generation token is allowed after it)."""
    c = build_constraint(tok, tok.vocab_size, spec, source)
    for t in tok.encode(text, add_special=False, parse_special=True):
        if not c.allowed()[t]:
            return False, False
        c.advance(t)
    allowed = c.allowed()
    return True, any(bool(allowed[e]) for e in tok.eog_ids)


def auto(**kw):
    return GrammarSpec(tools=TOOLS, tool_choice="auto", **kw)


HERMES_CALL = f"<tool_call>\n{CALL}\n</tool_call>"
CASES = [
    # (models, spec, text, accepted, may end there)
    ("qwen", GrammarSpec(tools=TOOLS, tool_choice="required"), HERMES_CALL, True, True),
    ("qwen", GrammarSpec(tools=TOOLS, tool_choice="required"), HERMES_CALL + "\n" + HERMES_CALL + "\n", True, True),
    ("qwen", GrammarSpec(tools=TOOLS, tool_choice="required", parallel_tool_calls=False), HERMES_CALL + "\n<tool_call>", False, False),
    ("qwen", GrammarSpec(tools=TOOLS, tool_choice="required"), "Sure, " + HERMES_CALL, False, False),
    ("qwen", GrammarSpec(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}), HERMES_CALL, False, False),
    ("qwen", auto(), "Let me check.\n" + HERMES_CALL, True, True),
    ("qwen", auto(), 'Let me check.\n<tool_call>\n{"name": "launch_rocket"', False, False),
    ("qwen", auto(), "Let me check <tool_call> as text", False, False),  # the tag spelled out as text opens nothing
    ("qwen", auto(), "<|fim_prefix|>{thinking}<|fim_middle|>\n" + HERMES_CALL, True, True),  # other special tokens (a <think> block) stay free
    ("smollm2", GrammarSpec(tools=TOOLS, tool_choice="required"), CALL, True, True),
    ("smollm2", GrammarSpec(tools=TOOLS, tool_choice="required"), "[" + CALL + ", " + CALL + "]", True, True),
    ("smollm2", GrammarSpec(tools=TOOLS, tool_choice="required"), '{"name": "set_light", "arguments": {"room": "kitchen"}}', False, False),  # 'color' is required
    ("both", auto(), "Paris is sunny today. ```python\nprint({1: 2})\n```", True, True),
    ("both", auto(), CALL, True, True),
    ("both", auto(), "\n```json\n" + CALL + "\n```", True, True),
    ("both", auto(), '{"name": "launch_rocket"', False, False),
    ("both", auto(), '{"city": "Paris"}', False, False),  # a bare object must be a call once tools are offered
    # several calls in every syntax; parallel_tool_calls false allows one
    ("both", auto(), CALL + "\n" + CALL, True, True),
    ("both", auto(), "[" + CALL + "," + CALL + "]", True, True),
    ("both", auto(), "```json\n" + CALL + "\n```\n```json\n" + CALL + "\n```", True, True),
    ("both", auto(), "```json\n[" + CALL + ", " + CALL + "]\n```", True, True),
    ("both", auto(parallel_tool_calls=False), CALL + "\n" + CALL, False, False),
    ("both", auto(), "[ x ] is a checkbox; [1, 2] a list.", True, True),  # text may open with a bracket
    ("both", auto(parallel_tool_calls=False), "```json\n" + CALL + "\n```\n```json", False, False),
    ("both", auto(parallel_tool_calls=False), "[" + CALL + ",", False, False),
    ("qwen", auto(parallel_tool_calls=False), HERMES_CALL + "\n<tool_call>", False, False),
    ("smollm2", GrammarSpec(tools=TOOLS, tool_choice="required"), "```json\n" + CALL + "\n```\n```json\n" + CALL + "\n```", True, True),
    # a response format beside tools: the formatted answer or a call, nothing else
    ("both", auto(response_format={"type": "json_schema", "json_schema": {"schema": PERSON}}), '{"name": "Al", "age": 3}', True, True),
    ("both", auto(response_format={"type": "json_schema", "json_schema": {"schema": PERSON}}), CALL, True, True),
    ("both", auto(response_format={"type": "json_schema", "json_schema": {"schema": PERSON}}), "[" + CALL + ", " + CALL + "]", True, True),
    ("both", auto(response_format={"type": "json_schema", "json_schema": {"schema": PERSON}}), "Sure: " + CALL, False, False),
    ("both", auto(response_format={"type": "json_schema", "json_schema": {"schema": PERSON}}), '{"name": "get_weather", "age": 3}', True, True),  # shares the call's first bytes
    ("qwen", auto(response_format={"type": "json_object"}), HERMES_CALL, True, True),
    ("both", GrammarSpec(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), '{"a": 1}', False, False),
    ("both", GrammarSpec(response_format={"type": "json_object"}), '{"a": [1, 2.5, {"b": null}], "c": "d"}', True, True),
    ("both", GrammarSpec(response_format={"type": "json_object"}), "Here it is: {}", False, False),
    ("both", GrammarSpec(response_format={"type": "json_schema", "json_schema": {"schema": TOOLS[1]["function"]["parameters"]}}), '{"room": "hall", "color": {"r": 7}}', True, True),
    ("both", GrammarSpec(response_format={"type": "json_schema", "json_schema": {"schema": TOOLS[1]["function"]["parameters"]}}), '{"room": "hall", "color": {"r": "7"}}', False, False),
    ("both", GrammarSpec(response_format={"type": "json_schema", "json_schema": {"schema": TOOLS[1]["function"]["parameters"]}}), '{"room": "hall", "color": {"r": 7}, "extra": 1}', False, False),  # objects are closed
    ("both", GrammarSpec(response_format={"type": "json_schema", "json_schema": {"schema": {**PERSON, "additionalProperties": True}}}), '{"name": "Al", "age": 3, "extra": 1}', True, True),
    ("both", GrammarSpec(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}), "9007199254740991", True, True),
    ("both", GrammarSpec(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}), "90071992547409910", False, False),  # unbounded integers stay in I-JSON's range
    ("both", GrammarSpec(grammar='root ::= "yes" | "no"'), "no", True, True),
    ("both", GrammarSpec(grammar='start: "a"+ "b"'), "aaab", True, True),
    ("both", GrammarSpec(grammar='start: "a"+ "b"'), "aaac", False, False),
]


@pytest.mark.parametrize("which,spec,text,accepted,ends", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_grammar_walks(vocabs, which, spec, text, accepted, ends):
    names = {"qwen": ["qwen2.5-coder-1.5b-instruct"], "smollm2": ["smollm2-135m"], "both": list(vocabs)}[which]
    for name in names:
        tok, source = vocabs[name]
        assert walk(tok, source, spec, text) == (accepted, ends), name


def test_auto_call_names_are_restricted_to_the_declared_tools(vocabs):
    tok, source = vocabs["qwen2.5-coder-1.5b-instruct"]
    c = build_constraint(tok, tok.vocab_size, auto(), source)
    for t in tok.encode('<tool_call>\n{"name": "', add_special=False, parse_special=True):
        c.advance(t)
    allowed = {tok.decode([i]) for i in torch.nonzero(c.allowed()).flatten().tolist()}
    assert allowed and all("get_weather".startswith(a) or "set_light".startswith(a) for a in allowed), sorted(allowed)[:20]


UNSUPPORTED = [
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "not"),
    ({"type": "object", "if": {"type": "object"}, "then": {}}, "if"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "format": "no-such-format"}, "no-such-format"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "/$defs/missing"),
]


@pytest.mark.parametrize("schema,feature", UNSUPPORTED, ids=[u[1] for u in UNSUPPORTED])
def test_unsupported_schema_is_an_error_naming_the_feature(vocabs, schema, feature):
    tok, source = vocabs["smollm2-135m"]
    for spec, param in (
        (GrammarSpec(response_format={"type": "json_schema", "json_schema": {"schema": schema}}), "response_format.json_schema.schema"),
        (GrammarSpec(tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}], tool_choice="required"), "tools[0].function.parameters"),
    ):
        with pytest.raises(GrammarError) as info:
            build_constraint(tok, tok.vocab_size, spec, source)
        assert feature in str(info.value) and info.value.param == param and "\n" not in str(info.value)


def test_grammar_switch_refuses_instead_of_ignoring(vocabs, monkeypatch):
    tok, source = vocabs["smollm2-135m"]
    monkeypatch.setenv("TALLOW_GRAMMAR", "0")
    with pytest.raises(GrammarError, match="TALLOW_GRAMMAR=0"):
        build_constraint(tok, tok.vocab_size, GrammarSpec(response_format={"type": "json_object"}), source)
    assert build_constraint(tok, tok.vocab_size, auto(), source) is None  # auto promises nothing
    monkeypatch.setenv("TALLOW_GRAMMAR", "1")
    monkeypatch.setenv("TALLOW_GRAMMAR_AUTO", "0")
    assert build_constraint(tok, tok.vocab_size, auto(), source) is None


def test_requests_that_cannot_be_honoured_are_refused(vocabs):
    tok, source = vocabs["smollm2-135m"]
    with pytest.raises(GrammarError, match="'grammar' cannot be combined"):
        build_constraint(tok, tok.vocab_size, GrammarSpec(response_format={"type": "json_object"}, grammar='start: "x"'), source)
    with pytest.raises(GrammarError, match="no 'tools'"):
        build_constraint(tok, tok.vocab_size, GrammarSpec(tool_choice="required"), source)
    with pytest.raises(GrammarError, match="must be 'auto'"):
        build_constraint(tok, tok.vocab_size, GrammarSpec(tools=TOOLS, tool_choice="always"), source)
    with pytest.raises(GrammarError, match="not among the declared tools"):
        build_constraint(tok, tok.vocab_size, GrammarSpec(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), source)


# --------------------------------------------------------------------------- live answers through the API


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct"])
def test_json_schema_answers_validate_on_every_model(name):
    import tallow

    llm = tallow.LLM(require_model(name), ctx=512)
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = llm.chat([{"role": "user", "content": "Give me a person with a name and an age as JSON."}], max_tokens=30, response_format=rf)
    assert out.finish_reason == "stop", out.text
    jsonschema.validate(json.loads(out.text), PERSON)
    # json_object at temperature > 0: still one parseable object
    out = llm.generate("A JSON object:", max_tokens=24, response_format={"type": "json_object"}, temperature=1.0, seed=7)
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)
    else:
        assert out.text.startswith("{")
