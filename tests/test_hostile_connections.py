"""Slow or idle clients are dropped after the read timeout, /health keeps answering, and a
worker that stops making progress shows on /health as a 503 (no model needed: a fake LLM)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from server_utils import free_port


class HangingLLM:
    """Hangs in tokenize until released, like a template or a kernel that never returns."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.n_ctx = 64

    def tokenize(self, text):
        self.release.wait(30)
        from tallow.errors import UsageError

        raise UsageError("released")


@pytest.fixture()
def server(monkeypatch):
    import uvicorn

    from tallow.server.app import ServerState, create_app
    from tallow.server.read_timeout import ReadTimeoutProtocol
    from tallow.server.worker import Worker

    monkeypatch.setenv("TALLOW_READ_TIMEOUT", "1")
    monkeypatch.setenv("TALLOW_STALL_TIMEOUT", "1")
    llm = HangingLLM()
    worker = Worker(lambda: llm, max_queue=2)
    app = create_app(ServerState(worker, "fake", None, None))
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http=ReadTimeoutProtocol, timeout_graceful_shutdown=1))
    worker.start()
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.02)
    worker.ready.wait(10)
    yield f"http://127.0.0.1:{port}", port, llm
    llm.release.set()
    worker.stop()
    srv.should_exit = True
    thread.join(5)


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_idle_and_slow_clients_are_dropped_and_health_answers(server):
    url, port, _ = server
    partial = [b"", b"GET /hea", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
               b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pro"]
    socks = []
    for i in range(200):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(partial[i % len(partial)])
        socks.append(s)
    try:
        t0 = time.monotonic()
        r = httpx.get(url + "/health", timeout=5)
        assert r.status_code == 200 and time.monotonic() - t0 < 1.0, r.text
        time.sleep(1.2)
        # Every one of them is closed by the server (the timeout is 1 s here); 4 s of slack for a busy machine.
        assert all(closed_by_server(s, 4) for s in socks)
        assert httpx.get(url + "/health", timeout=5).status_code == 200
    finally:
        for s in socks:
            s.close()


def test_a_request_being_answered_is_not_cut_by_the_read_timeout(server):
    """The deadline covers reading the request, not generating the answer: this one is read at
    once and then waits on the hung worker past the read timeout; it gets its answer."""
    url, _, llm = server
    threading.Timer(1.5, llm.release.set).start()
    r = httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["message"] == "released"


def test_a_stuck_worker_makes_health_503_with_a_reason(server):
    url, _, llm = server
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=20)))
    t.start()
    time.sleep(1.6)
    r = httpx.get(url + "/health", timeout=5)
    assert r.status_code == 503 and r.json()["status"] == "stuck", r.text
    assert "no progress" in r.json()["error"] and "TALLOW_STALL_TIMEOUT" in r.json()["error"]
    llm.release.set()
    t.join(10)
    assert result["r"].status_code == 400
    assert httpx.get(url + "/health", timeout=5).status_code == 200
