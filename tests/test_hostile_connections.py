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


FD_CHILD = """
import resource, sys, threading, time
sys.path.insert(0, {root!r})
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
import uvicorn
from tallow.server.app import ServerState, create_app
from tallow.server.fd_guard import quiet_accept_errors, raise_fd_limit
from tallow.server.read_timeout import ReadTimeoutProtocol
from tallow.server.worker import Worker
raise_fd_limit(); quiet_accept_errors()
worker = Worker(lambda: object(), max_queue=2)
worker.start()
uvicorn.Server(uvicorn.Config(create_app(ServerState(worker, "fake", None, None)), host="127.0.0.1", port={port},
               log_level="warning", http=ReadTimeoutProtocol)).run()
"""


def test_out_of_descriptors_logs_one_line_and_health_recovers(tmp_path):
    """Under `ulimit -n 64`, 100 idle connections exhaust the server's descriptors: asyncio then
    logged a traceback per failed accept (5 MB in 8 s); now one summary line, and once the read
    timeout closes the idle ones /health answers again."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "TALLOW_READ_TIMEOUT": "2"}
    with open(log, "w") as err:
        child = subprocess.Popen([sys.executable, "-c", FD_CHILD.format(root=str(root), port=port)], stderr=err, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and child.poll() is None, log.read_text()[-500:]
            time.sleep(0.2)
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
        time.sleep(4)  # the server closes the idle ones after 2 s; ours stay open meanwhile
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert r.status_code == 200
        for s in socks:
            s.close()
        text = log.read_text()
        assert len(text) < 4000 and "Traceback" not in text, text[:1000]
    finally:
        child.terminate()
        child.wait(10)
