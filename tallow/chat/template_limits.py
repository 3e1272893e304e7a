"""Time and size bounds on rendering a chat template, which is code from the model file.

The sandbox (ImmutableSandboxedEnvironment) already stops templates from reaching Python's
internals (`''.__class__.__mro__`…) or mutating their inputs. It does not stop a template from
running forever (`range` loops nested three deep are 10^15 steps) or from building a huge
string (`'x' * 10**10`, `9 ** 9 ** 9`), and either would stall or kill the one worker thread
that serves every request. So:

- `*`, `**` and `+` are checked before they run: no string or list over MAX_VALUE_CHARS, no
  integer power over MAX_POWER_DIGITS digits;
- the rendered text is bounded by MAX_OUTPUT_CHARS;
- the render is bounded in time (TALLOW_TEMPLATE_TIMEOUT, default 5 s; real templates take
  milliseconds): past it, a TemplateLimitError is raised inside the rendering thread (the
  pure-Python loops of a compiled template check for it between bytecodes).

Each refusal is a TallowError of one sentence (the server's 400).
"""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TallowError
from .. import switches

MAX_VALUE_CHARS = 1 << 20  # one string or list built by `*` or `+`
MAX_OUTPUT_CHARS = 4 << 20  # the rendered prompt (the context bounds it long before)
MAX_POWER_DIGITS = 1000


class TemplateLimitError(TallowError):
    """A chat template ran too long or built too much."""


def template_timeout_s() -> float:
    return switches.value("TALLOW_TEMPLATE_TIMEOUT")


def _size(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else None


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                size = _size(seq)
                if size is not None and isinstance(n, int) and size * n > MAX_VALUE_CHARS:
                    raise TemplateLimitError(f"The chat template builds a value of {size * n} items; the limit is {MAX_VALUE_CHARS}.")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                digits = right * math.log10(abs(left))
                if digits > MAX_POWER_DIGITS:
                    raise TemplateLimitError(f"The chat template computes a number of about {digits:.0f} digits; the limit is {MAX_POWER_DIGITS}.")
        elif operator == "+":
            a, b = _size(left), _size(right)
            if a is not None and b is not None and a + b > MAX_VALUE_CHARS:
                raise TemplateLimitError(f"The chat template builds a value of {a + b} items; the limit is {MAX_VALUE_CHARS}.")
        return super().call_binop(context, operator, left, right)


def render_bounded(template: Any, variables: dict[str, Any]) -> str:
    """`template.render(**variables)` within MAX_OUTPUT_CHARS and the time limit."""
    thread_id = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}
    limit = template_timeout_s()

    def expire() -> None:
        with lock:
            if not state["done"]:
                state["fired"] = True
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(_Timeout))

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    try:
        try:
            timer.start()
            parts, total = [], 0
            for chunk in template.generate(**variables):
                total += len(chunk)
                if total > MAX_OUTPUT_CHARS:
                    raise TemplateLimitError(f"The chat template's output passed the limit of {MAX_OUTPUT_CHARS} characters.")
                parts.append(chunk)
            return "".join(parts)
        finally:
            with lock:
                state["done"] = True
            timer.cancel()
    except _Timeout:
        raise TemplateLimitError(f"The chat template ran longer than {limit:g} s (TALLOW_TEMPLATE_TIMEOUT) and was stopped.") from None


class _Timeout(BaseException):
    """Raised asynchronously inside the rendering thread; BaseException so that no `except
    Exception` inside the template machinery swallows it."""
