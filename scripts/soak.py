"""A bounded soak of `tallow serve`: several concurrent clients, a seeded mix of requests.

    python scripts/soak.py --model smollm2-135m --requests 10000 --clients 4 --json soak.json

It starts the server itself (a child process, its KV store in a temporary TALLOW_HOME) unless
--url and --pid name a running one, then sends the mix below, each request checked against
what it must answer. It records every status, latency percentiles, 5xx and hangs (no answer
within --hang-s), the server's RSS (and GPU memory, when nvidia-smi sees the process) sampled
over time, how long a disconnected stream keeps the engine busy, and checks /metrics against
what it sent. It prints a summary, writes it as JSON with --json, and exits 0 only when every
target holds: zero 5xx, zero hangs, zero unexpected answers, RSS within --rss-tolerance of its
level after warm-up, a hung-up stream freeing the engine within two decode steps (+ --free-s),
/metrics consistent.

The mix (percent): blocking and streamed chat and completions, tool calls (tool_choice auto and
required), json_schema, stop strings, multi-turn chats with a conversation_id (persistent KV),
10 clients that hang up mid-stream, 5 prompts past the context, 5 invalid bodies.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

MIX = {  # kind -> percent of requests
    "chat": 13, "chat_stream": 13, "completion": 11, "completion_stream": 8,
    "tool_auto": 6, "tool_required": 6, "json_schema": 8, "stop": 5, "conversation": 10,
    "disconnect": 10, "past_context": 5, "invalid": 5,
}
EXPECTED = {"past_context": {400}, "invalid": {400, 413, 422}}  # every other kind: 200
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}}}
QUESTIONS = ["Say hello.", "What is 2+2?", "Name a colour.", "Tell me a fact about cats.", "What is the capital of France?",
             "Write one word.", "Describe the sea.", "Count to three."]
INVALID_BODIES = [b"{not json", b"[1, 2, 3]", b'{"messages": "hi"}', b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
                  b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', b'{"prompt": {"a": 1}}',
                  b"\xff\xfe\x00garbage", b'{"messages": []}', b'{"messages": [{"role": "wizard", "content": "x"}]}']


@dataclass
class Result:
    kind: str
    status: int | None  # None: the client hung up on purpose (disconnect)
    latency_s: float
    ok: bool  # the answer is what this kind must answer
    problem: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    hang: bool = False
    finished_at: float = 0.0


@dataclass
class Soak:
    url: str
    pid: int | None
    ctx: int
    max_tokens: int
    hang_s: float
    results: list[Result] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    samples: list[dict] = field(default_factory=list)  # {t, rss_mb, gpu_mb, done}

    def record(self, r: Result) -> None:
        r.finished_at = time.monotonic()
        with self.lock:
            self.results.append(r)


# ------------------------------------------------------------------------------ requests
def _sse_events(response: httpx.Response):
    """The JSON objects of an SSE stream, then the string "[DONE]" if it came."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        yield data if data == "[DONE]" else json.loads(data)


def _usage(obj: dict) -> tuple[int, int]:
    u = obj.get("usage") or {}
    return int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))


def run_request(soak: Soak, client: httpx.Client, kind: str, rng: random.Random, history: dict) -> Result:
    """Send one request of `kind` and check its answer."""
    n = soak.max_tokens
    q = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    body: dict | bytes
    path = "/v1/chat/completions"
    stream = kind.endswith("_stream") or kind == "disconnect"
    if kind in ("chat", "chat_stream"):
        body = {"messages": q, "max_tokens": n}
    elif kind in ("completion", "completion_stream"):
        path, body = "/v1/completions", {"prompt": rng.choice(["Once upon a time", "The weather today is", "1, 2, 3,"]), "max_tokens": n}
    elif kind == "tool_auto":
        body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [TOOL], "tool_choice": "auto", "max_tokens": n}
    elif kind == "tool_required":
        body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [TOOL], "tool_choice": "required", "max_tokens": max(n, 32)}  # a call needs ~20
    elif kind == "json_schema":
        body = {"messages": [{"role": "user", "content": "Invent a person."}], "response_format": SCHEMA, "max_tokens": max(n, 16)}
    elif kind == "stop":
        body = {"messages": q, "max_tokens": n, "stop": [" ", "."]}
    elif kind == "conversation":
        cid = f"soak-{rng.randrange(4)}-{threading.get_ident() % 1000}"
        turns = history.setdefault(cid, [])
        if len(turns) >= 6:  # keep the prompt well inside the context
            turns.clear()
        turns.append(q[0])
        body = {"messages": list(turns), "max_tokens": n, "conversation_id": cid}
    elif kind == "disconnect":
        body = {"messages": [{"role": "user", "content": "Write a long story about a dragon."}], "max_tokens": max(4 * n, 64)}
    elif kind == "past_context":
        path, body = "/v1/completions", {"prompt": "word " * (2 * soak.ctx), "max_tokens": n}
    elif kind == "invalid":
        body = rng.choice(INVALID_BODIES)
    else:
        raise ValueError(kind)
    if isinstance(body, dict):
        body.setdefault("temperature", rng.choice([0, 0.7]))
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        content = json.dumps(body).encode()
    else:
        content = body
    t0 = time.monotonic()
    try:
        if stream:
            return _streamed(soak, client, kind, path, content, t0, body, history)
        r = client.post(path, content=content, headers={"Content-Type": "application/json"})
    except httpx.TimeoutException:
        return Result(kind, None, time.monotonic() - t0, False, f"no answer within {soak.hang_s:g} s", hang=True)
    except httpx.HTTPError as exc:
        return Result(kind, None, time.monotonic() - t0, False, f"transport error: {exc!r}")
    latency = time.monotonic() - t0
    return _check_blocking(kind, r, latency, body, history)


def _check_blocking(kind: str, r: httpx.Response, latency: float, body, history: dict) -> Result:
    expected = EXPECTED.get(kind, {200})
    try:
        obj = r.json()
    except ValueError:
        return Result(kind, r.status_code, latency, False, f"body is not JSON: {r.text[:80]!r}")
    if r.status_code not in expected:
        return Result(kind, r.status_code, latency, False, f"status {r.status_code}: {json.dumps(obj)[:160]}")
    if r.status_code != 200:
        err = obj.get("error") if isinstance(obj, dict) else None
        if not isinstance(err, dict) or not err.get("message"):
            return Result(kind, r.status_code, latency, False, "error without an OpenAI error object")
        if kind == "past_context" and err.get("code") != "context_length_exceeded":
            return Result(kind, r.status_code, latency, False, f"code {err.get('code')!r}, expected context_length_exceeded")
        return Result(kind, r.status_code, latency, True)
    choice = obj["choices"][0]
    p, c = _usage(obj)
    problem = ""
    if kind == "tool_required":
        calls = choice["message"].get("tool_calls") or []
        if choice["finish_reason"] != "tool_calls" or not calls or calls[0]["function"]["name"] != "get_weather":
            problem = f"tool_choice required gave no get_weather call: {json.dumps(choice)[:160]}"
        else:
            json.loads(calls[0]["function"]["arguments"])
    elif kind == "json_schema":
        try:
            value = json.loads(choice["message"]["content"])
            if not isinstance(value, dict) or "name" not in value or "age" not in value:
                problem = f"json_schema answer lacks required keys: {value!r}"
        except (TypeError, ValueError):
            problem = f"json_schema answer is not JSON: {choice['message']['content']!r}"
    elif kind == "stop":
        text = choice["message"]["content"] or ""
        if " " in text or "." in text:
            problem = f"a stop string is in the answer: {text!r}"
    elif kind == "conversation":
        cid = body["conversation_id"]
        history[cid].append({"role": "assistant", "content": choice["message"]["content"] or ""})
    if c > (body.get("max_tokens") or 1 << 30):
        problem = f"{c} tokens generated, max_tokens was {body['max_tokens']}"
    return Result(kind, 200, latency, not problem, problem, p, c)


def _streamed(soak: Soak, client: httpx.Client, kind: str, path: str, content: bytes, t0: float, body: dict, history: dict) -> Result:
    with client.stream("POST", path, content=content, headers={"Content-Type": "application/json"}) as r:
        if r.status_code != 200:
            r.read()
            return _check_blocking(kind, r, time.monotonic() - t0, body, history)
        done = False
        p = c = 0
        finish = None
        for event in _sse_events(r):
            if event == "[DONE]":
                done = True
                break
            if "error" in event:
                return Result(kind, 200, time.monotonic() - t0, False, f"error event in the stream: {json.dumps(event)[:160]}")
            if kind == "disconnect" and event.get("choices") and (event["choices"][0].get("delta") or {}).get("content"):
                return Result(kind, None, time.monotonic() - t0, True)  # hang up after the first text
            if event.get("usage"):
                p, c = _usage(event)
            for ch in event.get("choices") or []:
                finish = ch.get("finish_reason") or finish
        latency = time.monotonic() - t0
        if kind == "disconnect":  # the answer ended before any text: nothing to hang up on
            return Result(kind, 200, latency, done, "" if done else "stream ended without [DONE]", p, c)
        if not done:
            return Result(kind, 200, latency, False, "stream ended without [DONE]", p, c)
        if finish is None:
            return Result(kind, 200, latency, False, "no finish_reason in the stream", p, c)
        return Result(kind, 200, latency, True, "", p, c)


def client_loop(soak: Soak, kinds: list[str], seed: int, stop_at: float) -> None:
    rng = random.Random(seed)
    history: dict = {}
    with httpx.Client(base_url=soak.url, timeout=httpx.Timeout(soak.hang_s, connect=10)) as client:
        for kind in kinds:
            if time.monotonic() >= stop_at:  # --max-wall-s: the run ends short, and says so
                return
            try:
                result = run_request(soak, client, kind, rng, history)
            except httpx.TimeoutException:
                result = Result(kind, None, soak.hang_s, False, f"no answer within {soak.hang_s:g} s", hang=True)
            except Exception as exc:  # noqa: BLE001 - a broken answer is a finding, not a crash of the soak
                result = Result(kind, None, 0.0, False, f"client failed: {type(exc).__name__}: {exc}")
            soak.record(result)


# ------------------------------------------------------------------------------ observing
def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def gpu_mb(pid: int) -> float | None:
    """GPU memory nvidia-smi attributes to the process (None without a GPU)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1])
    # In a container nvidia-smi may not see our pids: the device's whole use (the server is its only user).
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        return float(out) if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def sampler(soak: Soak, every_s: float, stop: threading.Event) -> None:
    t0 = time.monotonic()
    while not stop.is_set():
        if soak.pid:
            with soak.lock:
                done = len(soak.results)
            soak.samples.append({"t": round(time.monotonic() - t0, 1), "rss_mb": rss_mb(soak.pid), "gpu_mb": gpu_mb(soak.pid), "done": done})
        stop.wait(every_s)


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(tallow_\w+) (\S+)$", text, re.M)}


def disconnect_probe(soak: Soak, n: int) -> list[dict]:
    """With nothing else running: hang up on a long stream after its fourth text chunk; seconds
    until /metrics shows the engine idle again, and the stream's step (median gap between chunks).
    The server notices the hang-up when it sends the next token, and the engine stops after the
    step it is in, so the engine should be free within about two steps."""
    probes = []
    body = json.dumps({"prompt": "Once upon a time, in a land far away,", "max_tokens": 400, "stream": True, "temperature": 0.7}).encode()
    with httpx.Client(base_url=soak.url, timeout=soak.hang_s) as client:
        for _ in range(n):
            arrivals = []
            with client.stream("POST", "/v1/completions", content=body, headers={"Content-Type": "application/json"}) as r:
                for event in _sse_events(r):
                    if event != "[DONE]" and event.get("choices") and event["choices"][0].get("text"):
                        arrivals.append(time.monotonic())
                        if len(arrivals) == 4:
                            break
            t0 = time.monotonic()  # the connection is closed when the `with` ends
            while time.monotonic() - t0 < 60:
                m = metrics(soak.url)
                if m.get("tallow_requests_running") == 0 and m.get("tallow_queue_depth") == 0:
                    break
                time.sleep(0.005)
            gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
            probes.append({"freed_s": round(time.monotonic() - t0, 3), "step_s": round(statistics.median(gaps), 3) if gaps else None})
    return probes


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


# ------------------------------------------------------------------------------ the run
def start_server(model: str, ctx: int, queue: int, home: str, port: int, extra: list[str]) -> subprocess.Popen:
    from tallow.registry import resolve_model

    path = resolve_model(model, pull_missing=False, progress=False)
    env = {**os.environ, "TALLOW_HOME": home}
    cmd = [sys.executable, "-m", "tallow.cli", "serve", "-m", str(path), "--port", str(port), "-c", str(ctx), "--queue", str(queue), *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(Path(home) / "server.log", "wb"))


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server was not healthy within {timeout:g} s")


def plan(n: int, clients: int, seed: int) -> list[list[str]]:
    """Each client's list of kinds: the mix in its proportions (every kind at least once, so a
    short run may send a few more than n), shuffled, dealt round-robin."""
    kinds = [k for k, pct in MIX.items() for _ in range(max(1, round(n * pct / 100)))]
    random.Random(seed).shuffle(kinds)
    return [kinds[i::clients] for i in range(clients)]


def summarize(soak: Soak, before: dict, after: dict, probes: list[dict], wall_s: float, args) -> dict:
    res = soak.results
    by_kind_status = Counter(f"{r.kind}:{r.status if r.status is not None else ('hang' if r.hang else 'hung-up')}" for r in res)
    statuses = Counter(str(r.status) if r.status is not None else ("hang" if r.hang else "client-closed") for r in res)
    five_xx = sum(1 for r in res if r.status is not None and r.status >= 500)
    hangs = sum(1 for r in res if r.hang)
    bad = [r for r in res if not r.ok]
    lat = [r.latency_s for r in res if r.status == 200]
    # RSS after warm-up: the first tenth of the requests (at least 20) warms caches, graphs, allocators.
    warm_done = max(20, len(res) // 10)
    rss = [s for s in soak.samples if s["rss_mb"] is not None]
    after_warm = [s for s in rss if s["done"] >= warm_done] or rss[-1:]
    rss_growth = None
    if after_warm:
        base = after_warm[0]["rss_mb"]
        rss_growth = (max(s["rss_mb"] for s in after_warm) - base) / base
    gpu = [s["gpu_mb"] for s in soak.samples if s["gpu_mb"] is not None]
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    n_ok = sum(1 for r in res if r.status == 200)
    n_ctx = sum(1 for r in res if r.kind == "past_context" and r.status == 400)
    n_hung_up = sum(1 for r in res if r.kind == "disconnect" and r.status is None) + len(probes)
    freed_ok = all(pr["freed_s"] <= 2 * (pr["step_s"] or 0) + args.free_s for pr in probes)
    n_503 = statuses.get("503", 0)
    sent_completion = sum(r.completion_tokens for r in res if r.status == 200)
    sent_prompt = sum(r.prompt_tokens for r in res if r.status == 200)
    metric_checks = {
        # A client that gave up (a hang) may have left the queue before the worker counted it.
        "requests_total = answered + past-context + hung up (+ hangs)": 0 <= d.get("tallow_requests_total", -1) - (n_ok + n_ctx + n_hung_up) <= hangs,
        "requests_failed = past-context 400s": d.get("tallow_requests_failed_total") == n_ctx,
        "requests_cancelled <= hung up (+ hangs)": 0 <= d.get("tallow_requests_cancelled_total", 0) <= n_hung_up + hangs,
        "requests_rejected = 503 answers": d.get("tallow_requests_rejected_total") == n_503,
        "generated tokens within what the answers report (+ hung-up streams)":
            sent_completion <= d.get("tallow_generated_tokens_total", -1) <= sent_completion + (n_hung_up + hangs) * 400,
        "prompt tokens >= what the answers report": d.get("tallow_prompt_tokens_total", -1) >= sent_prompt,
        "idle at the end (queue 0, running 0)": after.get("tallow_queue_depth") == 0 and after.get("tallow_requests_running") == 0,
    }
    targets = {
        "zero 5xx": five_xx == 0,
        "zero hangs": hangs == 0,
        "every answer as expected": not bad,
        f"RSS flat within {args.rss_tolerance:.0%} after warm-up": rss_growth is None or rss_growth <= args.rss_tolerance,
        f"a hung-up stream frees the engine within 2 steps + {args.free_s:g} s": freed_ok,
        "/metrics agrees with what was sent": all(metric_checks.values()),
    }
    return {
        "requests": len(res), "requests_planned": args.requests, "clients": args.clients, "wall_s": round(wall_s, 1), "requests_per_s": round(len(res) / wall_s, 2) if wall_s else 0,
        "statuses": dict(statuses), "by_kind_status": dict(sorted(by_kind_status.items())),
        "latency_s": {"p50": round(percentile(lat, 50), 3), "p90": round(percentile(lat, 90), 3), "p99": round(percentile(lat, 99), 3),
                      "max": round(max(lat), 3) if lat else 0, "mean": round(statistics.fmean(lat), 3) if lat else 0},
        "five_xx": five_xx, "hangs": hangs,
        "unexpected": [asdict(r) for r in bad[:20]], "unexpected_count": len(bad),
        "rss_mb": {"first": rss[0]["rss_mb"] if rss else None, "after_warmup": after_warm[0]["rss_mb"] if after_warm else None,
                   "max_after_warmup": max(s["rss_mb"] for s in after_warm) if after_warm else None,
                   "last": rss[-1]["rss_mb"] if rss else None, "growth_after_warmup": round(rss_growth, 4) if rss_growth is not None else None},
        "gpu_mb": {"first": gpu[0], "max": max(gpu), "last": gpu[-1]} if gpu else None,
        "disconnect_probes": probes,
        "metrics_delta": {k.removeprefix("tallow_"): v for k, v in d.items() if k.endswith("_total")},
        "metric_checks": metric_checks, "targets": targets, "passed": all(targets.values()),
        "samples": soak.samples,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--url", default=None, help="a running server (with --pid for its RSS); default: start one")
    p.add_argument("--pid", type=int, default=None)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=8, help="answer length of most requests (short: the soak is about the server)")
    p.add_argument("--hang-s", type=float, default=60.0, help="a request with no answer after this long is a hang")
    p.add_argument("--free-s", type=float, default=0.25, help="slack beyond two decode steps for a hung-up stream to leave the engine idle")
    p.add_argument("--probes", type=int, default=3, help="disconnect probes at the end, with nothing else running")
    p.add_argument("--rss-tolerance", type=float, default=0.05)
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-wall-s", type=float, default=None, help="stop sending after this long (the summary counts what was sent)")
    p.add_argument("--json", default=None, help="write the summary (with the RSS samples) here")
    p.add_argument("--server-arg", action="append", default=[], help="extra `tallow serve` argument (repeatable)")
    args = p.parse_args(argv)

    home = tempfile.mkdtemp(prefix="tallow-soak-")
    proc = None
    if args.url:
        url, pid = args.url.rstrip("/"), args.pid
    else:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = start_server(args.model, args.ctx, max(16, 2 * args.clients), home, port, args.server_arg)
        url, pid = f"http://127.0.0.1:{port}", proc.pid
    soak = Soak(url, pid, args.ctx, args.max_tokens, args.hang_s)
    stop = threading.Event()
    try:
        wait_healthy(url, proc, timeout=300)
        before = metrics(url)
        watcher = threading.Thread(target=sampler, args=(soak, args.sample_s, stop), daemon=True)
        watcher.start()
        t0 = time.monotonic()
        stop_at = t0 + args.max_wall_s if args.max_wall_s else float("inf")
        threads = [threading.Thread(target=client_loop, args=(soak, kinds, args.seed * 1000 + i, stop_at)) for i, kinds in enumerate(plan(args.requests, args.clients, args.seed))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        probes = disconnect_probe(soak, args.probes)
        wall = time.monotonic() - t0
        time.sleep(0.2)
        after = metrics(url)
        stop.set()
        watcher.join()
        summary = summarize(soak, before, after, probes, wall, args)
        if proc is not None and proc.poll() is not None:
            summary["targets"]["the server stayed up"] = False
            summary["passed"] = False
    finally:
        stop.set()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log = Path(home) / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            if "Traceback" in tail:
                print("server log (tail):\n" + tail, file=sys.stderr)
        shutil.rmtree(home, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    brief = {k: v for k, v in summary.items() if k not in ("samples", "by_kind_status")}
    print(json.dumps(brief, indent=1))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
