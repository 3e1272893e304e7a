"""The Python API — the product. The CLI and the server are its clients.

    import tallow
    llm = tallow.load("smollm2-135m", ctx=4096)
    print(llm.generate("The capital of France is", max_tokens=16, temperature=0).text)
    for delta in llm.chat([{"role": "user", "content": "Hi"}], stream=True):
        print(delta, end="")
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import switches
from .chat.parsers import ChatOutputParser, ParsedDelta, syntax_for_template
from .chat.template import ChatTemplate
from .engine.engine import Engine, GenerationStats
from .errors import UsageError
from .grammar import GrammarSpec, build_constraint
from .kernels.gpu.machine_state import machine_state
from .gguf_file import GGUFFile
from .memory.budget import default_budget, plan_memory
from .memory import heap
from .memory.heap import bound_heap
from .memory.weight_cache import WeightCache
from .models import build_model
from .numerics_choice import choose as choose_numerics
from .registry import resolve_model
from .sampling import Sampler, SamplingParams
from .spec import spec_from_gguf
from .stop import StopMatcher
from .tokenizer import StreamDecoder, Tokenizer

DEFAULT_CTX = 4096


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (EOG token or stop string; also a grammar's answer closed to fit max_tokens, see stats.grammar_steered) | "length"
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None
    tool_calls: list[Any] | None = None  # chat with tools: the calls parsed from `text` (chat.parsers.ToolCall)
    reasoning: str | None = None  # chat: the thinking (`<think>...</think>`, Gemma 4's thought channel) split out of `text`, as the server's reasoning_content


@dataclass
class PreparedChat:
    """A chat request made ready to generate (LLM.prepare_chat): the prompt's token ids, the
    tools offered (none for tool_choice "none"), the constraint on the answer and the parser
    that LLM.chat_events feeds (its `tool_calls` hold the complete calls once the stream ends)."""

    ids: list[int]
    tools: list[dict[str, Any]] | None
    spec: GrammarSpec
    parser: ChatOutputParser


@dataclass
class TokenLogprob:
    """A generated token's log-probability under the model (log-softmax of its raw logits, before
    penalties and temperature), with the `top` most likely alternatives at that step."""

    token: int
    text: str
    bytes: bytes
    logprob: float
    top: list[tuple[int, str, bytes, float]] = field(default_factory=list)
    special: bool = False  # a special token: its text is left out of the answer unless skip_special_tokens=False


@dataclass
class LoadStats:
    path: str
    load_s: float
    weights_bytes: int
    kv_bytes: int
    weight_cache: str = "off"  # "hit" (mapped from disk), "written" (packed, then cached), "not written", "off"


@dataclass
class Stats:
    load: LoadStats
    last: GenerationStats | None = None
    history: list[GenerationStats] = field(default_factory=list)


class LLM:
    """One loaded model with its tokenizer, chat template and engine."""

    def __init__(
        self,
        path: str | Path,
        ctx: int | None = None,
        linear_mode: str | None = None,
        mem_budget: str | int | None = None,
        reserve: str | int | None = None,
        device: str | None = None,
        kv_dtype: str | None = None,
        progress: bool | None = None,
    ):
        """device: "cpu", "cuda" or "cuda:N"; default $TALLOW_DEVICE, else cuda when a GPU is present.
        kv_dtype: "f16", "bf16", "int8" or "fp8" (default f16, or $TALLOW_KV_DTYPE; see
        memory/budget.default_kv_dtype).
        mem_budget ('3GiB', '80%' of MemAvailable, bytes; default $TALLOW_MEM_BUDGET or all
        of MemAvailable) and reserve (kept free for co-tenants) bound the memory account
        (`self.memory`), checked before any weight is loaded: MemoryBudgetError if it does not fit.
        On the CPU the packed weights are cached on disk (memory/weight_cache.py) and mapped by the
        next load; progress: a bar on stderr while packing (None: only on a terminal)."""
        t0 = time.perf_counter()
        switches.refresh()  # every TALLOW_* variable is parsed here, once per load: a bad value is one sentence
        switches.current()
        bound_heap()  # one malloc arena (and, opt-in, large temporaries unmapped on free): the peak stays the planned one
        self.path = str(path)
        self.gguf = GGUFFile(path)
        self.spec = spec_from_gguf(self.gguf)
        self.device = resolve_device(device)
        self.numerics = choose_numerics(self.gguf, self.device, linear_mode)  # llama.cpp's arithmetic or torch's
        self.memory = plan_memory(self.gguf, ctx if isinstance(ctx, int) and ctx >= 16 else None,  # type: ignore[arg-type]
                                  default_budget() if mem_budget is None else mem_budget, reserve, linear_mode, spec=self.spec, default_ctx=DEFAULT_CTX,
                                  kv_dtype=kv_dtype, device=self.device, numerics=self.numerics)
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        self.template = ChatTemplate.from_gguf(self.gguf)
        self.gguf.drop_vocabulary()
        if ctx is not None and (not isinstance(ctx, int) or ctx < 16):
            raise UsageError(f"the context size must be an integer of at least 16, not {ctx!r}.")
        n_ctx = ctx or min(self.spec.context_length, DEFAULT_CTX)
        if n_ctx > self.spec.context_length:
            raise UsageError(f"a context of {n_ctx} exceeds what the model was trained for ({self.spec.context_length}).")
        self.memory.check()  # refuse before loading weights, never mid-answer
        self.weight_cache = WeightCache.open(self.gguf, self.device, linear_mode, progress, self.numerics)
        try:
            self.model = build_model(self.gguf, self.spec, linear_mode, self.device, self.weight_cache, self.numerics)
        finally:
            if self.weight_cache is not None:
                self.weight_cache.stop_progress()
        cache_status = self.weight_cache.save() if self.weight_cache is not None else "off"
        self.gguf.release_pages()
        heap.return_freed()  # the repacking temporaries
        self.engine = Engine(self.model, n_ctx, kv_dtype=self.memory.kv_dtype)
        self.n_ctx = n_ctx
        self.stats = Stats(LoadStats(self.path, time.perf_counter() - t0, self.model.nbytes, self.engine.kv.nbytes, cache_status))

    # -- text <-> tokens -------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special=True)

    def embed(self, text: str | list[int], pooling: str = "mean") -> list[float]:
        """An embedding of `text` (or token ids): the final-norm hidden states of a chat/base
        model, mean-pooled over the tokens ("mean") or the last token's ("last"), scaled to
        unit length. Not a trained embedding model's vector: good for similarity within this
        model, not comparable across models. Clears the prefix cache (it reuses the KV pool)."""
        import torch

        ids = self.tokenize(text) if isinstance(text, str) else list(text)
        if not ids or len(ids) > self.n_ctx:
            raise UsageError(f"an embedding input needs 1 to {self.n_ctx} tokens, not {len(ids)}.")
        if pooling not in ("mean", "last"):
            raise UsageError(f"pooling must be 'mean' or 'last', not {pooling!r}.")
        h = self.model.hidden_states(ids, self.engine.kv)  # (n, dim)
        v = h.mean(0) if pooling == "mean" else h[-1]
        return torch.nn.functional.normalize(v, dim=0).cpu().tolist()

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    tool_choice: str | dict[str, Any] = "auto", **template_kwargs: Any) -> str:
        """The chat as the model's template writes it, with the generation prompt (what
        llama-server's /apply-template answers). tool_choice "none" offers no tools."""
        return self.template.render(messages, tools=_offered(tools, tool_choice), add_generation_prompt=True, **template_kwargs)

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        assistant_prefix: str = "",
        **template_kwargs: Any,
    ) -> list[int]:
        """The token ids of a chat rendered with the model's template, ready to generate from.

        `assistant_prefix` is text the answer is made to start with (appended after the
        generation prompt, special tokens parsed). Tool calls are forced by grammar instead
        (`chat(..., tool_choice="required")`), which also checks the arguments.
        """
        text = self.render_chat(messages, tools, **template_kwargs) + assistant_prefix
        text = self.template.prompt_for_tokenizer(text, self.tokenizer.add_bos)
        return self.tokenizer.encode(text, add_special=True, parse_special=True)

    @property
    def context_used(self) -> int:
        """Tokens whose K/V the cache holds now (the prefix the next request may reuse)."""
        return len(self.engine.kv.tokens)

    @property
    def last_tokens(self) -> list[int]:
        """The token ids generated by the latest request (so far, while it streams)."""
        return list(getattr(self, "_last_tokens", []))

    # -- generation ------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[int],
        max_tokens: int = 256,
        stream: bool = False,
        stop: list[str] | str | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        response_format: dict[str, Any] | None = None,
        grammar: str | None = None,
        constrain: GrammarSpec | None = None,
        **sampling: Any,
    ) -> Completion | Iterator[str]:
        """Continue `prompt` (text, tokenized with add-BOS as the model says, or token ids).

        Constrained decoding (every token masked by a grammar before sampling):
        response_format={"type": "json_object"} or {"type": "json_schema", "json_schema":
        {"schema": {...}}} makes the output valid JSON (under the schema); grammar="..." takes
        a Lark grammar (llguidance's dialect) or a GBNF one (`root ::= ...`). `constrain` is the
        whole request at once (tool calls included), for callers that rendered a chat prompt
        themselves. An unsupported schema or grammar raises GrammarError (a UsageError).

        Sampling keywords: temperature (0 = greedy, the default), top_k, top_p, min_p,
        repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed.
        logprobs=k (0-20) records each token's log-probability and its k best alternatives
        (`Completion.logprobs`, or `llm.last_logprobs` while streaming); a special token's text
        is its marker (`<tool_call>`). skip_special_tokens=False keeps special tokens in the
        text (the end-of-generation token that ends the answer is never part of it).
        With stream=True returns an iterator of text deltas; `llm.stats.last` holds the
        counters once it is exhausted.
        """
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        spec = constrain or GrammarSpec(response_format=response_format, grammar=grammar)
        return self._run(ids, max_tokens, stream, stop, should_stop, sampling, spec)

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int = 1024,
        stream: bool = False,
        stop: list[str] | str | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        template_kwargs: dict[str, Any] | None = None,
        tool_choice: str | dict[str, Any] = "auto",
        parallel_tool_calls: bool = True,
        response_format: dict[str, Any] | None = None,
        grammar: str | None = None,
        **sampling: Any,
    ) -> Completion | Iterator[str]:
        """Answer a conversation (OpenAI-style messages) through the model's chat template.

        With `tools`, tool_choice is OpenAI's: "auto" (free text; once the model opens a call
        the rest of it is grammar-constrained, unless TALLOW_GRAMMAR_AUTO=0), "none", "required"
        or {"type": "function", "function": {"name": ...}} (the answer is a call in the model's
        own syntax whose arguments validate against the tool's schema; several calls unless
        parallel_tool_calls=False). A non-streamed answer carries the parsed `tool_calls`.
        response_format and grammar work as in `generate`.

        `conversation_id="..."` (a sampling-style keyword) keeps the conversation's KV on disk
        under $TALLOW_HOME/kv: the next turn, even after a restart, prefills only what is new.

        A whole answer is parsed as the server parses it: `text` is the answer, `reasoning` the
        thinking split out of it (None when there is none). stream=True yields the raw text;
        `chat_events` streams it parsed.
        """
        chat = self.prepare_chat(messages, tools, template_kwargs, tool_choice, parallel_tool_calls, response_format, grammar)
        out = self._run(chat.ids, max_tokens, stream, stop, should_stop, sampling, chat.spec)
        if isinstance(out, Completion):
            parsed = chat.parser.push(out.text)
            parsed.extend(chat.parser.flush())
            out.text, out.reasoning = parsed.content, parsed.reasoning or None
            if chat.tools:
                out.tool_calls = parsed.tool_calls
        return out

    def chat_events(
        self,
        messages: "list[dict[str, Any]] | PreparedChat",
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int = 1024,
        stop: list[str] | str | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        template_kwargs: dict[str, Any] | None = None,
        tool_choice: str | dict[str, Any] = "auto",
        parallel_tool_calls: bool = True,
        response_format: dict[str, Any] | None = None,
        grammar: str | None = None,
        **sampling: Any,
    ) -> Iterator[ParsedDelta]:
        """`chat` streamed as parsed events, what the server streams: each `ParsedDelta` holds
        `reasoning` and `content` text, `call_deltas` (a call's id and name first, then its
        arguments as the model writes them) and `tool_calls` (each call once complete).
        Arguments are as for `chat`; a bad request raises at call time. `messages` may instead be
        a PreparedChat (prepare_chat), for a caller that checks the prompt's length first, as the
        server does; the request's own arguments are then in it."""
        chat = messages if isinstance(messages, PreparedChat) else self.prepare_chat(
            messages, tools, template_kwargs, tool_choice, parallel_tool_calls, response_format, grammar)
        deltas = self._run(chat.ids, max_tokens, True, stop, should_stop, sampling, chat.spec)
        return _parsed(deltas, chat.parser)

    def prepare_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                     template_kwargs: dict[str, Any] | None = None, tool_choice: str | dict[str, Any] = "auto",
                     parallel_tool_calls: bool = True, response_format: dict[str, Any] | None = None,
                     grammar: str | None = None) -> PreparedChat:
        """The one place a chat request becomes a prompt, a constraint and a parser (for `chat`,
        `chat_events` and the server): the tools offered (none for tool_choice "none"), the
        grammar spec, the <think> detection of the prompt's end. Generate from it once: its
        parser keeps the answer's state."""
        offered = _offered(tools, tool_choice)
        ids = self.chat_prompt(messages, offered, **(template_kwargs or {}))
        spec = GrammarSpec(response_format, grammar, offered, tool_choice, parallel_tool_calls)
        return PreparedChat(ids, offered, spec, self.chat_parser(ids, offered))

    def chat_parser(self, prompt_ids: list[int], tools: list[dict[str, Any]] | None) -> ChatOutputParser:
        """The parser of a chat answer (reasoning, content, tool calls), shared by the API and the server."""
        # A template that opens the thinking block itself (Qwen3 with thinking on) puts the
        # model inside it from the first token.
        tail = self.tokenizer.decode(prompt_ids[-4:], skip_special=False).rstrip()
        names = [t["function"]["name"] for t in tools or []]
        syntax = syntax_for_template(self.template.source)  # Gemma 4 writes its own thought and call syntax
        opened = tail.endswith("<|channel>thought") if syntax == "gemma4" else tail.endswith("<think>")
        return ChatOutputParser(names or None, parse_tools=bool(tools), starts_in_reasoning=opened, syntax=syntax)

    def _run(self, ids, max_tokens, stream, stop, should_stop, sampling, spec: GrammarSpec | None = None) -> Completion | Iterator[str]:
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise UsageError(f"max_tokens must be a positive integer, not {max_tokens!r}.")
        if not ids:
            raise UsageError("the prompt is empty: there is nothing to continue from.")
        if len(ids) >= self.n_ctx:
            raise UsageError(f"the prompt has {len(ids)} tokens, but the context holds {self.n_ctx}.")
        conversation_id = sampling.pop("conversation_id", None)
        logprobs = sampling.pop("logprobs", None)
        skip_special = sampling.pop("skip_special_tokens", True)
        if not isinstance(skip_special, bool):
            raise UsageError(f"skip_special_tokens must be true or false, not {skip_special!r}.")
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= 20):
            raise UsageError(f"logprobs must be an integer from 0 to 20 (alternatives per token), not {logprobs!r}.")
        sampling.setdefault("temperature", 0.0)
        params = SamplingParams(**sampling)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        # Compiled here, not in the generator: a bad schema is an error at call time. Its budget
        # is what the engine will sample, the end-of-generation token included: max_tokens, or
        # fewer when the context fills first (the engine stops once the prompt and answer reach n_ctx).
        budget = min(max_tokens, self.n_ctx - len(ids) + 1)
        constraint = build_constraint(self.tokenizer, self.spec.vocab_size, spec, self.template.source, budget, params.greedy) if spec else None
        deltas = self._stream(ids, max_tokens, params, stops, should_stop, conversation_id, logprobs, constraint, skip_special)
        if stream:
            return deltas
        text = "".join(deltas)
        last = self.stats.last
        return Completion(text, self._last_tokens, last.finish_reason, last, self.last_logprobs if logprobs is not None else None)

    def _token_logprob(self, k: int, token: int, logits) -> TokenLogprob:
        import torch

        logp = torch.log_softmax(logits.float(), dim=-1)

        def piece(i: int) -> tuple[str, bytes]:
            # Special tokens carry their text (`<tool_call>`, `<|im_end|>`), or they could not be told apart.
            raw = self.tokenizer.token_to_bytes(i, special=True)
            return raw.decode("utf-8", errors="replace"), raw

        top = []
        if k:
            values, indices = torch.topk(logp, k)
            top = [(int(i), *piece(int(i)), float(v)) for v, i in zip(values.tolist(), indices.tolist())]
        text, raw = piece(token)
        special = self.tokenizer.token_to_bytes(token, special=False) != raw
        return TokenLogprob(token, text, raw, float(logp[token]), top, special)

    def machine_state(self) -> dict:
        """The machine now: load average and CPU frequency; on a GPU also its clocks,
        temperature and power (NVML). Fields a system does not expose are left out."""
        return machine_state(self.model.device)

    def _stream(self, ids, max_tokens, params, stops, should_stop, conversation_id=None, logprobs=None, constraint=None, skip_special=True) -> Iterator[str]:
        stats = GenerationStats()
        self.stats.last = stats
        self.stats.history.append(stats)
        self._last_tokens: list[int] = []
        self.last_logprobs: list[TokenLogprob] = []  # filled as tokens come when logprobs is set
        observe = None
        if logprobs is not None:
            observe = lambda token, logits: self.last_logprobs.append(self._token_logprob(logprobs, token, logits))  # noqa: E731
        sampler = Sampler(params, self.spec.vocab_size, constraint)
        decoder = StreamDecoder(self.tokenizer, skip_special=skip_special)  # by default like llama.cpp's completion text
        matcher = StopMatcher(stops)
        stopped = False
        for token in self.engine.generate(ids, max_tokens, sampler, self.tokenizer.eog_ids, stats, should_stop, conversation_id, observe):
            self._last_tokens.append(token)
            emit, stopped = matcher.push(decoder.push(token))
            if emit:
                yield emit
            if stopped:
                stats.finish_reason = "stop"
                break
        if not stopped:
            emit, _ = matcher.push(decoder.flush())
            tail = emit + matcher.flush()
            if tail:
                yield tail
        if constraint is not None:
            stats.grammar_steered = constraint.steered
        stats.machine = self.machine_state()


def _offered(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tools a chat offers the model: none for tool_choice "none" (OpenAI's rule)."""
    return tools if tool_choice != "none" else None


def _parsed(deltas: Iterator[str], parser: ChatOutputParser) -> Iterator[ParsedDelta]:
    for text in deltas:
        delta = parser.push(text)
        if delta:
            yield delta
    tail = parser.flush()
    if tail:
        yield tail


def resolve_device(device: str | None) -> str:
    """The device to run on: the argument, else $TALLOW_DEVICE, else cuda when a GPU is present."""
    import torch

    device = device or switches.value("TALLOW_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise UsageError(f"unknown device {device!r}: use cpu, cuda or cuda:N.")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"device {device!r} was asked for, but this torch build sees no CUDA GPU.")
        try:
            import triton  # noqa: F401
        except ImportError:
            raise UsageError("the GPU path needs Triton: pip install 'tallow[gpu]'.") from None
    return device


def load(
    model: str | Path | None = None,
    ctx: int | None = None,
    progress: bool = True,
    linear_mode: str | None = None,
    mem_budget: str | int | None = None,
    reserve: str | int | None = None,
    device: str | None = None,
    kv_dtype: str | None = None,
) -> LLM:
    """Load a model by registry name (pulled on first use), alias, or GGUF path; None = the default."""
    path = resolve_model(None if model is None else str(model), pull_missing=True, progress=progress)
    return LLM(path, ctx=ctx, linear_mode=linear_mode, mem_budget=mem_budget, reserve=reserve, device=device,
               kv_dtype=kv_dtype, progress=None if progress else False)
