"""Who may talk to the server: Host headers (DNS rebinding), JSON content types, body size.

A key-less server on loopback is reachable from any web page the user opens: a cross-site
"simple" POST (text/plain, a form) needs no CORS preflight, and DNS rebinding points a
hostile name at 127.0.0.1 so the page may even read the answers. So, as plain ASGI (not
Starlette's BaseHTTPMiddleware, which hides client disconnects from the handlers):

- served on a loopback address, only loopback Host headers are answered (`localhost`,
  `127.0.0.1`, `[::1]`, any port) unless TALLOW_ALLOWED_HOSTS lists more names
  (comma-separated; `*` allows any): others get a 403;
- a POST whose Content-Type is not JSON (`application/json`, `application/*+json`) gets a
  415 — a browser cannot send JSON cross-site without a preflight, which this server never
  grants (no CORS headers); a POST with no Content-Type at all (curl without -H) is allowed;
- a body that announces more than MAX_BODY_BYTES gets a 413 before it is read.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from .protocol import MAX_BODY_BYTES
from .. import switches

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts() -> set[str]:
    extra = switches.value("TALLOW_ALLOWED_HOSTS")
    return {h.strip().lower() for h in extra.split(",") if h.strip()}


def host_name(header: str) -> str:
    """`name:port`, `[v6]:port` -> the name, lower-case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class AccessGuard:
    """ASGI middleware applying the rules above before any route runs."""

    def __init__(self, app: Any, bound_host: str = "127.0.0.1", max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body = max_body  # `tallow serve --max-body`
        self.check_host = is_loopback(bound_host) or bound_host == "localhost"

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                await _send_error(send, *refusal)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: dict) -> tuple[int, str, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.check_host and "host" in headers:
            name = host_name(headers["host"])
            extra = allowed_hosts()
            if not (is_loopback(name) or name in extra or "*" in extra):
                return 403, f"This server answers only loopback Host headers, not {name[:100]!r}; set TALLOW_ALLOWED_HOSTS to allow other names.", "host_not_allowed"
        if scope.get("method") == "POST":
            kind = headers.get("content-type")
            if kind is not None and not is_json_type(kind):
                return 415, f"The request body must be JSON (Content-Type: application/json), not {kind[:100]!r}.", "unsupported_media_type"
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > self.max_body:
                return 413, f"The request body is {int(length)} bytes; the limit is {self.max_body} (`tallow serve --max-body`).", "body_too_large"
        return None


async def _send_error(send: Any, status: int, message: str, code: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
