"""One stderr line per HTTP request: method, path, status, tokens and time.

    [tallow] POST /v1/chat/completions 200 31+64 tok 1.92 s

A plain ASGI wrapper rather than Starlette's BaseHTTPMiddleware, which wraps `receive` and
then hides a client's disconnect from the handlers. The tokens (prompt+completion) are what
the handler left in the request's state (`tallow_usage`); `-` when it generated nothing.
With `verbose`, the client's address, the reused prompt tokens and the decode speed follow.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class RequestLog:
    def __init__(self, app: Any, verbose: bool = False, stream: TextIO | None = None) -> None:
        self.app = app
        self.verbose = verbose
        self.stream = stream

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope.setdefault("state", {})
        status = [0]
        t0 = time.perf_counter()

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self._write(scope, status[0], time.perf_counter() - t0)

    def _write(self, scope: dict, status: int, seconds: float) -> None:
        state = scope.get("state") or {}
        usage = state.get("tallow_usage")
        tokens = f"{usage['prompt_tokens']}+{usage['completion_tokens']} tok" if usage else "- tok"
        line = f"[tallow] {scope.get('method', '?')} {scope.get('path', '?')} {status or '-'} {tokens} {seconds:.2f} s"
        if self.verbose:
            client = scope.get("client")
            timings = state.get("tallow_timings") or {}
            line += f" | client {client[0]}:{client[1]}" if client else ""
            if timings:
                line += f" | reused {timings.get('cache_n', 0)} | {timings.get('predicted_per_second', 0):.1f} tok/s"
        print(line, file=self.stream or sys.stderr, flush=True)
