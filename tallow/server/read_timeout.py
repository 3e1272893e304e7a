"""Connections that do not send a whole request in time are dropped.

uvicorn's keep-alive timeout only starts after a response: a client that connects and sends
nothing, half a request line, part of its headers or a body slower than promised keeps a
socket (and a file descriptor) forever, and enough of them starve `/health` of descriptors.
Here every request — request line, headers and body — must arrive within READ_TIMEOUT_S of
the connection opening (or of the previous response on a kept-alive connection); otherwise the
connection is closed. Time spent generating the answer does not count: by then the request
has been read.

TALLOW_READ_TIMEOUT=SECONDS changes the bound (default 30).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .. import switches



def read_timeout_s() -> float:
    return switches.value("TALLOW_READ_TIMEOUT")


class ReadTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for reading each request."""

    read_timeout: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.read_timeout is not None:
            self.read_timeout.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self.read_timeout is not None:
            self.read_timeout.cancel()
        self.read_timeout = self.loop.call_later(read_timeout_s(), self._expire)

    def _expire(self) -> None:
        # IDLE: the request line and headers are not all in; SEND_BODY: the body is not.
        if self.transport.is_closing() or self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            return
        self.transport.close()
