"""Write tests/fixtures/chat_templates.json: reference chat-template renderings.

Dev-only: needs llama-cpp-python, which tallow itself never imports.

* Templates stored in a GGUF are rendered with llama-cpp-python's `Jinja2ChatFormatter`, an
  independent re-implementation of transformers' `apply_chat_template` Jinja setup, fed
  the same BOS/EOS token text that llama.cpp derives from the vocabulary.
* The built-in fallbacks (gemma, chatml) are rendered with llama.cpp's own C++ formatter,
  `llama_chat_apply_template`, which is what our built-ins are meant to reproduce.

Run: python scripts/make_template_fixtures.py   (from the repository root)
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tallow.gguf_file import GGUFFile

MODELS = Path("/root/models")
OUT = ROOT / "tests" / "fixtures" / "chat_templates.json"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Température actuelle d'une ville, en °C — <b>not HTML-escaped</b>",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}},
            "required": ["tz"],
        },
    },
}

SYSTEM_USER = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2+2?"},
]
USER_ONLY = [{"role": "user", "content": "Hello there!"}]
MULTI_TURN = [
    {"role": "system", "content": "  Answer in French.  "},
    {"role": "user", "content": "Hi, how are you?"},
    {"role": "assistant", "content": "Très bien, merci !"},
    {"role": "user", "content": 'Et toi ? 🙂 <tag> & "quotes"'},
]
TOOL_ROUND_TRIP = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather and time in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": {"city": "Zürich", "unit": "celsius"},
                },
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_time", "arguments": {"tz": "Europe/Zurich"}},
            },
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_1",
        "name": "get_weather",
        "content": '{"temp": 21}',
    },
    {"role": "tool", "tool_call_id": "call_2", "name": "get_time", "content": "14:05"},
    {"role": "assistant", "content": "It is 21 °C and 14:05 in Zürich."},
    {"role": "user", "content": "Thanks!"},
]

# (case name, messages, tools, add_generation_prompt)
TEMPLATE_CASES: list[
    tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None, bool]
] = [
    ("system_user", SYSTEM_USER, None, True),
    ("user_only", USER_ONLY, None, True),
    ("multi_turn", MULTI_TURN, None, True),
    ("multi_turn_no_generation_prompt", MULTI_TURN, None, False),
]
TOOL_CASES = [
    ("tools_system_user", SYSTEM_USER, [WEATHER_TOOL, TIME_TOOL], True),
    ("tools_user_only", USER_ONLY, [WEATHER_TOOL], True),
    ("tool_round_trip", TOOL_ROUND_TRIP, [WEATHER_TOOL, TIME_TOOL], True),
    (
        "tool_round_trip_no_generation_prompt",
        TOOL_ROUND_TRIP,
        [WEATHER_TOOL, TIME_TOOL],
        False,
    ),
    ("tool_messages_without_tools", TOOL_ROUND_TRIP, None, True),
]
# Built-in formats are plain role/content; llama.cpp's C++ formatter knows nothing else.
BUILTIN_CASES = [
    ("system_user", SYSTEM_USER, True),
    ("user_only", USER_ONLY, True),
    ("multi_turn", MULTI_TURN, True),
    ("multi_turn_no_generation_prompt", MULTI_TURN, False),
    (
        "two_systems_model_first",
        [
            {"role": "system", "content": "A "},
            {"role": "system", "content": " B"},
            {"role": "assistant", "content": "x"},
            {"role": "user", "content": "u"},
        ],
        True,
    ),
]


def vocab_text(md: dict[str, Any], key: str) -> str:
    tokens = md["tokenizer.ggml.tokens"]
    tid = md.get(key)
    return tokens[tid] if isinstance(tid, int) and 0 <= tid < len(tokens) else ""


def jinja_reference(
    md: dict[str, Any], messages, tools, add_generation_prompt: bool
) -> str:
    formatter = Jinja2ChatFormatter(
        template=md["tokenizer.chat_template"],
        eos_token=vocab_text(md, "tokenizer.ggml.eos_token_id"),
        bos_token=vocab_text(md, "tokenizer.ggml.bos_token_id"),
        add_generation_prompt=add_generation_prompt,
    )
    return formatter(messages=json.loads(json.dumps(messages)), tools=tools).prompt


def llama_cpp_builtin(name: str, messages, add_generation_prompt: bool) -> str:
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []  # keep the byte strings alive while C reads them
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        arr[i].role = role
        arr[i].content = content
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(
        name.encode(), arr, len(messages), add_generation_prompt, buf, size
    )
    if n < 0 or n > size:
        raise RuntimeError(f"llama_chat_apply_template({name}) failed: {n}")
    return buf.raw[:n].decode("utf-8")


def main() -> None:
    cases: list[dict[str, Any]] = []
    for model, with_tools in [
        ("smollm2-135m", False),
        ("qwen2.5-coder-1.5b-instruct", True),
    ]:
        md = GGUFFile(str(MODELS / f"{model}.gguf")).metadata
        for name, messages, tools, agp in TEMPLATE_CASES + (
            TOOL_CASES if with_tools else []
        ):
            cases.append(
                {
                    "model": model,
                    "template": "gguf",
                    "case": name,
                    "messages": messages,
                    "tools": tools,
                    "add_generation_prompt": agp,
                    "expected": jinja_reference(md, messages, tools, agp),
                    "reference": "llama_cpp.llama_chat_format.Jinja2ChatFormatter",
                }
            )
    for builtin in ("gemma", "chatml"):
        for name, messages, agp in BUILTIN_CASES:
            cases.append(
                {
                    "model": None,
                    "template": builtin,
                    "case": name,
                    "messages": messages,
                    "tools": None,
                    "add_generation_prompt": agp,
                    "expected": llama_cpp_builtin(builtin, messages, agp),
                    "reference": "llama_cpp.llama_chat_apply_template (llama.cpp C++)",
                }
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "generator": "scripts/make_template_fixtures.py",
                "llama_cpp_python": llama_cpp.__version__,
                "cases": cases,
            },
            ensure_ascii=False,
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
