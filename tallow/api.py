"""The Python API — the product. The CLI and the server are its clients.

    import tallow
    llm = tallow.load("smollm2-135m", ctx=4096)
    print(llm.generate("The capital of France is", max_tokens=16, temperature=0).text)
    for delta in llm.chat([{"role": "user", "content": "Hi"}], stream=True):
        print(delta, end="")
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .chat.template import ChatTemplate
from .engine.engine import Engine, GenerationStats
from .errors import UsageError
from .gguf_file import GGUFFile
from .models import build_model
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
    finish_reason: str  # "stop" (EOG token or stop string) | "length"
    stats: GenerationStats


@dataclass
class LoadStats:
    path: str
    load_s: float
    weights_bytes: int
    kv_bytes: int


@dataclass
class Stats:
    load: LoadStats
    last: GenerationStats | None = None
    history: list[GenerationStats] = field(default_factory=list)


class LLM:
    """One loaded model with its tokenizer, chat template and engine."""

    def __init__(self, path: str | Path, ctx: int | None = None, linear_mode: str | None = None):
        t0 = time.perf_counter()
        self.path = str(path)
        self.gguf = GGUFFile(path)
        self.spec = spec_from_gguf(self.gguf)
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        self.template = ChatTemplate.from_gguf(self.gguf)
        if ctx is not None and (not isinstance(ctx, int) or ctx < 16):
            raise UsageError(f"the context size must be an integer of at least 16, not {ctx!r}.")
        n_ctx = ctx or min(self.spec.context_length, DEFAULT_CTX)
        if n_ctx > self.spec.context_length:
            raise UsageError(f"a context of {n_ctx} exceeds what the model was trained for ({self.spec.context_length}).")
        self.model = build_model(self.gguf, self.spec, linear_mode)
        self.gguf.release_pages()
        self.engine = Engine(self.model, n_ctx)
        self.n_ctx = n_ctx
        self.stats = Stats(LoadStats(self.path, time.perf_counter() - t0, self.model.nbytes, self.engine.kv.nbytes))

    # -- text <-> tokens -------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special=True)

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **template_kwargs: Any) -> list[int]:
        """The token ids of a chat rendered with the model's template, ready to generate from."""
        text = self.template.render(messages, tools=tools, add_generation_prompt=True, **template_kwargs)
        text = self.template.prompt_for_tokenizer(text, self.tokenizer.add_bos)
        return self.tokenizer.encode(text, add_special=True, parse_special=True)

    # -- generation ------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[int],
        max_tokens: int = 256,
        stream: bool = False,
        stop: list[str] | str | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        **sampling: Any,
    ) -> Completion | Iterator[str]:
        """Continue `prompt` (text, tokenized with add-BOS as the model says, or token ids).

        Sampling keywords: temperature (0 = greedy, the default), top_k, top_p, min_p,
        repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty, seed.
        With stream=True returns an iterator of text deltas; `llm.stats.last` holds the
        counters once it is exhausted.
        """
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        return self._run(ids, max_tokens, stream, stop, should_stop, sampling)

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int = 1024,
        stream: bool = False,
        stop: list[str] | str | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        template_kwargs: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> Completion | Iterator[str]:
        """Answer a conversation (OpenAI-style messages) through the model's chat template."""
        ids = self.chat_prompt(messages, tools, **(template_kwargs or {}))
        return self._run(ids, max_tokens, stream, stop, should_stop, sampling)

    def _run(self, ids, max_tokens, stream, stop, should_stop, sampling) -> Completion | Iterator[str]:
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise UsageError(f"max_tokens must be a positive integer, not {max_tokens!r}.")
        if not ids:
            raise UsageError("the prompt is empty: there is nothing to continue from.")
        if len(ids) >= self.n_ctx:
            raise UsageError(f"the prompt has {len(ids)} tokens, but the context holds {self.n_ctx}.")
        sampling.setdefault("temperature", 0.0)
        params = SamplingParams(**sampling)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        deltas = self._stream(ids, max_tokens, params, stops, should_stop)
        if stream:
            return deltas
        text = "".join(deltas)
        last = self.stats.last
        return Completion(text, self._last_tokens, last.finish_reason, last)

    def _stream(self, ids, max_tokens, params, stops, should_stop) -> Iterator[str]:
        stats = GenerationStats()
        self.stats.last = stats
        self.stats.history.append(stats)
        self._last_tokens: list[int] = []
        sampler = Sampler(params, self.spec.vocab_size)
        decoder = StreamDecoder(self.tokenizer, skip_special=True)  # like llama.cpp's completion text
        matcher = StopMatcher(stops)
        stopped = False
        for token in self.engine.generate(ids, max_tokens, sampler, self.tokenizer.eog_ids, stats, should_stop):
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


def load(model: str | Path | None = None, ctx: int | None = None, progress: bool = True, linear_mode: str | None = None) -> LLM:
    """Load a model by registry name (pulled on first use), alias, or GGUF path; None = the default."""
    path = resolve_model(None if model is None else str(model), pull_missing=True, progress=progress)
    return LLM(path, ctx=ctx, linear_mode=linear_mode)
