"""The OpenAI-compatible HTTP server: thin — it validates, queues and streams; the engine works.

    tallow serve -m smollm2-135m --port 8080
    curl localhost:8080/v1/chat/completions -H 'Content-Type: application/json' -d '{"messages": [{"role": "user", "content": "Hi"}]}'

Endpoints: `POST /v1/chat/completions`, `POST /v1/completions` (SSE streaming with
`data: [DONE]`, or one JSON answer), `POST /apply-template` (llama-server's: the prompt a chat
renders to, no generation), `GET /v1/models`, `GET /health` (503 while the model
loads, 200 after), `GET /metrics` (Prometheus text) and `GET /` (the web chat page).
Every error is OpenAI-shaped: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..chat.parsers import ParsedDelta
from ..errors import TallowError
from ..kernels.gpu.machine_state import METRICS, cpu_state
from .access import AccessGuard
from .probes import add_probe_routes
from .limits import Limits, queued_too_long, read_body
from .protocol import APIError, check_model_name, ChatRequest, CompletionRequest, parse_chat_request, parse_completion_request, parse_json_body
from .worker import Job, Worker

log = logging.getLogger("tallow.server")

STATIC = Path(__file__).parent / "static"
DISCONNECT_POLL_S = 0.1  # how often a waiting handler checks whether its client is still there


class ServerState:
    """What the handlers share: the worker, the served model's identity, the API key."""

    def __init__(self, worker: Worker, model_id: str, model_path: str | None, api_key: str | None, aliases: tuple[str, ...] = (),
                 host: str = "127.0.0.1") -> None:
        self.worker = worker
        self.host = host  # the bound address: on loopback only loopback Host headers are served (access.py)
        self.model_id = model_id
        self.aliases = {model_id, *aliases}
        self.api_key = api_key
        self.started = time.time()
        try:
            self.created = int(os.path.getmtime(model_path)) if model_path else int(self.started)
        except OSError:
            self.created = int(self.started)

    def check_model(self, name: str | None) -> None:
        """Any `model` string is accepted, as llama-server does: one model is served, and
        clients (agent frameworks, the openai SDK's examples) send whatever name they were
        configured with. Answers always name the served model."""
        if name is not None and not isinstance(name, str):
            raise APIError(400, f"'model' must be a string, not {type(name).__name__}.", "invalid_request_error", "model", "invalid_type")


def _error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


async def _next_event(job: Job, request: Request, worker: Worker, busy_check: bool = False, until_start: bool = False) -> tuple[str, Any]:
    """The job's next event; if the client disconnects meanwhile, cancel the job and say so.

    The client is checked when no event came for DISCONNECT_POLL_S. A non-streaming answer
    (busy_check) is also checked every DISCONNECT_POLL_S while events pour in: a fast
    generation never goes quiet. (A stream notices a vanished client when a send fails.)"""
    while True:
        now = time.monotonic()
        if busy_check and now - job.last_disconnect_check >= DISCONNECT_POLL_S:
            job.last_disconnect_check = now
            if await request.is_disconnected():
                worker.cancel(job)
                return "disconnected", None
        try:
            return await asyncio.wait_for(job.events.get(), timeout=DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if until_start and job.past_deadline():  # still queued at --timeout: leave the queue
                worker.cancel(job, client_left=False)
                return "timeout", None
            job.last_disconnect_check = time.monotonic()
            if await request.is_disconnected():
                worker.cancel(job)
                return "disconnected", None


def _chat_logprobs(entries: list) -> dict[str, Any]:
    """OpenAI chat form: per token its text, logprob, UTF-8 bytes and top alternatives."""
    return {"content": [
        {"token": e.text, "logprob": e.logprob, "bytes": list(e.bytes),
         "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)} for _, t, b, lp in e.top]}
        for e in entries
    ]}


def _completion_logprobs(entries: list, offset: int, skip_special: bool = True) -> dict[str, Any]:
    """OpenAI's legacy completions form; `offset` is where the first token's text starts (a
    special token left out of the text takes no room in it)."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += 0 if skip_special and e.special else len(e.text)
    return {
        "tokens": [e.text for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{t: lp for _, t, _, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def create_app(state: ServerState) -> FastAPI:
    """The FastAPI application around a started (or starting) worker."""
    app = FastAPI(title="tallow", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.tallow = state
    app.add_middleware(AccessGuard, bound_host=state.host, max_body=state.worker.limits.max_body_bytes)
    worker = state.worker

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        message = f"There is no route {request.method} {request.url.path}." if exc.status_code in (404, 405) else str(exc.detail)
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return JSONResponse({"error": {"message": f"The server failed ({type(exc).__name__}).", "type": "server_error", "param": None, "code": "internal_error"}}, status_code=500)

    # A dependency, not an HTTP middleware: Starlette's BaseHTTPMiddleware wraps `receive`,
    # and then `request.is_disconnected()` never sees the client leave.
    async def require_key(request: Request) -> None:
        if state.api_key:
            header = request.headers.get("authorization", "")
            token = header[7:].strip() if header.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), state.api_key.encode()):
                raise APIError(401, "The API key is missing or wrong: send it as 'Authorization: Bearer KEY'.", "invalid_request_error", None, "invalid_api_key")

    v1 = [Depends(require_key)]

    @app.get("/health")
    async def health() -> JSONResponse:
        if worker.load_error is not None:
            return JSONResponse({"status": "error", "error": str(worker.load_error)}, status_code=500)
        if not worker.ready.is_set():
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": "2"})
        stuck = worker.stalled()
        if stuck is not None:
            return JSONResponse({"status": "stuck", "error": stuck}, status_code=503)
        return JSONResponse({"status": "ok", "model": state.model_id})

    @app.get("/v1/models", dependencies=v1)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": state.model_id, "object": "model", "created": state.created, "owned_by": "tallow"}]}

    @app.get("/v1/models/{name}", dependencies=v1)
    async def model(name: str) -> dict[str, Any]:
        check_model_name(name)  # a path-like or huge name is a 400
        if name not in state.aliases:  # a lookup by name, unlike a request's `model`, is answered truthfully
            raise APIError(404, f"The model {name!r} does not exist; this server serves {state.model_id!r}.", "invalid_request_error", "model", "model_not_found")
        return {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "tallow"}

    @app.get("/metrics", dependencies=v1)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(_prometheus(state), media_type="text/plain; version=0.0.4")

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @app.post("/v1/chat/completions", dependencies=v1)
    async def chat_completions(request: Request) -> Response:
        req = parse_chat_request(parse_json_body(await read_body(request, worker.limits.max_body_bytes)))
        state.check_model(req.model)
        return await _handle(request, req, "chat")

    @app.post("/apply-template", dependencies=v1)
    async def apply_template(request: Request) -> JSONResponse:
        """llama-server's: the chat request's messages (and tools) rendered through the model's
        template with the generation prompt, no generation — `{"prompt": "..."}`."""
        req = parse_chat_request(parse_json_body(await request.body()))
        if worker.llm is None:
            raise APIError(503, "The model is still loading; retry in a few seconds.", "server_error", None, "model_loading", {"Retry-After": "2"})
        try:
            prompt = worker.llm.render_chat(req.messages, req.tools, req.tool_choice, **req.template_kwargs)
        except TallowError as exc:
            raise APIError(400, str(exc), "invalid_request_error", "messages", "invalid_value") from None
        return JSONResponse({"prompt": prompt})

    @app.post("/v1/completions", dependencies=v1)
    async def completions(request: Request) -> Response:
        req = parse_completion_request(parse_json_body(await read_body(request, worker.limits.max_body_bytes)))
        state.check_model(req.model)
        return await _handle(request, req, "completion")

    async def _handle(request: Request, req: ChatRequest | CompletionRequest, kind: str) -> Response:
        job = Job(req, asyncio.get_running_loop())
        worker.submit(job)
        # Wait for the prompt to be accepted (or refused) before answering: a context
        # overflow must be a 400, which a stream that already sent its headers cannot be.
        event, payload = await _next_event(job, request, worker, until_start=True)
        if event == "error":
            return _error_response(payload)
        if event == "timeout":
            return _error_response(queued_too_long(worker.limits.request_timeout_s))
        if event == "disconnected":
            return Response(status_code=499)
        prompt_tokens = payload["prompt_tokens"]
        if req.stream:
            return StreamingResponse(_stream(request, job, req, kind), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _collect(request, job, req, kind, prompt_tokens)

    async def _collect(request: Request, job: Job, req: ChatRequest | CompletionRequest, kind: str, prompt_tokens: int) -> Response:
        total = ParsedDelta()
        logprobs: list = []
        while True:
            event, payload = await _next_event(job, request, worker, busy_check=True)
            if event == "logprobs":
                logprobs.extend(payload)
            elif event == "delta":
                total.extend(payload)
            elif event == "error":
                return _error_response(payload)
            elif event == "disconnected":
                return Response(status_code=499)
            elif event == "done":
                break
        base = {"id": ("chatcmpl-" if kind == "chat" else "cmpl-") + job.id, "created": job.created, "model": state.model_id, "system_fingerprint": "tallow"}
        if kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": total.content if (total.content or not total.tool_calls) else None}
            if total.reasoning:
                message["reasoning_content"] = total.reasoning
            if total.tool_calls:
                message["tool_calls"] = [c.to_openai() for c in total.tool_calls]
            choice = {"index": 0, "message": message, "finish_reason": payload["finish_reason"],
                      "logprobs": _chat_logprobs(logprobs) if req.logprobs is not None else None}
            body = {**base, "object": "chat.completion", "choices": [choice]}
        else:
            choice = {"index": 0, "text": total.content, "finish_reason": payload["finish_reason"],
                      "logprobs": _completion_logprobs(logprobs, 0, req.skip_special_tokens) if req.logprobs is not None else None}
            body = {**base, "object": "text_completion", "choices": [choice]}
        body["usage"] = payload["usage"]
        body["timings"] = payload["timings"]
        _note_usage(request, payload)
        return JSONResponse(body)

    async def _stream(request: Request, job: Job, req: ChatRequest | CompletionRequest, kind: str) -> AsyncIterator[bytes]:
        """SSE chunks until `data: [DONE]`; if the client goes, the finally cancels the job."""
        chat = kind == "chat"
        base = {"id": ("chatcmpl-" if chat else "cmpl-") + job.id, "object": "chat.completion.chunk" if chat else "text_completion", "created": job.created, "model": state.model_id, "system_fingerprint": "tallow"}
        extra = {"usage": None} if req.include_usage else {}

        def chunk(delta: dict[str, Any] | str, finish: str | None = None) -> bytes:
            return _sse(chunk_obj(delta, finish))

        def chunk_obj(delta: dict[str, Any] | str, finish: str | None = None) -> dict[str, Any]:
            if chat:
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            return {**base, "choices": [choice], **extra}

        text_offset = 0
        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                event, payload = await _next_event(job, request, worker)
                if event == "logprobs":  # the tokens of the text chunks that follow
                    obj = chunk_obj({} if chat else "")
                    if chat:
                        obj["choices"][0]["logprobs"] = _chat_logprobs(payload)
                    else:
                        logprobs = _completion_logprobs(payload, text_offset, req.skip_special_tokens)
                        obj["choices"][0]["logprobs"] = logprobs
                        text_offset = logprobs["text_offset"][-1] + (0 if req.skip_special_tokens and payload[-1].special else len(payload[-1].text))
                    yield _sse(obj)
                elif event == "delta":
                    if not chat:
                        if payload.content:
                            yield chunk(payload.content)
                        continue
                    if payload.reasoning:
                        yield chunk({"reasoning_content": payload.reasoning})
                    if payload.content:
                        yield chunk({"content": payload.content})
                    # A call streams as OpenAI's do: its id and name first, then its arguments
                    # in pieces as the model writes them (complete calls need no extra chunk).
                    for piece in payload.call_deltas:
                        yield chunk({"tool_calls": [piece.to_openai()]})
                elif event == "done":
                    _note_usage(request, payload)
                    final = chunk_obj({} if chat else "", payload["finish_reason"])
                    final["timings"] = payload["timings"]
                    yield _sse(final)
                    if req.include_usage:
                        yield _sse({**base, "choices": [], "usage": payload["usage"]})
                    break
                elif event == "error":
                    yield _sse(payload.body())
                    break
                else:  # disconnected
                    return
            yield b"data: [DONE]\n\n"
        finally:
            worker.cancel(job)

    add_probe_routes(app, state, v1)
    return app


def _note_usage(request: Request, payload: dict[str, Any]) -> None:
    """Leave the token counts where the request log (server/request_log.py) finds them."""
    request.scope.setdefault("state", {})["tallow_usage"] = payload["usage"]
    request.scope["state"]["tallow_timings"] = payload["timings"]


def _prometheus(state: ServerState) -> str:
    """Prometheus text exposition of the worker's counters and gauges."""
    w = state.worker
    m = w.metrics
    kv_used = kv_size = 0
    if w.llm is not None:
        kv_used = w.llm.context_used
        kv_size = w.llm.n_ctx
    rows = [
        ("tallow_requests_total", "counter", "Generation requests served (started).", m.requests_total),
        ("tallow_requests_failed_total", "counter", "Requests that ended in an error.", m.requests_failed),
        ("tallow_requests_cancelled_total", "counter", "Requests whose client went away.", m.requests_cancelled),
        ("tallow_requests_rejected_total", "counter", "Requests refused because the queue was full.", m.requests_rejected_queue_full),
        ("tallow_prompt_tokens_total", "counter", "Prompt tokens of all requests.", m.prompt_tokens_total),
        ("tallow_cached_prompt_tokens_total", "counter", "Prompt tokens whose KV came from the prefix cache.", m.cached_tokens_total),
        ("tallow_cache_hits_total", "counter", "Requests that reused a cached prefix.", m.cache_hits_total),
        ("tallow_generated_tokens_total", "counter", "Tokens generated.", m.generated_tokens_total),
        ("tallow_prefill_seconds_total", "counter", "Time spent in prefill.", m.prefill_seconds_total),
        ("tallow_decode_seconds_total", "counter", "Time spent decoding.", m.decode_seconds_total),
        ("tallow_prefill_tokens_per_second", "gauge", "Prefill speed of the last request.", m.last_prefill_tok_s),
        ("tallow_decode_tokens_per_second", "gauge", "Decode speed of the last request.", m.last_decode_tok_s),
        ("tallow_queue_depth", "gauge", "Requests waiting for the engine.", w.queue_depth),
        ("tallow_requests_running", "gauge", "Requests being generated (0 or 1).", 1 if w.running is not None else 0),
        ("tallow_kv_tokens_used", "gauge", "Positions of the KV pool holding tokens.", kv_used),
        ("tallow_kv_tokens_capacity", "gauge", "Positions of the KV pool.", kv_size),
        ("tallow_model_loaded", "gauge", "1 once the model is loaded.", 1 if w.ready.is_set() else 0),
    ]
    # The machine as scraped: a slow request can be told from a hot, throttled or shared machine.
    read = getattr(w.llm, "machine_state", None)
    machine = read() if read is not None else cpu_state()
    rows += [(METRICS[k][0], "gauge", METRICS[k][1], v) for k, v in machine.items() if k in METRICS]
    lines = []
    for name, kind, help_text, value in rows:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"]
    return "\n".join(lines) + "\n"


def model_identity(model: str | None) -> tuple[str, str, tuple[str, ...]]:
    """(id shown in /v1/models, resolved file path, other names accepted in requests)."""
    from ..registry import resolve_model

    path = str(resolve_model(model, pull_missing=True, progress=True))
    stem = Path(path).name.removesuffix(".gguf")
    aliases = tuple(a for a in (model, Path(path).name) if a)
    return stem, path, aliases


class _StoppedEarly(BaseException):
    """SIGINT/SIGTERM while binding or pulling, before there is a server to stop."""

    def __init__(self, signum: int) -> None:
        self.signum = signum


def bind_socket(host: str, port: int):
    """The listening socket, bound before the model loads, so a taken or forbidden port is one
    sentence (exit 4) rather than uvicorn's log line after a long load."""
    import errno
    import socket

    from ..errors import SystemRefusalError, UsageError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host!r} is not an address this machine can bind ({exc.strerror}).") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = f"port {port} on {host} is already in use (another server?); pick another with --port"
        elif exc.errno == errno.EACCES:
            why = f"port {port} on {host} is not allowed for this user (ports below 1024 need privileges); pick another with --port"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = f"--host {host} is not an address of this machine"
        else:
            why = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        raise SystemRefusalError(why + ".") from None
    sock.set_inheritable(True)
    return sock


def serve(model: str | None, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None, ctx: int | None = None, queue: int = 16,
          kv_dtype: str | None = None, device: str | None = None, mem_budget: str | None = None, reserve: str | None = None,
          sampling: dict[str, Any] | None = None, max_tokens: int | None = None, log_requests: bool = True, verbose: bool = False,
          limits: Limits | None = None) -> int:
    """`tallow serve`: bind the port at once (health says 503), load, then serve until Ctrl-C or
    SIGTERM. Prints one ready line with the URL once the model answers.

    Shutdown at any moment is clean: requests in flight end with a 503 error (a stream with an
    error event and `[DONE]`), then the process exits 0 (SIGTERM) or 130 (Ctrl-C). A signal
    during the load exits without waiting for it: the loading thread is inside torch, and
    letting the interpreter finalize under it aborts ("terminate called without an active
    exception", exit 134), so the process leaves through os._exit once stdio is flushed."""
    import signal
    import sys
    import threading

    import uvicorn

    from ..api import LLM
    from .fd_guard import quiet_accept_errors, raise_fd_limit
    from .read_timeout import ReadTimeoutProtocol
    from .request_log import RequestLog

    if api_key is not None and not api_key.strip():
        from ..errors import UsageError

        raise UsageError("--api-key (or $TALLOW_API_KEY) is empty, which would leave the server open; give a key or leave the flag out.")

    def early_signal(signum: int, frame: Any) -> None:  # before the worker starts: just leave
        raise _StoppedEarly(signum)

    early = {sig: signal.signal(sig, early_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        sock = bind_socket(host, port)
        model_id, path, aliases = model_identity(model)  # may pull the model first
    except _StoppedEarly as stop:
        print(f"[tallow] stopped ({signal.Signals(stop.signum).name})", file=sys.stderr, flush=True)
        return 130 if stop.signum == signal.SIGINT else 0
    finally:
        for sig, handler in early.items():
            signal.signal(sig, handler)
    server: uvicorn.Server | None = None
    shown_host = f"[{host}]" if ":" in host else host
    url = f"http://{shown_host}:{port}"
    t0 = time.perf_counter()

    def on_load_error(exc: BaseException) -> None:
        print(f"tallow: error: {exc}", file=sys.stderr, flush=True)
        if server is not None:
            server.should_exit = True

    def on_ready() -> None:
        while server is not None and not server.started and not server.should_exit:
            time.sleep(0.01)  # uvicorn is about to accept on the bound socket
        if not server.should_exit:
            print(f"[tallow] ready: {model_id} at {url} (loaded in {time.perf_counter() - t0:.1f} s);"
                  f" the chat page is {url}/, the API {url}/v1", file=sys.stderr, flush=True)

    raise_fd_limit()
    quiet_accept_errors()
    worker = Worker(lambda: LLM(path, ctx=ctx, kv_dtype=kv_dtype, device=device, mem_budget=mem_budget, reserve=reserve),
                    max_queue=queue, on_load_error=on_load_error, sampling_defaults=sampling, max_tokens_default=max_tokens,
                    on_ready=on_ready, limits=limits)
    state = ServerState(worker, model_id, path, api_key, aliases, host=host)
    app: Any = create_app(state)
    if log_requests:
        app = RequestLog(app, verbose=verbose)
    config = uvicorn.Config(app, log_level="info" if verbose else "warning", timeout_graceful_shutdown=2, lifespan="off",
                            http=ReadTimeoutProtocol)
    server = uvicorn.Server(config)
    signals: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        if signals and signum == signal.SIGINT:
            server.force_exit = True  # a second Ctrl-C: stop waiting for connections
        signals.append(signum)
        server.should_exit = True
        # Not worker.stop() here: the handler may interrupt the main thread inside the
        # worker's lock; a thread takes it in turn.
        threading.Thread(target=worker.stop, daemon=True).start()

    print(f"[tallow] loading {model_id} for {url} …", file=sys.stderr, flush=True)
    worker.start()
    # uvicorn installs its own handlers inside run() and re-raises the signal afterwards;
    # capture_signals keeps ours as the "original" ones, so the re-raise lands here too.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    server.handle_exit = on_signal  # type: ignore[method-assign]
    try:
        server.run(sockets=[sock])
    finally:
        worker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = getattr(worker.load_error, "exit_code", 1) if worker.load_error is not None else (130 if signal.SIGINT in signals else 0)
    if signals:
        print(f"[tallow] stopped ({signal.Signals(signals[0]).name})", file=sys.stderr, flush=True)
    if worker.ready.is_set():
        worker._thread.join(timeout=5)  # a cancelled answer stops within a token
    if worker._thread.is_alive():  # still loading (or stuck in torch): see the docstring
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
