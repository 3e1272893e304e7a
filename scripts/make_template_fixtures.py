"""Write tests/fixtures/chat_templates.json: reference chat-template renderings.

Dev-only: needs llama-cpp-python, which tallow itself never imports.

* Templates stored in a GGUF are rendered with llama-cpp-python's `Jinja2ChatFormatter`, an
  independent re-implementation of transformers' `apply_chat_template` Jinja setup, fed
  the same BOS/EOS token text that llama.cpp derives from the vocabulary.
* The built-in fallbacks (gemma, chatml) are rendered with llama.cpp's own C++ formatter,
  `llama_chat_apply_template`, which is what our built-ins are meant to reproduce.

* Gemma 4's templates (the one inside llama.cpp's Gemma 4 vocabulary file and the two
  in shared/vocab/) are rendered by llama.cpp itself: `llama-server --jinja` on a tiny
  random-weight gemma4 model carrying the real vocabulary, through its `/apply-template`
  endpoint — llama.cpp's own Jinja engine plus its Gemma 4 workarounds (role:tool messages
  folded into `tool_responses` for the older templates, string arguments parsed into objects,
  `<|turn>model\n` appended after a closed turn). The template texts go into the fixture too.

Run: python scripts/make_template_fixtures.py [--llama-server /tmp/llama/llama-server]
(from the repository root; without --llama-server the Gemma 4 cases are kept as they are)
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from tallow.gguf_file import GGUFFile
from tiny_models import write_tiny_gemma4_vocab  # noqa: E402

MODELS = Path(os.environ.get("TALLOW_TEST_MODELS", "/root/models"))
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


# ----------------------------------------------------------------------------- Gemma 4

GEMMA4_TEMPLATES = {  # fixture name -> file in shared/vocab ("" = the vocab GGUF's own template)
    "gemma4-gguf": "",
    "gemma4-31b-it": "google-gemma-4-31B-it.jinja",
    "gemma4-31b-it-interleaved": "google-gemma-4-31B-it-interleaved.jinja",
}
NESTED_TOOL = {
    "type": "function",
    "function": {
        "name": "plan_trip",
        "description": "Plan a trip.",
        "parameters": {
            "type": "object",
            "properties": {
                "stops": {"type": "array", "items": {"type": "string"}, "description": "Cities in order"},
                "budget": {"type": "number", "nullable": True},
                "options": {
                    "type": "object",
                    "properties": {"train": {"type": "boolean"}, "nights": {"type": "integer"}},
                    "required": ["train"],
                },
            },
            "required": ["stops"],
        },
    },
}
GEMMA4_TOOL_CALL = [
    {"role": "user", "content": "Weather and time in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "unit": "celsius"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "Europe/Zurich"}'}},
    ]},
]
GEMMA4_RESPONSES = GEMMA4_TOOL_CALL + [
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "clear"}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
]
GEMMA4_ROUND_TRIP = [{"role": "system", "content": "You can call tools."}] + GEMMA4_RESPONSES + [
    {"role": "assistant", "content": "It is 21 °C and 14:05 in Zürich."},
    {"role": "user", "content": "Thanks! And tomorrow?"},
]
GEMMA4_REASONING_CALL = [
    {"role": "user", "content": "Plan Paris then Rome, by train."},
    {"role": "assistant", "content": "", "reasoning_content": "Two stops; the user wants the train.", "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "plan_trip", "arguments": {
            "stops": ["Paris", "Rome"], "budget": None, "options": {"train": True, "nights": 3}}}},
    ]},
    {"role": "tool", "tool_call_id": "call_9", "content": "booked"},
]
GEMMA4_THOUGHT_HISTORY = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "<|channel>thought\nEasy.<channel|>4"},
    {"role": "user", "content": "  and 3+3?  "},
]
GEMMA4_CONTENT_PARTS = [
    {"role": "system", "content": [{"type": "text", "text": " Be brief. "}, {"type": "text", "text": "Really."}]},
    {"role": "user", "content": [{"type": "text", "text": "  Hello "}, {"type": "text", "text": "world"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
    {"role": "user", "content": "x"},
]
# (case, messages, tools, add_generation_prompt, enable_thinking)
GEMMA4_CASES = [
    ("content_parts", GEMMA4_CONTENT_PARTS, None, True, False),
    ("user_only", USER_ONLY, None, True, False),
    ("user_only_thinking", USER_ONLY, None, True, True),
    ("system_user", SYSTEM_USER, None, True, False),
    ("system_user_thinking", SYSTEM_USER, None, True, True),
    ("multi_turn", MULTI_TURN, None, True, False),
    ("multi_turn_no_generation_prompt", MULTI_TURN, None, False, False),
    ("thought_in_history", GEMMA4_THOUGHT_HISTORY, None, True, True),
    ("tools_declared", SYSTEM_USER, [WEATHER_TOOL, TIME_TOOL, NESTED_TOOL], True, False),
    ("tools_declared_thinking", USER_ONLY, [WEATHER_TOOL, NESTED_TOOL], True, True),
    ("tool_responses", GEMMA4_RESPONSES, [WEATHER_TOOL, TIME_TOOL], True, False),
    ("tool_responses_thinking", GEMMA4_RESPONSES, [WEATHER_TOOL, TIME_TOOL], True, True),
    ("tool_round_trip", GEMMA4_ROUND_TRIP, [WEATHER_TOOL, TIME_TOOL], True, False),
    ("tool_round_trip_no_generation_prompt", GEMMA4_ROUND_TRIP, [WEATHER_TOOL, TIME_TOOL], False, False),
    ("reasoning_before_call", GEMMA4_REASONING_CALL, [NESTED_TOOL], True, True),
]


def llama_server_render(server: Path, model: Path, template_file: Path | None, cases) -> list[str]:
    """Each case's prompt from llama-server's /apply-template (llama.cpp's own chat rendering)."""
    import os
    import socket
    import subprocess
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(server), "-m", str(model), "--jinja", "--port", str(port), "-t", "1", "-c", "8192"]
    if template_file is not None:
        cmd += ["--chat-template-file", str(template_file)]
    env = dict(os.environ, LD_LIBRARY_PATH=str(server.parent))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        out = []
        for _, messages, tools, agp, thinking in cases:
            body: dict[str, Any] = {"messages": messages, "add_generation_prompt": agp,
                                    "chat_template_kwargs": {"enable_thinking": thinking}}
            if tools:
                body["tools"] = tools
            req = urllib.request.Request(f"http://127.0.0.1:{port}/apply-template", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            try:
                out.append(json.loads(urllib.request.urlopen(req, timeout=30).read())["prompt"])
            except urllib.error.HTTPError as exc:
                raise SystemExit(f"llama-server refused {body}: {exc.read().decode()}") from None
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def gemma4_fixture(server: Path, vocab_dir: Path) -> dict[str, Any]:
    import lzma
    import tempfile

    sources: dict[str, str] = {}
    cases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        vocab = Path(tmp) / "ggml-vocab-gemma-4.gguf"
        vocab.write_bytes(lzma.decompress((vocab_dir / "ggml-vocab-gemma-4.gguf.xz").read_bytes()))
        model = Path(tmp) / "tiny-gemma4.gguf"
        write_tiny_gemma4_vocab(vocab, model)
        for name, file in GEMMA4_TEMPLATES.items():
            path = vocab_dir / file if file else None
            sources[name] = path.read_text(encoding="utf-8") if path else GGUFFile(str(vocab)).metadata["tokenizer.chat_template"]
            for case, prompt in zip(GEMMA4_CASES, llama_server_render(server, model, path, GEMMA4_CASES)):
                cases.append({"template": name, "case": case[0], "messages": case[1], "tools": case[2],
                              "add_generation_prompt": case[3], "enable_thinking": case[4], "expected": prompt,
                              "reference": "llama-server b11434 /apply-template"})
    return {"sources": sources, "bos_token": "<bos>", "eos_token": "<eos>", "cases": cases}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server (for the Gemma 4 cases)")
    ap.add_argument("--vocab-dir", type=Path, default=ROOT.parent.parent / "shared" / "vocab")
    args = ap.parse_args()
    previous = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
    gemma4 = gemma4_fixture(args.llama_server, args.vocab_dir) if args.llama_server else previous.get("gemma4")
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
                "gemma4": gemma4,
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
