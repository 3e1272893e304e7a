"""Limits a server operator sets with `tallow serve` flags, and the checks that enforce them.

    --max-body 8MiB          a larger request body is refused with 413, before it is read whole
    --max-prompt-tokens N    a longer prompt is refused with 400 (context_length_exceeded)
    --max-tokens N           no answer is longer: a request asking for more is cut to N (llama.cpp's -n)
    --timeout S              a request still queued after S s gets 503 + Retry-After; one generating
                             is ended there with finish_reason "length" (llama.cpp's t_max_predict_ms)
    --queue N                (worker.py) more waiting requests get 503 + Retry-After

Every refusal is an OpenAI-shaped error that names the flag, so a client's log says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

from .protocol import APIError

DEFAULT_MAX_BODY = 8 << 20  # 8 MiB: a long conversation with tool results, with room to spare


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = DEFAULT_MAX_BODY
    max_prompt_tokens: int | None = None  # None: the context decides
    max_output_tokens: int | None = None  # None: what the context leaves
    request_timeout_s: float | None = None  # None: no limit

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_prompt_tokens", "max_output_tokens", "request_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, not {value!r}")


def body_too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server accepts ({limit} bytes; `tallow serve --max-body`).",
                    "invalid_request_error", None, "body_too_large")


async def read_body(request, limit: int) -> bytes:
    """The request body, refusing it (413) as soon as it is known to exceed `limit` bytes: from its
    Content-Length before reading anything, else while it streams in, never holding more than limit."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    from starlette.requests import ClientDisconnect

    chunks, total = [], 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise body_too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:  # gone, or dropped by the read timeout (read_timeout.py)
        raise APIError(408, "The request body did not arrive in time.", "invalid_request_error", None, "request_timeout") from None
    return b"".join(chunks)


def prompt_too_long(n_prompt: int, limit: int, param: str) -> APIError:
    return APIError(400, f"The prompt has {n_prompt} tokens; this server accepts at most {limit} (`tallow serve --max-prompt-tokens`).",
                    "invalid_request_error", param, "context_length_exceeded")


def queued_too_long(timeout_s: float) -> APIError:
    return APIError(503, f"The request waited {timeout_s:g} s for the engine without starting (`tallow serve --timeout`); retry later.",
                    "server_error", None, "timeout", {"Retry-After": "1"})
