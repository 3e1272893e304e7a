"""Limits an operator sets on `tallow serve` (tallow/server/limits.py): body size, prompt and output
tokens, the per-request timeout and the queue; each refusal is OpenAI-shaped and names its flag.

The timeout and queue cases run on a stand-in model whose generation is timed exactly (no load, no
flaky speeds); the token limits run on smollm2-135m, the body limit on both."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from server_utils import LiveServer, require_model
from tallow.engine.engine import GenerationStats
from tallow.server.limits import Limits

MODEL = "smollm2-135m"


class SlowLLM:
    """Stands in for tallow.LLM in the worker: a completion that yields one 'x' per `step_s`
    after a `first_s` pause that ignores should_stop (like one long prefill chunk)."""

    n_ctx = 512
    context_used = 0  # what /metrics reports as the KV cache's use

    def __init__(self, first_s: float = 0.0, step_s: float = 0.02) -> None:
        self.first_s, self.step_s = first_s, step_s
        self.stats = type("Stats", (), {"last": GenerationStats()})()
        self.last_tokens: list[int] = []
        self.last_logprobs: list = []

    def tokenize(self, text: str) -> list[int]:
        return list(range(len(text.split())))

    def generate(self, ids, max_tokens, stream, stop, should_stop, **_):
        def run():
            stats = GenerationStats(finish_reason="length")
            self.stats.last, self.last_tokens = stats, []
            time.sleep(self.first_s)
            for _ in range(max_tokens):
                self.last_tokens.append(0)
                yield "x"
                if should_stop():
                    stats.finish_reason = "stop"
                    return
                time.sleep(self.step_s)

        return run()


@pytest.fixture
def slow_server():
    servers = []

    def start(llm: SlowLLM, limits: Limits, queue: int = 4) -> LiveServer:
        server = LiveServer(lambda: llm, "slow", limits=limits, queue=queue)
        servers.append(server)
        server.wait_ready(10)
        return server

    yield start
    for server in servers:
        server.stop()


def _wait_running(server, gauge: str = "tallow_requests_running") -> None:
    """Until /metrics shows the gauge at 1 (the request sent from another thread has arrived)."""
    deadline = time.monotonic() + 20
    while f"\n{gauge} 1\n" not in httpx.get(server.url + "/metrics").text:
        assert time.monotonic() < deadline, f"{gauge} never reached 1"
        time.sleep(0.01)


def _complete(server, body: dict, results: dict, key: str) -> None:
    t0 = time.monotonic()
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    results[key] = (r, time.monotonic() - t0)


def test_timeout_ends_a_generation_with_length_and_refuses_a_request_still_queued(slow_server):
    server = slow_server(SlowLLM(first_s=4.0), Limits(request_timeout_s=1.0))
    results: dict = {}
    first = threading.Thread(target=_complete, args=(server, {"prompt": "a b", "max_tokens": 100}, results, "first"))
    first.start()
    _wait_running(server)  # the first request is in its uninterruptible pause; this one waits in the queue
    _complete(server, {"prompt": "c d", "max_tokens": 100}, results, "second")
    first.join()
    r, elapsed = results["second"]
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert err["code"] == "timeout" and "--timeout" in err["message"]
    assert 0.9 < elapsed < 3.0  # answered at its deadline (1 s), not when the engine came free (3.8 s)
    assert "tallow_requests_cancelled_total 0" in httpx.get(server.url + "/metrics").text  # a timeout is no hang-up
    r, elapsed = results["first"]
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 1
    # The engine is free again: a new request runs (and is itself cut at its deadline).
    _complete(server, {"prompt": "e", "max_tokens": 3}, results, "third")
    assert results["third"][0].status_code == 200


def test_timeout_cuts_a_stream_with_finish_length_and_done(slow_server):
    server = slow_server(SlowLLM(step_s=0.05), Limits(request_timeout_s=0.5))
    t0 = time.monotonic()
    with httpx.stream("POST", server.url + "/v1/completions", json={"prompt": "a", "max_tokens": 500, "stream": True}, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert time.monotonic() - t0 < 3
    assert lines[-1] == "data: [DONE]"
    finals = [json.loads(line[6:])["choices"][0]["finish_reason"] for line in lines[:-1]]
    assert finals[-1] == "length" and 3 < len(lines) < 100


def test_full_queue_is_503_with_retry_after_never_a_wait(slow_server):
    server = slow_server(SlowLLM(step_s=0.05), Limits(), queue=1)
    results: dict = {}
    running = threading.Thread(target=_complete, args=(server, {"prompt": "a", "max_tokens": 30}, results, "running"))
    running.start()
    _wait_running(server)
    queued = threading.Thread(target=_complete, args=(server, {"prompt": "b", "max_tokens": 2}, results, "queued"))
    queued.start()
    _wait_running(server, "tallow_queue_depth")
    _complete(server, {"prompt": "c", "max_tokens": 2}, results, "refused")
    r, elapsed = results["refused"]
    assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "queue_full"
    assert elapsed < 1.0  # refused at once, while the others still run
    running.join()
    queued.join()
    assert results["running"][0].status_code == 200 and results["queued"][0].status_code == 200
    assert "tallow_requests_rejected_total 1" in httpx.get(server.url + "/metrics").text


@pytest.mark.parametrize("chunked", [False, True])
def test_body_over_max_body_is_413_before_it_is_read(slow_server, chunked):
    server = slow_server(SlowLLM(), Limits(max_body_bytes=4096))
    body = json.dumps({"prompt": "word " * 2000, "max_tokens": 1}).encode()
    content = iter([body[i:i + 1000] for i in range(0, len(body), 1000)]) if chunked else body
    r = httpx.post(server.url + "/v1/completions", content=content, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == "body_too_large" and "--max-body" in err["message"]
    ok = httpx.post(server.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200  # a body under the limit still passes, the server healthy


def test_limits_refuse_nonsense():
    with pytest.raises(ValueError, match="max_body_bytes"):
        Limits(max_body_bytes=0)
    with pytest.raises(ValueError, match="request_timeout_s"):
        Limits(request_timeout_s=-1)


# --------------------------------------------------------------------------- on the real model
@pytest.fixture(scope="module")
def limited():
    path = require_model(MODEL)
    import tallow

    server = LiveServer(lambda: tallow.LLM(path, ctx=512), MODEL, str(path), limits=Limits(max_prompt_tokens=40, max_output_tokens=3))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_max_prompt_tokens_refuses_a_longer_prompt(limited):
    r = httpx.post(limited.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "word " * 60}], "max_tokens": 2}, timeout=120)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages" and "--max-prompt-tokens" in err["message"]
    r = httpx.post(limited.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, timeout=120)
    assert r.status_code == 200


@pytest.mark.parametrize("asked", [None, 50])
def test_max_tokens_bounds_every_answer(limited, asked):
    body = {"prompt": "1, 2, 3, 4,", "temperature": 0, **({"max_tokens": asked} if asked else {})}
    r = httpx.post(limited.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200
    out = r.json()
    assert out["usage"]["completion_tokens"] == 3 and out["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("flag,value", [("--timeout", "0"), ("--max-body", "lots"), ("--max-output-tokens", "-5"), ("--max-prompt-tokens", "0")])
def test_serve_flags_are_checked_before_anything_loads(capsys, flag, value):
    from tallow.cli import main

    assert main(["serve", "-m", "/nonexistent.gguf", flag, value]) == 2
    err = capsys.readouterr().err
    assert flag in err and "/nonexistent.gguf" not in err and "Traceback" not in err  # the flag, before the model is looked at


def _metric(server, name: str) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def test_a_hung_up_stream_frees_the_engine_within_steps_and_is_counted_once(slow_server):
    server = slow_server(SlowLLM(step_s=0.05), Limits())
    body = {"prompt": "a", "max_tokens": 5, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        assert [line for line in r.iter_lines() if line.startswith("data: ")][-1] == "data: [DONE]"
    time.sleep(0.1)
    assert _metric(server, "tallow_requests_cancelled_total") == 0  # a complete stream is not a cancellation
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "max_tokens": 400}, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text": "x"' in line.replace('"text":"x"', '"text": "x"'):
                break
    hung_up = time.monotonic()
    while _metric(server, "tallow_requests_running") and time.monotonic() - hung_up < 5:
        time.sleep(0.005)
    freed = time.monotonic() - hung_up
    assert freed < 0.5  # steps are 0.05 s: noticed at the next token sent, stopped after the step
    assert _metric(server, "tallow_requests_cancelled_total") == 1
    assert _metric(server, "tallow_generated_tokens_total") < 5 + 20
