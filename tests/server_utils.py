"""A live tallow server in a background thread, for tests that speak HTTP to it."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Any


from model_paths import require_model  # noqa: F401  (re-exported for the server tests)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving `create_app` on a free loopback port; `stop()` shuts it down."""

    def __init__(self, loader: Any, model_id: str, model_file: str | None = None, queue: int = 4, api_key: str | None = None,
                 limits: Any = None) -> None:
        import uvicorn

        from tallow.server.app import ServerState, create_app
        from tallow.server.worker import Worker

        self.worker = Worker(loader, max_queue=queue, limits=limits)
        self.state = ServerState(self.worker, model_id, model_file, api_key)
        self.app = create_app(self.state)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=1))
        self.worker.start()
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def wait_ready(self, timeout: float = 120) -> None:
        if not self.worker.ready.wait(timeout):
            raise RuntimeError(f"the model did not load: {self.worker.load_error}")

    def stop(self) -> None:
        self.worker.stop()
        self.server.should_exit = True
        self.thread.join(10)


@contextmanager
def serve_model(model_id: str, ctx: int, timeout: float = 120):
    """A live server on the real model `model_id` and an openai client for it (the model must
    exist: require_model skips or fails the test otherwise)."""
    import openai

    import tallow

    path = require_model(model_id)
    server = LiveServer(lambda: tallow.LLM(path, ctx=ctx), model_id, str(path))
    try:
        server.wait_ready(timeout)
        yield server, openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=timeout)
    finally:
        server.stop()


def streamed_tool_calls(chunks) -> list[dict[str, Any]]:
    """The calls of a streamed chat answer (openai chunk objects), put together as a client does,
    checking OpenAI's shape on the way: a call's first delta has its id, type and name, the
    next ones only `arguments` pieces; indexes start at 0 and come in order."""
    calls: list[dict[str, Any]] = []
    for chunk in chunks:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if tc.id is not None:
                assert tc.index == len(calls) and tc.type == "function" and tc.function.name, tc
                calls.append({"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or "", "pieces": 0})
            else:
                assert tc.index == len(calls) - 1 and tc.function.name is None, tc
                calls[-1]["arguments"] += tc.function.arguments
                calls[-1]["pieces"] += 1
    return calls
