"""`tallow serve` as a process: the ready line, one log line per request, clean shutdown on
SIGINT/SIGTERM at any moment (loading, idle, mid-stream), and start-up failures as one
sentence with the README's exit code (4: the port is taken)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from server_utils import free_port, require_model


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    # SIGINT back to its default: a test runner started in the background inherits it ignored.
    return subprocess.Popen([sys.executable, "-m", "tallow.cli", "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            env={**os.environ, **(env or {})})


class StderrLines:
    """The server's stderr, read on a thread so the test can wait for a line."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(proc.stderr), daemon=True)
        self._thread.start()

    def wait_for(self, needle: str, timeout: float = 120) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in list(self.lines):
                if needle in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} in {self.lines}")

    def text(self) -> str:
        self._thread.join(10)
        return "".join(self.lines)


def _finish(proc: subprocess.Popen, err: StderrLines, timeout: float = 30) -> tuple[int, str]:
    try:
        code = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, err.text()


def test_ready_line_request_log_and_ctrl_c_with_a_stream_in_flight():
    path = require_model("smollm2-135m")
    port = free_port()
    proc = _serve("-m", str(path), "--port", str(port), "--device", "cpu", "-c", "2048")
    err = StderrLines(proc)
    try:
        ready = err.wait_for("[tallow] ready:")
        url = f"http://127.0.0.1:{port}"
        assert f"smollm2-135m at {url}" in ready
        r = httpx.post(url + "/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}, timeout=60)
        assert r.status_code == 200
        line = err.wait_for("POST /v1/completions")
        usage = r.json()["usage"]
        assert f"200 {usage['prompt_tokens']}+{usage['completion_tokens']} tok" in line and line.rstrip().endswith(" s")

        events: list[str] = []
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": "Tell me a very long story about a lighthouse."}], "max_tokens": 1500, "stream": True}) as stream:
            for raw in stream.iter_lines():
                if raw.startswith("data: "):
                    events.append(raw[6:])
                    if len(events) == 4:
                        proc.send_signal(signal.SIGINT)  # Ctrl-C mid-stream
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "server_shutting_down"
        code, text = _finish(proc, err)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, text
    assert "[tallow] stopped (SIGINT)" in text
    for bad in ("Traceback", "terminate called", "ERROR:"):
        assert bad not in text


def test_sigterm_while_loading_exits_0_at_once(tmp_path):
    path = require_model("smollm2-135m")
    # The torch paths without the weight cache repack at load, which takes seconds (warm, or in llama.cpp's
    # numerics, which read the file's own bytes, it maps in 0.3 s).
    proc = _serve("-m", str(path), "--port", str(free_port()), "--device", "cpu",
                  env={"TALLOW_WEIGHT_CACHE": "0", "TALLOW_NUMERICS": "default"})
    err = StderrLines(proc)
    err.wait_for("[tallow] loading")
    time.sleep(0.3)  # inside the load
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    code, text = _finish(proc, err)
    assert code == 0, text
    assert time.time() - sent < 5  # no waiting for the load to finish
    assert "ready" not in text and "terminate called" not in text and "Traceback" not in text


def test_port_in_use_is_one_sentence_and_exit_4():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "tallow.cli", "serve", "-m", "smollm2-135m", "--port", str(port)],
                           capture_output=True, text=True, timeout=60, env={**os.environ, "TALLOW_HOME": "/nonexistent"})
    assert r.returncode == 4, r.stderr
    assert r.stderr == f"tallow: error: port {port} on 127.0.0.1 is already in use (another server?); pick another with --port.\n"
