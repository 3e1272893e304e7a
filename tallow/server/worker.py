"""One thread owns the model; requests wait their turn in a bounded FIFO queue.

The engine runs one request at a time over one KV pool, and torch work blocks the thread
it runs on, so the HTTP event loop never touches the model: it validates a request, puts a
`Job` in the queue and awaits the job's events (`start`, `delta`…, `done` or `error`),
which the worker thread posts into the loop with `call_soon_threadsafe`.

The queue is our own deque rather than `queue.Queue` because a client that disconnects
while waiting must leave it at once (its slot is freed for the next client), which
`queue.Queue` cannot do. A running job is cancelled through `should_stop`, which the
engine checks after every token, so a disconnect frees the engine within one decode step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..chat.parsers import ParsedDelta
from ..errors import TallowError
from ..grammar import GrammarError, GrammarSpec
from ..sampling import SamplingParams
from .limits import Limits, prompt_too_long
from .protocol import APIError, ChatRequest, CompletionRequest, bad
from .. import switches

if TYPE_CHECKING:
    from ..api import PreparedChat

log = logging.getLogger("tallow.server")

# The worker thread's stack. The grammar engine compiles recursively in native code, where a
# stack overflow is a SIGSEGV of the whole server; grammar/limits.py keeps requests far below
# what 8 MiB survives, and this margin (address space only, touched pages alone cost memory)
# keeps an unforeseen deep input from taking the server down.
WORKER_STACK_BYTES = 256 << 20

# /health calls the worker stuck (503) when the running request has posted nothing (no token,
# no event) for this long. A long CPU prefill posts nothing until its first token, so the
# default is generous; TALLOW_STALL_TIMEOUT=SECONDS changes it.


def stall_timeout_s() -> float:
    return switches.value("TALLOW_STALL_TIMEOUT")


@dataclass
class Job:
    """One request on its way through the queue; events flow back to the HTTP handler."""

    request: ChatRequest | CompletionRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))
    finished: bool = False
    cut_short: bool = False  # the client went away before the answer was complete
    deadline: float | None = None  # time.monotonic() past which the request is ended (--timeout)
    timed_out: bool = False  # generation was ended by the deadline
    last_disconnect_check: float = field(default_factory=time.monotonic)  # when the handler last asked
    progress_at: float = field(default_factory=time.monotonic)  # when the worker last posted an event

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def should_stop(self) -> bool:
        """Checked by the engine between tokens: the client left, or --timeout ran out."""
        if self.cancelled.is_set():
            return True
        if self.past_deadline():
            self.timed_out = True
            return True
        return False

    def post(self, kind: str, payload: Any = None) -> None:
        """Hand an event to the request's event loop (from the worker thread)."""
        self.progress_at = time.monotonic()
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: the server is shutting down, nobody listens
            self.cancelled.set()


@dataclass
class WorkerCall:
    """Work other than a generation that needs the model's thread (an embedding): `fn(llm)`
    runs in queue order and its result comes back as the job's `done` event."""

    fn: Callable[[Any], Any]
    stream: bool = False


SHUTTING_DOWN = "The server is shutting down; the answer was cut short."


def shutdown_error() -> APIError:
    return APIError(503, SHUTTING_DOWN, "server_error", None, "server_shutting_down", {"Retry-After": "5"})


@dataclass
class Metrics:
    """Counters for /metrics; written by the worker thread, read by the event loop."""

    requests_total: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    requests_rejected_queue_full: int = 0
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    generated_tokens_total: int = 0
    cache_hits_total: int = 0
    prefill_seconds_total: float = 0.0
    decode_seconds_total: float = 0.0
    prefill_tokens_total: int = 0
    decode_tokens_total: int = 0
    last_prefill_tok_s: float = 0.0
    last_decode_tok_s: float = 0.0


def _server_sampling(overrides: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp server's defaults (SamplingParams'), overlaid with what the request set.

    The Python API defaults to greedy; an HTTP client that sends no temperature expects
    the sampling of an OpenAI-style server, as llama.cpp's server does.
    """
    defaults = asdict(SamplingParams())
    defaults.update(overrides)
    return defaults


class Worker:
    """Loads the model, then serves queued jobs one at a time on its own thread."""

    def __init__(self, loader: Callable[[], Any], max_queue: int = 16, on_load_error: Callable[[BaseException], None] | None = None,
                 sampling_defaults: dict[str, Any] | None = None, max_tokens_default: int | None = None,
                 on_ready: Callable[[], None] | None = None, limits: Limits | None = None) -> None:
        if max_queue < 1:
            raise ValueError(f"the queue must hold at least one request, not {max_queue}")
        self.loader = loader
        self.max_queue = max_queue
        self.limits = limits or Limits()
        self.on_load_error = on_load_error
        self.on_ready = on_ready
        self.sampling_defaults = dict(sampling_defaults or {})  # `tallow serve --temp ...`: what a request leaves out
        self.max_tokens_default = max_tokens_default
        self.llm: Any = None
        self.load_error: BaseException | None = None
        self.ready = threading.Event()
        self.metrics = Metrics()
        self.running: Job | None = None
        self._pending: deque[Job] = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="tallow-worker", daemon=True)

    # -- control from the event loop ---------------------------------------------------------
    def start(self) -> None:
        previous = threading.stack_size(WORKER_STACK_BYTES)
        try:
            self._thread.start()
        finally:
            threading.stack_size(previous)

    def stop(self) -> None:
        """Shut down: waiting jobs are answered 503 at once, the running one is cut after its
        current token and ends with the same error event (a stream then sends `[DONE]`)."""
        with self._cv:
            self._stopping = True
            for job in self._pending:
                job.cancelled.set()
                job.post("error", shutdown_error())
            self._pending.clear()
            if self.running is not None:
                self.running.cancelled.set()
            self._cv.notify_all()

    def stalled(self) -> str | None:
        """Why the worker looks stuck (for /health), or None while it makes progress."""
        job = self.running
        if job is None:
            return None
        idle = time.monotonic() - job.progress_at
        bound = stall_timeout_s()
        if idle <= bound:
            return None
        return f"the worker has made no progress on request {job.id} for {idle:.0f} s (the bound is {bound:g} s, TALLOW_STALL_TIMEOUT)"

    @property
    def queue_depth(self) -> int:
        return len(self._pending)

    def submit(self, job: Job) -> None:
        """Queue a job, or raise 503 (with Retry-After) while loading or when the queue is full."""
        if self._stopping:
            raise shutdown_error()
        if not self.ready.is_set():
            raise APIError(503, "The model is still loading; retry in a few seconds.", "server_error", None, "model_loading", {"Retry-After": "2"})
        with self._cv:
            if len(self._pending) >= self.max_queue:
                self.metrics.requests_rejected_queue_full += 1
                raise APIError(
                    503,
                    f"The server is busy: {len(self._pending)} requests are already waiting (the queue holds {self.max_queue}).",
                    "server_error",
                    None,
                    "queue_full",
                    {"Retry-After": "1"},
                )
            if self.limits.request_timeout_s is not None:
                job.deadline = time.monotonic() + self.limits.request_timeout_s
            self._pending.append(job)
            self._cv.notify()

    def cancel(self, job: Job, client_left: bool = True) -> None:
        """The client went away (or --timeout ran out while queued: client_left False, not counted
        as a cancellation): leave the queue, or stop generating after the current token."""
        job.cancelled.set()
        with self._cv:
            try:
                self._pending.remove(job)
            except ValueError:
                pass  # already running or finished
            else:
                self.metrics.requests_cancelled += 1 if client_left else 0

    # -- the worker thread -------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self.llm = self.loader()
        except BaseException as exc:  # noqa: BLE001 - reported to the server, which exits with it
            self.load_error = exc
            if self.on_load_error is not None:
                self.on_load_error(exc)
            else:
                log.error("tallow: error: %s", exc)
            return
        self.ready.set()
        if self.on_ready is not None:
            self.on_ready()
        while True:
            with self._cv:
                while not self._pending and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                job = self._pending.popleft()
                job.progress_at = time.monotonic()
                self.running = job
            try:
                if not job.cancelled.is_set() and not job.past_deadline():  # else its handler answers 503
                    self._serve(job)
            finally:
                with self._cv:
                    self.running = None

    def _serve(self, job: Job) -> None:
        """Run one job; every failure becomes an error event, never a dead worker."""
        if isinstance(job.request, WorkerCall):
            try:
                job.post("done", job.request.fn(self.llm))
            except TallowError as exc:
                job.post("error", bad(str(exc)))
            except Exception as exc:  # noqa: BLE001 - one bad request must not take the server down
                log.error("request %s failed:\n%s", job.id, traceback.format_exc())
                job.post("error", APIError(500, f"The server failed ({type(exc).__name__}: {exc}).", "server_error", None, "internal_error"))
            return
        m = self.metrics
        m.requests_total += 1
        cut = False
        try:
            cut = self._generate(job)
        except APIError as exc:
            m.requests_failed += 1
            job.post("error", exc)
        except GrammarError as exc:  # a schema or grammar that cannot be enforced: the field is named
            m.requests_failed += 1
            job.post("error", bad(str(exc), exc.param, "invalid_value"))
        except TallowError as exc:
            m.requests_failed += 1
            job.post("error", bad(str(exc)))
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the server down
            m.requests_failed += 1
            log.error("request %s failed:\n%s", job.id, traceback.format_exc())
            job.post("error", APIError(500, f"The server failed while generating ({type(exc).__name__}: {exc}).", "server_error", None, "internal_error"))
        if cut:
            m.requests_cancelled += 1

    def _prompt(self, job: Job) -> tuple[list[int], PreparedChat | None, GrammarSpec]:
        """The prompt's token ids, the prepared chat (LLM.prepare_chat: the tool-choice rule, the
        grammar, the parser — the API's own) and what the answer is constrained to."""
        llm = self.llm
        req = job.request
        if isinstance(req, CompletionRequest):
            spec = GrammarSpec(req.response_format, req.grammar)
            if isinstance(req.prompt, str):
                return llm.tokenize(req.prompt), None, spec
            vocab = llm.spec.vocab_size
            if any(t >= vocab for t in req.prompt):
                raise bad(f"'prompt' holds a token id outside the vocabulary (0..{vocab - 1}).", "prompt", "invalid_value")
            return list(req.prompt), None, spec
        chat = llm.prepare_chat(req.messages, req.tools, req.template_kwargs, req.tool_choice, req.parallel_tool_calls,
                                req.response_format, req.grammar)
        return chat.ids, chat, chat.spec

    def _generate(self, job: Job) -> bool:
        """Generate and post the job's events; True when its client went away before the end."""
        llm = self.llm
        req = job.request
        ids, chat, spec = self._prompt(job)
        n_prompt, n_ctx = len(ids), llm.n_ctx
        if n_prompt >= n_ctx:
            raise bad(f"The prompt has {n_prompt} tokens, but the context holds only {n_ctx}, leaving no room for an answer.", "messages" if isinstance(req, ChatRequest) else "prompt", "context_length_exceeded")
        limit = self.limits.max_prompt_tokens
        if limit is not None and n_prompt > limit:
            raise prompt_too_long(n_prompt, limit, "messages" if isinstance(req, ChatRequest) else "prompt")
        max_tokens = req.max_tokens
        cap = self.limits.max_output_tokens
        if cap is not None and max_tokens is not None and max_tokens > cap:
            max_tokens = cap  # the server's bound wins, as llama.cpp's -n does
        if max_tokens is None:
            default = self.max_tokens_default if cap is None else cap if self.max_tokens_default is None else min(cap, self.max_tokens_default)
            max_tokens = n_ctx - n_prompt if default is None else min(default, n_ctx - n_prompt)
        elif n_prompt + max_tokens > n_ctx:
            raise bad(
                f"The prompt has {n_prompt} tokens and max_tokens asks for {max_tokens} more, {n_prompt + max_tokens} in all, but the context holds {n_ctx}.",
                "max_tokens",
                "context_length_exceeded",
            )
        options = dict(max_tokens=max_tokens, stop=req.stop, should_stop=job.should_stop, conversation_id=req.conversation_id,
                       logprobs=req.logprobs, **_server_sampling({**self.sampling_defaults, **req.sampling}))
        if chat is not None:  # the API's parsed chat events: reasoning, content, tool calls
            events = llm.chat_events(chat, **options)
        else:
            texts = llm.generate(ids, stream=True, constrain=spec, skip_special_tokens=req.skip_special_tokens, **options)
            events = (ParsedDelta(content=text) for text in texts)
        job.post("start", {"prompt_tokens": n_prompt})
        sent_logprobs = 0
        for delta in events:
            if req.logprobs is not None and len(llm.last_logprobs) > sent_logprobs:
                job.post("logprobs", llm.last_logprobs[sent_logprobs:])  # the tokens behind this text
                sent_logprobs = len(llm.last_logprobs)
            if delta:
                job.post("delta", delta)
            if job.cancelled.is_set():
                break
        # Cancelled means the client went away before the end: decided here, when generation
        # stopped. A stream read to [DONE] also cancels its job (its handler's finally), but
        # only after this point, so it never counts.
        cut = job.cut_short = job.cancelled.is_set()
        if req.logprobs is not None and len(llm.last_logprobs) > sent_logprobs:
            job.post("logprobs", llm.last_logprobs[sent_logprobs:])
        if self._stopping:  # cut by shutdown: the client must not take it for a whole answer
            raise shutdown_error()
        stats = llm.stats.last
        n_generated = len(llm.last_tokens)
        finish = stats.finish_reason or "stop"
        if chat is not None and chat.parser.tool_calls:
            finish = "tool_calls"
        elif job.timed_out and not job.cut_short:
            finish = "length"  # cut by --timeout, as llama.cpp's t_max_predict_ms ends an answer
        m = self.metrics
        m.prompt_tokens_total += n_prompt
        m.cached_tokens_total += stats.reused_tokens
        m.cache_hits_total += 1 if stats.reused_tokens > 0 else 0
        m.generated_tokens_total += n_generated
        m.prefill_tokens_total += stats.prefill_tokens
        m.prefill_seconds_total += stats.prefill_s
        m.decode_tokens_total += stats.decode_tokens
        m.decode_seconds_total += stats.decode_s
        # The speed gauges keep their last real value: a request that prefilled nothing (all
        # cached) or decoded nothing (cancelled, one token) has no speed to report.
        if stats.prefill_tokens > 0 and stats.prefill_s > 0:
            m.last_prefill_tok_s = stats.prefill_tok_s
        if stats.decode_tokens > 0 and stats.decode_s > 0:
            m.last_decode_tok_s = stats.decode_tok_s
        job.post(
            "done",
            {
                "finish_reason": finish,
                "usage": {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": n_generated,
                    "total_tokens": n_prompt + n_generated,
                    "prompt_tokens_details": {"cached_tokens": stats.reused_tokens},
                },
                "timings": {
                    "prompt_n": stats.prefill_tokens,
                    "prompt_ms": stats.prefill_s * 1000,
                    "prompt_per_second": stats.prefill_tok_s,
                    "cache_n": stats.reused_tokens,
                    "predicted_n": n_generated,
                    "predicted_ms": stats.decode_s * 1000,
                    "predicted_per_second": stats.decode_tok_s,
                    "draft_n": stats.draft_tokens,  # speculative decoding, as llama.cpp's server names them
                    "draft_n_accepted": stats.accepted_tokens,
                    "grammar_steered_n": stats.grammar_steered,  # > 0: a constrained answer was closed early to fit max_tokens
                    "ttft_ms": stats.ttft_s * 1000,
                    "machine": stats.machine,  # clocks, temperature, power, load as it ended
                },
            },
        )
        return cut
