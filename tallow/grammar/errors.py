"""The one error a grammar request can cause, with the request field to blame."""

from __future__ import annotations

from ..errors import UsageError


class GrammarError(UsageError):
    """A grammar, schema or tool definition the engine cannot constrain to (the server's 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


MESSAGE_LIMIT = 300


def engine_message(error: object) -> str:
    """The engine's message as one clause: its first line (later lines draw a caret under the
    source), without a final period so it can end our sentence."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    first = (lines[0] if lines else "unknown error").rstrip(".")
    # Capped: the engine's first line can quote the whole grammar (and a grammar can be large).
    return first if len(first) <= MESSAGE_LIMIT else first[:MESSAGE_LIMIT] + "…"
