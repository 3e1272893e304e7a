"""Chat templates against reference renderings (tests/fixtures/chat_templates.json).

The fixture is produced by scripts/make_template_fixtures.py with llama-cpp-python's
Jinja2ChatFormatter (GGUF templates) and llama.cpp's C++ llama_chat_apply_template
(built-in gemma/chatml), so these tests need neither llama_cpp nor transformers.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from model_paths import require_model
from tallow.chat.template import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatTemplate
from tallow.errors import TallowError

_ALL = json.loads(
    (Path(__file__).parent / "fixtures" / "chat_templates.json").read_text(
        encoding="utf-8"
    )
)
FIXTURES = _ALL["cases"]
GEMMA4 = _ALL["gemma4"]  # llama-server's /apply-template on Gemma 4's three templates


class FakeGGUF:
    """Just enough of GGUFFile for from_gguf: a metadata dict."""

    def __init__(self, metadata: dict[str, Any]):
        self.metadata = metadata


@cache
def gguf_template(model: str) -> ChatTemplate:
    path = require_model(model)  # wherever `tallow pull` put it; fails under TALLOW_REQUIRE_MODELS=1
    from tallow.gguf_file import GGUFFile

    return ChatTemplate.from_gguf(GGUFFile(str(path)))


def template_for(case: dict[str, Any]) -> ChatTemplate:
    if case["template"] == "gguf":
        return gguf_template(case["model"])
    source = {"gemma": GEMMA_TEMPLATE, "chatml": CHATML_TEMPLATE}[case["template"]]
    return ChatTemplate(source, "<bos>", "<eos>", is_builtin=True)


@pytest.mark.parametrize(
    "case",
    FIXTURES,
    ids=[f"{c['model'] or c['template']}-{c['case']}" for c in FIXTURES],
)
def test_matches_reference(case: dict[str, Any]) -> None:
    tmpl = template_for(case)
    got = tmpl.render(
        copy.deepcopy(case["messages"]),
        tools=case["tools"],
        add_generation_prompt=case["add_generation_prompt"],
    )
    assert got == case["expected"]


def fixture(model: str, name: str) -> dict[str, Any]:
    return next(c for c in FIXTURES if c["model"] == model and c["case"] == name)


QWEN = "qwen2.5-coder-1.5b-instruct"


def test_qwen_tool_prompt_contains_tools_json() -> None:
    """Hand check: each tool is one compact JSON line inside <tools>, non-ASCII kept and no
    HTML escaping (Jinja's stock tojson would write \\u003c), as Qwen was trained on."""
    case = fixture(QWEN, "tools_system_user")
    text = gguf_template(QWEN).render(case["messages"], tools=case["tools"])
    start = text.index("<tools>\n") + len("<tools>\n")
    end = text.index("\n</tools>")
    lines = text[start:end].split("\n")
    assert [json.loads(line) for line in lines] == case["tools"]
    assert lines[0] == json.dumps(case["tools"][0], ensure_ascii=False)
    assert "Zürich" in text and "<b>not HTML-escaped</b>" in text
    assert text.startswith(
        "<|im_start|>system\nYou are a terse assistant.\n\n# Tools\n"
    )
    assert (
        '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
        in text
    )
    assert text.endswith(
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen_string_arguments_are_parsed_like_llama_cpp() -> None:
    """OpenAI clients send arguments as a JSON string; llama.cpp parses it for templates that
    print objects, so `arguments | tojson` does not double-encode."""
    case = fixture(QWEN, "tool_round_trip")
    messages = copy.deepcopy(case["messages"])
    for call in messages[2]["tool_calls"]:
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
    tmpl = gguf_template(QWEN)
    assert tmpl.supports_object_arguments
    assert tmpl.render(messages, tools=case["tools"]) == case["expected"]
    assert '"arguments": {"city": "Zürich", "unit": "celsius"}' in case["expected"]
    assert isinstance(
        messages[2]["tool_calls"][0]["function"]["arguments"], str
    )  # caller's copy untouched


def test_bad_string_arguments_raise() -> None:
    messages = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": "{nope"}}
            ],
        },
    ]
    with pytest.raises(TallowError, match="not valid JSON"):
        gguf_template(QWEN).render(messages)


def test_content_parts_and_none_content() -> None:
    tmpl = gguf_template("smollm2-135m")
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        }
    ]
    assert tmpl.render(parts) == tmpl.render([{"role": "user", "content": "a\nb"}])
    assert tmpl.render([{"role": "user", "content": None}]) == tmpl.render(
        [{"role": "user", "content": ""}]
    )
    with pytest.raises(TallowError, match="not text"):
        tmpl.render(
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "x"}}],
                }
            ]
        )


@pytest.mark.parametrize(
    "messages, match",
    [
        ("hi", "must be a list"),
        (["hi"], "Message 0 must be an object"),
        ([{"content": "x"}], "Message 0 needs a 'role'"),
        ([{"role": 3, "content": "x"}], "Message 0 needs a 'role'"),
        ([{"role": "user", "content": 5}], "neither a string nor a list"),
    ],
)
def test_message_validation(messages: Any, match: str) -> None:
    with pytest.raises(TallowError, match=match):
        gguf_template("smollm2-135m").render(messages)


def test_template_errors_are_one_sentence() -> None:
    with pytest.raises(
        TallowError, match=r"^The custom chat template has a syntax error at line 1"
    ):
        ChatTemplate("{% for x in %}", name="custom")
    rejecting = ChatTemplate(
        "{{ raise_exception('Only user and assistant roles are supported!') }}"
    )
    with pytest.raises(TallowError) as info:
        rejecting.render([{"role": "user", "content": "x"}])
    msg = str(info.value)
    assert (
        msg
        == "The chat template rejected the conversation: Only user and assistant roles are supported!."
    )
    with pytest.raises(TallowError, match="undefined value"):
        ChatTemplate("{{ nothing.attr }}").render([{"role": "user", "content": "x"}])
    with pytest.raises(TallowError, match="failed to render"):
        ChatTemplate("{{ messages[0].content + 1 }}").render(
            [{"role": "user", "content": "x"}]
        )
    with pytest.raises(TallowError):  # the immutable sandbox forbids mutating lists
        ChatTemplate("{% set l = [] %}{{ l.append(1) }}").render([])


def test_hf_environment_features() -> None:
    source = (
        "{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}"
        "{% generation %}{{ m.content | tojson }}{% endgeneration %}{% endfor %}"
        "{{ {'a': 1, 'b': [1, 2]} | tojson(indent=2) }}|{{ {'k': 'v'} | tojson(separators=(',', ':')) }}"
        "|{{ bos_token }}{{ eos_token }}|{{ enable_thinking }}|{{ strftime_now('%Y') | length }}"
    )
    tmpl = ChatTemplate(source, "<s>", "</s>")
    text = tmpl.render(
        [{"role": "user", "content": "é<>"}, {"role": "skip", "content": "no"}],
        enable_thinking=False,
    )
    assert (
        text
        == '"é<>"{\n  "a": 1,\n  "b": [\n    1,\n    2\n  ]\n}|{"k":"v"}|<s></s>|False|4'
    )


def test_trim_and_lstrip_blocks() -> None:
    source = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    assert ChatTemplate(source).render([{"role": "user", "content": "a"}]) == "[a]\n"


def test_builtin_choice_and_bos() -> None:
    gemma = gguf_template("gemma3-270m")
    assert gemma.is_builtin and gemma.source == GEMMA_TEMPLATE
    assert gemma.bos_token == "<bos>" and gemma.eos_token == "<eos>"
    assert not gemma.template_adds_bos  # the tokenizer (add_bos_token=True) adds it
    other = ChatTemplate.from_gguf(
        FakeGGUF({"general.architecture": "llama", "tokenizer.ggml.bos_token_id": 0}),
        tokens=["<s>"],
    )
    assert (
        other.is_builtin
        and other.source == CHATML_TEMPLATE
        and other.bos_token == "<s>"
    )
    assert other.eos_token == ""  # no eos id: empty, as llama.cpp does


def test_template_adds_bos_and_prompt_for_tokenizer() -> None:
    # SmolLM2's BOS text is <|im_start|>, which its template's first turn starts with.
    smol = gguf_template("smollm2-135m")
    assert smol.bos_token == "<|im_start|>" and smol.template_adds_bos
    text = smol.render(USER := [{"role": "user", "content": "hi"}])
    assert (
        smol.prompt_for_tokenizer(text, tokenizer_adds_bos=False) == text
    )  # add_bos_token=False
    qwen = gguf_template(QWEN)
    assert qwen.bos_token == "<|endoftext|>" and not qwen.template_adds_bos
    # A gemma-3-style template that writes {{ bos_token }} itself, with a vocab that adds BOS.
    hf_gemma = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
        "<bos>",
        "<eos>",
    )
    assert hf_gemma.template_adds_bos
    rendered = hf_gemma.render(USER)
    assert rendered == "<bos>hi"
    assert hf_gemma.prompt_for_tokenizer(rendered, tokenizer_adds_bos=True) == "hi"
    assert (
        hf_gemma.prompt_for_tokenizer(rendered, tokenizer_adds_bos=False) == "<bos>hi"
    )


def test_object_argument_probe() -> None:
    prints_raw = ChatTemplate(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments }}{% endfor %}{% endfor %}"
    )
    assert not prints_raw.supports_object_arguments
    msgs = [
        {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
        }
    ]
    assert prints_raw.render(msgs) == '{"a": 1}'  # left as the string the client sent


@cache
def gemma4_template(name: str) -> ChatTemplate:
    return ChatTemplate(GEMMA4["sources"][name], GEMMA4["bos_token"], GEMMA4["eos_token"])


@pytest.mark.parametrize("case", GEMMA4["cases"], ids=[f"{c['template']}-{c['case']}" for c in GEMMA4["cases"]])
def test_gemma4_matches_llama_server(case: dict[str, Any]) -> None:
    """Gemma 4's templates render as llama.cpp renders them (its Jinja engine and its Gemma 4
    workarounds), thinking on and off, with tools, calls and responses in the history. llama.cpp
    strips the template's BOS text (the tokenizer adds BOS), as prompt_for_tokenizer does."""
    tmpl = gemma4_template(case["template"])
    assert tmpl.is_gemma4 and tmpl.supports_object_arguments and tmpl.template_adds_bos
    text = tmpl.render(copy.deepcopy(case["messages"]), tools=case["tools"],
                       add_generation_prompt=case["add_generation_prompt"], enable_thinking=case["enable_thinking"])
    assert tmpl.prompt_for_tokenizer(text, tokenizer_adds_bos=True) == case["expected"]


def test_gemma4_thinking_defaults_on_like_llama_server() -> None:
    tmpl = gemma4_template("gemma4-31b-it")
    on = tmpl.render([{"role": "user", "content": "Hi"}])
    assert "<|think|>" in on and not on.endswith("<|channel>thought\n<channel|>")
    off = tmpl.render([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert "<|think|>" not in off and off.endswith("<|turn>model\n<|channel>thought\n<channel|>")


def test_gemma4_tool_responses_folded_for_older_templates() -> None:
    """The older templates read Gemma's own tool_responses; role:tool messages become those."""
    from tallow.chat.gemma4 import fold_tool_responses

    calls = [{"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}},
             {"id": "b", "type": "function", "function": {"name": "g", "arguments": {}}}]
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "a", "content": '{"x": 1}'},
            {"role": "tool", "tool_call_id": "b", "content": "not json"},
            {"role": "tool", "tool_call_id": "c", "content": "3"},
            {"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}]
    folded = fold_tool_responses(msgs)
    assert [m["role"] for m in folded] == ["user", "assistant", "user"]
    assert folded[1]["tool_responses"] == [{"name": "f", "response": {"x": 1}}, {"name": "g", "response": "not json"},
                                           {"name": "c", "response": 3}]
    assert folded[1]["content"] == "done"
    from tallow.chat.gemma4 import needs_tool_response_folding

    assert [needs_tool_response_folding(GEMMA4["sources"][n]) for n in ("gemma4-gguf", "gemma4-31b-it", "gemma4-31b-it-interleaved")] == [True, False, True]
