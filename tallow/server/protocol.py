"""The OpenAI wire protocol: request validation into plain dataclasses, and error bodies.

Requests are validated here by hand rather than by pydantic models because the errors must
be OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`) with one clear sentence
that names the offending field, and because the rules are OpenAI's, not Python's: unknown
fields are ignored (clients send vendor extras), while fields we know but cannot honour
(n > 1, logit_bias, audio…) are rejected with a 400 instead of being
silently dropped — a client that asked for them would otherwise get a wrong answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["APIError", "ChatRequest", "CompletionRequest", "parse_chat_request", "parse_completion_request", "parse_json_body"]

VALID_ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An error answered to the client as an OpenAI-shaped JSON body with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


@dataclass
class Common:
    """Fields shared by chat and text completions."""

    model: str | None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    conversation_id: str | None = None  # selects the persistent KV cache (only conversation_id, never user)
    logprobs: int | None = None  # alternatives per token to report; None: no logprobs
    response_format: dict[str, Any] | None = None  # checked in depth when its grammar is compiled
    grammar: str | None = None  # a raw Lark or GBNF grammar (llama.cpp's server field)


@dataclass
class ChatRequest(Common):
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools or []]


@dataclass
class CompletionRequest(Common):
    prompt: str | list[int] = ""
    skip_special_tokens: bool = True  # False: special tokens stay in the text (vLLM's field name)


# --------------------------------------------------------------------------- type checks


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")


def _get_bool(body: dict, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"'{key}' must be a boolean, not {_type_name(value)}.", key, "invalid_type")
    return value


def _get_int(body: dict, key: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad(f"'{key}' must be an integer, not {_type_name(value)}.", key, "invalid_type")
    if lo is not None and value < lo:
        raise bad(f"'{key}' must be at least {lo}, not {value}.", key, "invalid_value")
    if hi is not None and value > hi:
        raise bad(f"'{key}' must be at most {hi}, not {value}.", key, "invalid_value")
    return value


def _get_float(body: dict, key: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise bad(f"'{key}' must be a number, not {_type_name(value)}.", key, "invalid_type")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise bad(f"'{key}' must be a finite number.", key, "invalid_value")
    if lo is not None and (value < lo or (lo_open and value == lo)):
        raise bad(f"'{key}' must be {'greater than' if lo_open else 'at least'} {lo:g}, not {value:g}.", key, "invalid_value")
    if hi is not None and value > hi:
        raise bad(f"'{key}' must be at most {hi:g}, not {value:g}.", key, "invalid_value")
    return value


MAX_BODY_BYTES = 8 << 20  # a request body (the context bounds a prompt long before this)
MAX_JSON_DEPTH = 100  # nested arrays/objects in a body (a JSON schema inside may nest 64, grammar/limits.py)
MAX_ID_CHARS = 256  # conversation_id and model names
_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@+=~-")


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why it is not one.

    Nesting is bounded (Python's parser and every walker after it recurse: 1,000 levels were a
    500) and strings must be valid Unicode (a lone surrogate, legal in JSON's \\u escapes, cannot
    be tokenized or written to a file)."""
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"The request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES}.", "invalid_request_error", None, "body_too_large")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad(f"The request body is not valid JSON ({exc}).", None, "invalid_json") from None
    except RecursionError:
        raise bad(f"The request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels.", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad(f"The request body must be a JSON object, not {_type_name(body)}.", None, "invalid_json")
    _check_tree(body)
    return body


def _check_tree(body: Any) -> None:
    """Depth and valid Unicode over the whole body, iteratively (no recursion to overflow)."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _check_unicode(node)
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise bad(f"The request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels.", None, "invalid_json")
        if isinstance(node, dict):
            for key, value in node.items():
                _check_unicode(key)
                stack.append((value, depth + 1))
        else:
            stack.extend((v, depth + 1) for v in node)


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad("The request body holds a string with a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which is not text.", None, "invalid_json") from None


def check_id(value: Any, key: str) -> str | None:
    """conversation_id: it names a file in the cache (hashed, so never a path), and is kept in that
    file's header; bounded and plain so nothing hostile is stored or echoed."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad(f"'{key}' must be a string, not {_type_name(value)}.", key, "invalid_type")
    if not value or len(value) > MAX_ID_CHARS:
        raise bad(f"'{key}' must be 1 to {MAX_ID_CHARS} characters long, not {len(value)}.", key, "invalid_value")
    if not set(value) <= _ID_CHARS or value.strip(".") == "":
        raise bad(f"'{key}' may hold only letters, digits and . _ : @ + = ~ - (and not only dots).", key, "invalid_value")
    return value


def check_model_name(value: Any) -> str | None:
    """A model name is only compared with the served model's names, never opened; still, names
    that look like paths (../, absolute, NUL) or are huge are refused outright."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad(f"'model' must be a string, not {_type_name(value)}.", "model", "invalid_type")
    if not value or len(value) > MAX_ID_CHARS:
        raise bad(f"'model' must be 1 to {MAX_ID_CHARS} characters long, not {len(value)}.", "model", "invalid_value")
    parts = value.replace("\\", "/").split("/")
    if value.startswith(("/", "\\", "~")) or ".." in parts or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise bad("'model' must be a model name, not a path.", "model", "invalid_value")
    return value


# --------------------------------------------------------------------------- shared fields


def _reject_unsupported(body: dict[str, Any], endpoint: str) -> None:
    """Known OpenAI fields we cannot honour: a 400 naming them, never a silent drop."""
    n = _get_int(body, "n", lo=1)
    if n is not None and n > 1:
        raise bad("'n' greater than 1 is not supported: this server generates one choice per request.", "n", "unsupported_value")
    if body.get("logit_bias"):
        raise bad("'logit_bias' is not supported by this server.", "logit_bias", "unsupported_parameter")
    for key in ("audio", "prediction", "functions", "function_call", "web_search_options", "reasoning_effort"):
        if body.get(key) is not None:
            raise bad(f"'{key}' is not supported by this server.", key, "unsupported_parameter")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad("Only the 'text' modality is supported.", "modalities", "unsupported_value")
    if endpoint == "completion":
        if _get_bool(body, "echo", False):
            raise bad("'echo' is not supported by this server.", "echo", "unsupported_parameter")
        if body.get("suffix") is not None:
            raise bad("'suffix' (fill-in-the-middle) is not supported by this server.", "suffix", "unsupported_parameter")
        best_of = _get_int(body, "best_of", lo=1)
        if best_of is not None and best_of > 1:
            raise bad("'best_of' greater than 1 is not supported.", "best_of", "unsupported_value")


def _get_logprobs(body: dict[str, Any], endpoint: str) -> int | None:
    """Chat: `logprobs: true` plus `top_logprobs` 0-20. Completions: `logprobs` 0-5 (the
    number of alternatives, OpenAI's legacy form)."""
    if endpoint == "chat":
        top = _get_int(body, "top_logprobs", lo=0)
        if top is not None and top > 20:
            raise bad(f"'top_logprobs' must be at most 20, not {top}.", "top_logprobs", "invalid_value")
        if not _get_bool(body, "logprobs", False):
            if top is not None:
                raise bad("'top_logprobs' needs 'logprobs': true.", "top_logprobs", "invalid_value")
            return None
        return top or 0
    k = _get_int(body, "logprobs", lo=0)
    if k is not None and k > 5:
        raise bad(f"'logprobs' must be at most 5 for completions, not {k}.", "logprobs", "invalid_value")
    return k


# Logits are divided by the temperature and scaled by the repeat penalty: 1e-300 overflows them
# to inf and the probabilities to NaN (a 500). 0.001 is far below any useful setting.
MIN_DIVISOR = 1e-3


def _common(body: dict[str, Any], endpoint: str, req: Common) -> None:
    req.model = check_model_name(body.get("model"))
    _reject_unsupported(body, endpoint)
    req.logprobs = _get_logprobs(body, endpoint)
    rf = body.get("response_format")
    if rf is not None and (not isinstance(rf, dict) or not isinstance(rf.get("type"), str)):
        raise bad("'response_format' must be an object with a 'type' (text, json_object or json_schema).", "response_format", "invalid_type")
    req.response_format = rf
    grammar = body.get("grammar")
    if grammar is not None and (not isinstance(grammar, str) or not grammar.strip()):
        raise bad("'grammar' must be a non-empty string (Lark, or GBNF with a 'root' rule).", "grammar", "invalid_type")
    req.grammar = grammar
    req.stream = _get_bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad(f"'stream_options' must be an object, not {_type_name(opts)}.", "stream_options", "invalid_type")
        req.include_usage = _get_bool(opts, "include_usage", False)
    limit = _get_int(body, "max_tokens", lo=1)
    if endpoint == "chat":
        newer = _get_int(body, "max_completion_tokens", lo=1)
        limit = newer if newer is not None else limit
    req.max_tokens = limit
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is None:
        stop = []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad("'stop' must be a string or an array of strings.", "stop", "invalid_type")
    if any(s == "" for s in stop):
        raise bad("'stop' strings must not be empty.", "stop", "invalid_value")
    req.stop = stop
    sampling: dict[str, Any] = {}
    for key, lo, hi, lo_open in (
        ("temperature", 0.0, None, False),
        ("top_p", 0.0, 1.0, False),
        ("min_p", 0.0, 1.0, False),
        ("presence_penalty", -2.0, 2.0, False),
        ("frequency_penalty", -2.0, 2.0, False),
        ("repeat_penalty", MIN_DIVISOR, 1 / MIN_DIVISOR, False),
    ):
        value = _get_float(body, key, lo, hi, lo_open)
        if value is not None:
            sampling[key] = value
    if 0 < sampling.get("temperature", 0) < MIN_DIVISOR:
        raise bad(f"'temperature' must be 0 (greedy) or at least {MIN_DIVISOR:g}, not {sampling['temperature']:g}.", "temperature", "invalid_value")
    top_k = _get_int(body, "top_k", lo=0)
    if top_k is not None:
        sampling["top_k"] = top_k
    seed = _get_int(body, "seed")
    if seed is not None:
        sampling["seed"] = seed % 2**64  # OpenAI allows negative int64 seeds
    req.sampling = sampling
    user = body.get("user")  # OpenAI's end-user tag: checked, otherwise unused (it never saves KV to disk)
    if user is not None and not isinstance(user, str):
        raise bad(f"'user' must be a string, not {_type_name(user)}.", "user", "invalid_type")
    req.conversation_id = check_id(body.get("conversation_id"), "conversation_id")


# --------------------------------------------------------------------------- chat


def _check_content(i: int, message: dict[str, Any], required: bool) -> None:
    content = message.get("content")
    param = f"messages[{i}].content"
    if content is None:
        if required:
            raise bad(f"Message {i} ({message['role']}) needs 'content'.", param, "missing_required_parameter")
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise bad(f"Message {i} has 'content' that is {_type_name(content)}; it must be a string or an array of content parts.", param, "invalid_type")
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise bad(f"Content part {j} of message {i} must be an object with a 'type'.", f"{param}[{j}]", "invalid_type")
        if part["type"] != "text":
            raise bad(f"Content part {j} of message {i} is of type '{part['type']}'; only text parts are supported.", f"{param}[{j}].type", "unsupported_value")
        if not isinstance(part.get("text"), str):
            raise bad(f"Content part {j} of message {i} needs 'text' that is a string.", f"{param}[{j}].text", "invalid_type")


def _check_tool_calls(i: int, message: dict[str, Any], known_ids: set[str]) -> None:
    calls = message.get("tool_calls")
    if calls is None:
        return
    param = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise bad(f"Message {i} has 'tool_calls' that is {_type_name(calls)}, not an array.", param, "invalid_type")
    for j, call in enumerate(calls):
        p = f"{param}[{j}]"
        if not isinstance(call, dict):
            raise bad(f"Tool call {j} of message {i} must be an object.", p, "invalid_type")
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise bad(f"Tool call {j} of message {i} needs an 'id' that is a non-empty string.", f"{p}.id", "invalid_value")
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"Tool call {j} of message {i} needs a 'function' with a 'name'.", f"{p}.function", "invalid_value")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                json.loads(args)
            except json.JSONDecodeError:
                raise bad(f"Tool call {j} of message {i} has 'arguments' that are not valid JSON.", f"{p}.function.arguments", "invalid_value") from None
        elif args is not None and not isinstance(args, dict):
            raise bad(f"Tool call {j} of message {i} has 'arguments' that are neither a JSON string nor an object.", f"{p}.function.arguments", "invalid_type")
        known_ids.add(call["id"])


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise bad("'messages' is required.", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise bad(f"'messages' must be an array, not {_type_name(messages)}.", "messages", "invalid_type")
    if not messages:
        raise bad("'messages' must contain at least one message.", "messages", "empty_array")
    known_ids: set[str] = set()
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad(f"Message {i} must be an object, not {_type_name(message)}.", f"messages[{i}]", "invalid_type")
        role = message.get("role")
        if role not in VALID_ROLES:
            raise bad(f"Message {i} has role {role!r}; valid roles are {', '.join(VALID_ROLES)}.", f"messages[{i}].role", "invalid_value")
        msg = dict(message)
        if role == "developer":  # OpenAI's new name for system; templates know "system"
            msg["role"] = "system"
        _check_content(i, msg, required=role != "assistant")
        if role == "assistant":
            _check_tool_calls(i, msg, known_ids)
        elif message.get("tool_calls") is not None:
            raise bad(f"Message {i} is a {role} message and cannot carry 'tool_calls'.", f"messages[{i}].tool_calls", "invalid_value")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad(f"Message {i} (tool) needs a 'tool_call_id'.", f"messages[{i}].tool_call_id", "missing_required_parameter")
            if call_id not in known_ids:
                raise bad(f"Message {i} answers tool call {call_id!r}, which no earlier assistant message made.", f"messages[{i}].tool_call_id", "invalid_value")
        out.append(msg)
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad(f"'tools' must be an array, not {_type_name(tools)}.", "tools", "invalid_type")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise bad(f"Tool {i} must be an object of type 'function'.", p, "invalid_value")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"Tool {i} needs a 'function' with a 'name'.", f"{p}.function", "invalid_value")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"Tool {i} has 'parameters' that are not a JSON schema object.", f"{p}.function.parameters", "invalid_type")
        if fn["name"] in names:
            raise bad(f"Tool name {fn['name']!r} is declared twice.", f"{p}.function.name", "invalid_value")
        names.add(fn["name"])
    return tools or None


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> str | dict[str, Any]:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad(f"'tool_choice' must be 'auto', 'none', 'required' or a named function, not {choice!r}.", "tool_choice", "invalid_value")
        if choice == "required" and not tools:
            raise bad("'tool_choice' is 'required' but no 'tools' were given.", "tool_choice", "invalid_value")
        return choice
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict) and isinstance(choice["function"].get("name"), str):
        name = choice["function"]["name"]
        if name not in [t["function"]["name"] for t in tools or []]:
            raise bad(f"'tool_choice' names function {name!r}, which is not among the declared tools.", "tool_choice", "invalid_value")
        return choice
    raise bad("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": …}}.", "tool_choice", "invalid_type")


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    """A validated chat completion request, or an APIError (400) naming the bad field."""
    req = ChatRequest(model=None)
    _common(body, "chat", req)
    req.messages = _messages(body)
    req.tools = _tools(body)
    req.tool_choice = _tool_choice(body, req.tools)
    req.parallel_tool_calls = _get_bool(body, "parallel_tool_calls", True)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise bad(f"'chat_template_kwargs' must be an object, not {_type_name(kwargs)}.", "chat_template_kwargs", "invalid_type")
        for reserved in ("messages", "tools", "add_generation_prompt", "assistant_prefix"):
            if reserved in kwargs:
                raise bad(f"'chat_template_kwargs' cannot set {reserved!r}.", "chat_template_kwargs", "invalid_value")
        req.template_kwargs = dict(kwargs)
    return req


# --------------------------------------------------------------------------- completions


def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    """A validated text completion request: one prompt (text or token ids)."""
    req = CompletionRequest(model=None)
    _common(body, "completion", req)
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("'prompt' is required.", "prompt", "missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, (str, list)) for p in prompt):
            raise bad("Only one prompt per request is supported.", "prompt", "unsupported_value")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise bad("'prompt' must be a string or an array of token ids.", "prompt", "invalid_type")
    elif not isinstance(prompt, str):
        raise bad(f"'prompt' must be a string or an array of token ids, not {_type_name(prompt)}.", "prompt", "invalid_type")
    if len(prompt) == 0:
        raise bad("'prompt' must not be empty.", "prompt", "invalid_value")
    req.prompt = prompt
    req.skip_special_tokens = _get_bool(body, "skip_special_tokens", True)
    return req
