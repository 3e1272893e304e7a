"""File descriptors: as many as the system lets us have, and one log line when they run out.

Every open connection is a descriptor. At the soft limit (often 1,024) accept() fails, and
asyncio logs a full traceback for every failed accept — measured: 10,195 tracebacks (5 MB of
log) in 8 s with 67 idle connections under `ulimit -n 100`. The server raises its soft limit
to the hard one at start, and the repeats of that one message are summarized (one line per
ACCEPT_LOG_EVERY_S with a count). Idle connections are closed by the read timeout
(read_timeout.py), which is what frees the descriptors.
"""

from __future__ import annotations

import logging
import time

ACCEPT_LOG_EVERY_S = 10.0


def raise_fd_limit() -> None:
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass


class AcceptErrorSummary(logging.Filter):
    """Lets one 'out of system resource' accept error through per interval, with a count."""

    def __init__(self) -> None:
        super().__init__()
        self.last = float("-inf")
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "socket.accept() out of system resource" not in record.getMessage():
            return True
        now = time.monotonic()
        if now - self.last < ACCEPT_LOG_EVERY_S:
            self.suppressed += 1
            return False
        record.msg = f"tallow: cannot accept connections: out of file descriptors (ulimit -n); {self.suppressed} more such errors in the last {ACCEPT_LOG_EVERY_S:g} s"
        record.args = ()
        record.exc_info = None
        record.exc_text = None
        self.last, self.suppressed = now, 0
        return True


def quiet_accept_errors() -> None:
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, AcceptErrorSummary) for f in logger.filters):
        logger.addFilter(AcceptErrorSummary())
