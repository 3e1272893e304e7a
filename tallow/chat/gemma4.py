"""Gemma 4's chat format: what llama.cpp does around its template (common/parsers/gemma4.cpp).

Gemma 4 writes turns as ``<|turn>role\\n…<turn|>``, its thinking as a channel
``<|channel>thought\\n…<channel|>`` (``<|think|>`` in the system turn switches thinking on), tool
declarations as ``<|tool>declaration:name{…}<tool|>``, tool calls as
``<|tool_call>call:name{key:value,…}<tool_call|>`` and tool results as
``<|tool_response>response:name{…}<tool_response|>``. Strings inside calls are quoted with the
``<|"|>`` token; keys are bare. The parsing of that syntax lives in `parsers.py`; here is the
prompt side:

* the format is recognised by the template text ``'<|tool_call>call:'`` (llama.cpp's test);
* templates older than the official one (no ``{#- OpenAI Chat Completions:`` block) only know
  Gemma's own ``tool_responses`` field, so OpenAI ``role: "tool"`` messages are folded into the
  assistant message that made the calls (with the next plain assistant answer, if any);
* after rendering, a prompt that ends with a closed turn (``<turn|>\\n``) while a generation
  prompt was asked for gets ``<|turn>model\\n`` (the template omits it after content + calls).
"""

from __future__ import annotations

import copy
import json
from typing import Any

TEMPLATE_MARKER = "'<|tool_call>call:'"
OPENAI_AWARE_MARKER = "{#- OpenAI Chat Completions:"
TURN_END = "<turn|>\n"
MODEL_TURN = "<|turn>model\n"


def is_gemma4_template(source: str) -> bool:
    return TEMPLATE_MARKER in source


def needs_tool_response_folding(source: str) -> bool:
    return is_gemma4_template(source) and OPENAI_AWARE_MARKER not in source


def _has_tool_calls(msg: dict[str, Any]) -> bool:
    calls = msg.get("tool_calls")
    return isinstance(calls, list) and bool(calls)


def _has_content(msg: dict[str, Any]) -> bool:
    content = msg.get("content")
    return isinstance(content, (str, list)) and bool(content)


def _tool_response(msg: dict[str, Any], calls: list[Any], index: int) -> dict[str, Any]:
    """One `role: tool` message as a Gemma tool_responses entry: JSON content parsed when it
    parses, named after the call at the same position (else the message's tool_call_id)."""
    content = msg.get("content")
    response: Any = None
    if isinstance(content, str):
        try:
            response = json.loads(content)
        except json.JSONDecodeError:
            response = content
    elif content is not None:
        response = content
    name = ""
    if index < len(calls) and isinstance(calls[index], dict) and isinstance(calls[index].get("function"), dict):
        name = calls[index]["function"].get("name") or ""
    if not name:
        name = msg.get("tool_call_id") or ""
    return {"name": name, "response": response}


def fold_tool_responses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """assistant(tool_calls) → tool… → [assistant(content)] becomes one assistant message with
    `tool_calls`, `tool_responses` and that content (llama.cpp's convert_tool_responses_gemma4)."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg.get("role") != "assistant" or not _has_tool_calls(msg):
            out.append(msg)
            i += 1
            continue
        calls = list(msg["tool_calls"])
        folded: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
        if isinstance(msg.get("reasoning_content"), str):
            folded["reasoning_content"] = msg["reasoning_content"]
        i += 1
        responses = []
        while i < len(messages) and messages[i].get("role") == "tool":
            responses.append(_tool_response(messages[i], calls, len(responses)))
            i += 1
        if responses:
            folded["tool_responses"] = responses
        if i < len(messages) and messages[i].get("role") == "assistant":
            nxt = messages[i]
            if not _has_tool_calls(nxt) and _has_content(nxt):
                folded["content"] = copy.deepcopy(nxt["content"])
                i += 1
        folded.setdefault("content", "")
        out.append(folded)
    return out


def finish_prompt(text: str, add_generation_prompt: bool) -> str:
    """llama.cpp's fix-up: open the model's turn when the template left it closed."""
    if add_generation_prompt and text.endswith(TURN_END):
        return text + MODEL_TURN
    return text
