"""Chat templates: turn a list of chat messages into the prompt text the model was trained on.

GGUF files carry the Hugging Face `tokenizer.chat_template` Jinja source. We render it the way
`transformers` does (`ImmutableSandboxedEnvironment`, `trim_blocks`, `lstrip_blocks`, the
`loopcontrols` extension, a `tojson` filter that does not HTML-escape, the `raise_exception`
and `strftime_now` globals) so that a template written for HF produces the same text here.

Where llama.cpp's server deliberately deviates from plain HF rendering we follow llama.cpp,
because the runtime must produce the same tokens as llama.cpp (see `common/chat.cpp`):

* message `content` that is `None` becomes `""`, and a list of text parts is joined with
  `"\\n"` (llama.cpp's `concat_typed_text`) — unless the template renders typed parts
  itself (Gemma 4 does): then, as llama.cpp does, the parts reach it as a list;
* tool-call `arguments` given as a JSON string (the OpenAI wire format) are parsed into an
  object when the template renders object arguments as JSON (llama.cpp's
  `func_args_not_string` workaround), so templates such as Qwen's `arguments | tojson` do not
  double-encode them;
* BOS: llama.cpp's server renders the template, and if the vocabulary adds BOS by itself
  (`tokenizer.ggml.add_bos_token`) and the text starts with the BOS token text, it strips
  that text before tokenizing with `add_special=True, parse_special=True`.  That way a
  template that writes `{{ bos_token }}` and a tokenizer that adds BOS never give two BOS
  tokens.  `ChatTemplate.prompt_for_tokenizer` implements exactly that rule.
  (llama-cpp-python's `Jinja2ChatFormatter` instead never lets the tokenizer add BOS and
  relies on the template alone; the two agree whenever the template emits BOS iff the
  vocabulary wants one, which holds for the models we ship tests for.)

* `{{ none }}` prints nothing (llama.cpp's Jinja engine), not "None";
* `enable_thinking` is passed as True unless the caller sets it (llama-server's default);
* Gemma 4 templates get llama.cpp's Gemma 4 handling (`gemma4.py`): role:tool messages folded
  into `tool_responses` for the older templates, `<|turn>model\n` after a closed turn.

When the file has no template we fall back to a built-in one that reproduces llama.cpp's own
C++ formatter (`llama_chat_apply_template`) for that format: gemma's turn format for gemma
architectures, chatml otherwise.  The built-ins never emit BOS: the tokenizer adds it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TallowError
from . import gemma4
from .template_limits import BoundedEnvironment, render_bounded

__all__ = ["CHATML_TEMPLATE", "GEMMA_TEMPLATE", "ChatTemplate"]

# Same text as llama.cpp's CHATML_TEMPLATE_SRC (its fallback when a file has no template).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

# Reproduces llama.cpp's legacy LLM_CHAT_TEMPLATE_GEMMA formatter: system messages are trimmed,
# concatenated and prepended (plus a blank line) to the next non-model turn; "assistant" is
# called "model"; every content is trimmed of ASCII whitespace.  No BOS: the tokenizer adds it.
GEMMA_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}\n"
    "{%- for message in messages -%}\n"
    "  {%- if message['role'] == 'system' -%}\n"
    "    {%- set ns.system = ns.system + (message['content'] | tallow_ascii_trim) -%}\n"
    "  {%- else -%}\n"
    "    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n"
    "    {{- '<start_of_turn>' + role + '\\n' -}}\n"
    "    {%- if ns.system and role != 'model' -%}\n"
    "      {{- ns.system + '\\n\\n' -}}\n"
    "      {%- set ns.system = '' -%}\n"
    "    {%- endif -%}\n"
    "    {{- (message['content'] | tallow_ascii_trim) + '<end_of_turn>\\n' -}}\n"
    "  {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<start_of_turn>model\\n' -}}\n"
    "{%- endif -%}"
)

_ASCII_SPACE = (
    " \t\n\r\v\f"  # what C's isspace() accepts, i.e. what llama.cpp's trim() strips
)

# Probe used to learn whether a template renders tool-call arguments as a JSON object.
_PROBE_KEY = "tallow_probe_argument"
_PROBE_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Hello"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "probe", "arguments": {_PROBE_KEY: "x"}},
            }
        ],
    },
]


class _TemplateRaised(Exception):
    """Raised by the template's own `raise_exception(...)`: the template rejects the input."""


class _GenerationTag(jinja2.ext.Extension):
    """Pass-through for HF's `{% generation %}...{% endgeneration %}` (assistant-mask) tag.

    transformers registers an extension for it; without one, templates that use the tag
    would be syntax errors here.  For inference it only needs to render its body.
    """

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)  # the `generation` name token
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """HF's `tojson`: plain `json.dumps`, no HTML escaping (Jinja's own filter escapes `<>&'`)."""
    return json.dumps(
        x,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


def _none_is_empty(value: Any) -> Any:
    """`{{ x }}` with x None prints nothing, as llama.cpp's Jinja engine does (Python's prints
    "None"; Gemma 4 writes a null tool argument that way)."""
    return "" if value is None else value


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _ascii_trim(value: Any) -> str:
    return str(value).strip(_ASCII_SPACE)


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = BoundedEnvironment(  # the sandbox, plus time and size bounds (template_limits.py)
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        finalize=_none_is_empty,
    )
    env.filters["tojson"] = _tojson
    env.filters["tallow_ascii_trim"] = _ascii_trim
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _sentence(text: str) -> str:
    """Collapse an error message to one line that ends with exactly one period."""
    text = " ".join(str(text).split()).rstrip(".")
    return text + "."


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _TemplateRaised):
        return f"the chat template rejected the conversation: {exc}"
    if isinstance(exc, jinja2.UndefinedError):
        return f"the chat template used an undefined value ({exc})"
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return (
            f"the chat template has a syntax error at line {exc.lineno} ({exc.message})"
        )
    return f"the chat template failed to render ({type(exc).__name__}: {exc})"


def _token_text(tokens: Sequence[str] | None, token_id: Any) -> str:
    """The token's text, or "" when the id is missing — llama.cpp passes "" in that case too."""
    if tokens is None or not isinstance(token_id, int) or isinstance(token_id, bool):
        return ""
    if 0 <= token_id < len(tokens):
        return str(tokens[token_id])
    return ""


class ChatTemplate:
    """A compiled chat template plus the BOS/EOS strings it is rendered with."""

    def __init__(
        self,
        source: str,
        bos_token: str = "",
        eos_token: str = "",
        *,
        is_builtin: bool = False,
        name: str = "gguf",
    ) -> None:
        if not isinstance(source, str):
            raise TallowError("The chat template must be text.")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.is_builtin = is_builtin
        self.name = name
        try:
            self._template = _make_environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TallowError(
                _sentence(
                    f"The {name} chat template has a syntax error at "
                    f"line {exc.lineno}: {exc.message}"
                )
            ) from None
        self.is_gemma4 = gemma4.is_gemma4_template(source)
        self.supports_object_arguments = self._probe_object_arguments()
        self.supports_typed_content = self._probe_typed_content()
        self.template_adds_bos = self._probe_adds_bos()

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_gguf(cls, gf: Any, tokens: list[str] | None = None) -> ChatTemplate:
        """Build from a `GGUFFile`: its template if it has one, else a built-in by architecture.

        `tokens` are the vocabulary's token strings (to look up BOS/EOS text); when None they
        are read from `tokenizer.ggml.tokens`.
        """
        md = gf.metadata
        if tokens is None:
            tokens = md.get("tokenizer.ggml.tokens")
        bos = _token_text(tokens, md.get("tokenizer.ggml.bos_token_id"))
        eos = _token_text(tokens, md.get("tokenizer.ggml.eos_token_id"))
        source = md.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls(source, bos, eos, is_builtin=False, name="GGUF file's")
        arch = str(md.get("general.architecture", ""))
        if arch.startswith("gemma"):
            return cls(GEMMA_TEMPLATE, bos, eos, is_builtin=True, name="built-in gemma")
        return cls(CHATML_TEMPLATE, bos, eos, is_builtin=True, name="built-in chatml")

    # ---------------------------------------------------------------- rendering

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """Render the prompt text.  Extra keyword arguments (e.g. `enable_thinking`) become
        template variables, as with transformers' `apply_chat_template(**kwargs)`.

        `enable_thinking` is True unless given, as llama.cpp's server passes it (templates
        without a thinking switch ignore it; Qwen3 treats it like an absent one; Gemma 4 then
        writes `<|think|>` and lets the model open its thought channel).
        """
        msgs = self._normalize_messages(messages)
        if tools is not None and not (
            isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
        ):
            raise TallowError("Tools must be a list of JSON objects.")
        template_kwargs.setdefault("enable_thinking", True)
        if gemma4.needs_tool_response_folding(self.source):
            msgs = gemma4.fold_tool_responses(msgs)
        text = self._render(msgs, tools, add_generation_prompt, template_kwargs)
        return gemma4.finish_prompt(text, add_generation_prompt) if self.is_gemma4 else text

    def prompt_for_tokenizer(self, text: str, tokenizer_adds_bos: bool) -> str:
        """Apply llama.cpp's rule before tokenizing with add_special=True, parse_special=True.

        If the tokenizer is going to add BOS itself (`tokenizer.ggml.add_bos_token`) and the
        rendered text already starts with the BOS text, drop that text so BOS appears once.
        Otherwise the text is returned unchanged (a template-written BOS is then parsed as
        the special token).
        """
        if tokenizer_adds_bos and self.bos_token and text.startswith(self.bos_token):
            return text[len(self.bos_token) :]
        return text

    # ---------------------------------------------------------------- internals

    def _render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any],
    ) -> str:
        variables: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        variables.update(template_kwargs)
        variables["messages"] = messages
        variables["tools"] = tools
        variables["add_generation_prompt"] = bool(add_generation_prompt)
        try:
            return render_bounded(self._template, variables)
        except TallowError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template is user code: any failure is theirs
            text = _describe(exc)
            raise TallowError(_sentence(text[0].upper() + text[1:])) from None

    def _normalize_messages(self, messages: Any) -> list[dict[str, Any]]:
        """Check the shape of `messages` and convert to what llama.cpp hands its templates."""
        if not isinstance(messages, list):
            raise TallowError(
                "Messages must be a list of objects with a 'role' and 'content'."
            )
        out: list[dict[str, Any]] = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise TallowError(
                    f"Message {i} must be an object with a 'role' and 'content'."
                )
            role = message.get("role")
            if not isinstance(role, str) or not role:
                raise TallowError(
                    f"Message {i} needs a 'role' that is a non-empty string."
                )
            msg = copy.deepcopy(message)
            text = self._content_text(i, message.get("content"))
            parts = message.get("content")
            if self.supports_typed_content and isinstance(parts, list):
                msg["content"] = [p if isinstance(p, dict) else {"type": "text", "text": p} for p in copy.deepcopy(parts)]
            else:
                msg["content"] = text
            tool_calls = msg.get("tool_calls")
            if tool_calls is not None:
                if not isinstance(tool_calls, list):
                    raise TallowError(
                        f"Message {i} has 'tool_calls' that is not a list."
                    )
                if self.supports_object_arguments:
                    for call in tool_calls:
                        self._parse_arguments(i, call)
            out.append(msg)
        return out

    @staticmethod
    def _content_text(i: int, content: Any) -> str:
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts: list[str] = []
            for part in content:
                if isinstance(part, str):
                    texts.append(part)
                elif (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    texts.append(part["text"])
                else:
                    raise TallowError(
                        f"Message {i} has a content part that is not text; only text parts "
                        "are supported."
                    )
            return "\n".join(texts)
        raise TallowError(
            f"Message {i} has 'content' that is neither a string nor a list of parts."
        )

    @staticmethod
    def _parse_arguments(i: int, call: Any) -> None:
        if not isinstance(call, dict):
            raise TallowError(f"Message {i} has a tool call that is not an object.")
        fn = call.get("function", call)
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except json.JSONDecodeError:
                raise TallowError(
                    f"Message {i} has tool call arguments that are not valid JSON."
                ) from None

    def _probe_object_arguments(self) -> bool:
        """Does the template print `arguments` as JSON when given an object?  (llama.cpp's
        `supports_object_arguments` capability, found the same way: by rendering a probe.)"""
        try:
            text = self._render(copy.deepcopy(_PROBE_MESSAGES), None, False, {})
        except TallowError:
            return False
        if f'"{_PROBE_KEY}": "x"' in text or f'"{_PROBE_KEY}":"x"' in text:
            return True
        # Templates with their own argument syntax (Gemma 4's `key:<|"|>x<|"|>`) walk the
        # object too; a Python dict printed whole (`{'key': 'x'}`) does not count.
        return _PROBE_KEY in text and f"'{_PROBE_KEY}'" not in text

    def _probe_typed_content(self) -> bool:
        """Does the template render a list of text parts itself (llama.cpp's
        `supports_typed_content` with string content supported too)?  Found by rendering the
        parts: their text must come out, and not as the printed list (`[{'type': ...}]`)."""
        marker = "tallow_probe_text"
        try:
            typed = self._render([{"role": "user", "content": [{"type": "text", "text": marker}]}], None, True, {})
            plain = self._render([{"role": "user", "content": marker}], None, True, {})
        except TallowError:
            return False
        return marker in typed and marker in plain and "'type'" not in typed and '"type"' not in typed

    def _probe_adds_bos(self) -> bool:
        """Does the rendered text start with the BOS token text?

        Checked on output, not on whether the source mentions `bos_token`, because that is
        the condition llama.cpp's strip rule looks at (and a template may also start with a
        literal that equals BOS, as SmolLM2's `<|im_start|>` does).
        """
        if not self.bos_token:
            return False
        try:
            text = self._render([{"role": "user", "content": "Hello"}], None, True, {})
        except TallowError:
            return False
        return text.startswith(self.bos_token)

    def __repr__(self) -> str:
        kind = "builtin" if self.is_builtin else "gguf"
        return f"ChatTemplate({self.name!r}, {kind}, bos={self.bos_token!r}, eos={self.eos_token!r})"
