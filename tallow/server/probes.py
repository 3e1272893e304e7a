"""The endpoints agent tools and llama.cpp clients probe before they talk: `/tokenize`,
`/detokenize` and `/props` in llama-server's shapes, and OpenAI's `/v1/embeddings`.

Tokenizing runs on the event loop (the tokenizer is plain Python and holds no engine state);
embeddings need a forward pass, so they queue on the worker like a generation.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request

from .protocol import APIError, bad, parse_json_body
from .worker import Job, WorkerCall

EMBEDDING_POOLING = ("mean", "last")


def _ready_llm(state) -> Any:
    worker = state.worker
    if worker.llm is None:
        raise APIError(503, "The model is still loading; retry in a few seconds.", "server_error", None, "model_loading", {"Retry-After": "2"})
    return worker.llm


def _token_ids(value: Any, field: str, vocab: int) -> list[int]:
    if not isinstance(value, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in value):
        raise bad(f"'{field}' must be an array of token ids.", field, "invalid_type")
    if any(not 0 <= t < vocab for t in value):
        raise bad(f"'{field}' holds a token id outside the vocabulary (0..{vocab - 1}).", field, "invalid_value")
    return value


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise bad(f"'{key}' must be true or false.", key, "invalid_type")
    return value


def _piece(llm, token: int) -> str | list[int]:
    """llama-server's piece: the token's text, or its bytes where they are not valid UTF-8 alone."""
    raw = llm.tokenizer.token_to_bytes(token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def thinks(template: str) -> bool:
    """Whether a chat template can think: it has a thinking switch or writes a think block."""
    return "enable_thinking" in template or "<think>" in template


def embed(llm, inputs: list[list[int]], pooling: str) -> list[list[float]]:
    """One unit-length vector per input: the final-norm hidden states, mean-pooled over the
    input's tokens or taken at its last token (worker thread)."""
    return [llm.embed(ids, pooling=pooling) for ids in inputs]


def add_probe_routes(app: FastAPI, state, v1: list) -> None:
    @app.post("/tokenize", dependencies=v1)
    async def tokenize(request: Request) -> dict[str, Any]:
        body = parse_json_body(await request.body())
        llm = _ready_llm(state)
        content = body.get("content")
        if not isinstance(content, str):
            raise bad("'content' must be a string.", "content", "invalid_type")
        ids = llm.tokenize(content, add_special=_flag(body, "add_special", False), parse_special=_flag(body, "parse_special", True))
        if _flag(body, "with_pieces", False):
            return {"tokens": [{"id": t, "piece": _piece(llm, t)} for t in ids]}
        return {"tokens": ids}

    @app.post("/detokenize", dependencies=v1)
    async def detokenize(request: Request) -> dict[str, Any]:
        body = parse_json_body(await request.body())
        llm = _ready_llm(state)
        ids = _token_ids(body.get("tokens"), "tokens", llm.spec.vocab_size)
        return {"content": llm.tokenizer.decode(ids, skip_special=False)}

    @app.get("/props", dependencies=v1)
    async def props() -> dict[str, Any]:
        llm = _ready_llm(state)
        from .. import __version__
        from .worker import _server_sampling

        tok = llm.tokenizer
        special = lambda t: tok.decode([t], skip_special=False) if t is not None and t >= 0 else ""  # noqa: E731
        defaults = _server_sampling(state.worker.sampling_defaults)
        return {
            "default_generation_settings": {"n_ctx": llm.n_ctx, "params": {**defaults, "n_predict": state.worker.max_tokens_default or -1}},
            "total_slots": 1,
            "model_alias": state.model_id,
            "model_path": llm.path,
            "chat_template": getattr(llm.template, "source", ""),
            "thinking": thinks(getattr(llm.template, "source", "")),  # tallow's: the page shows "allow thinking" only then
            "bos_token": special(getattr(tok, "bos_id", None)),
            "eos_token": special(getattr(tok, "eos_id", None)),
            "modalities": {"vision": False, "audio": False},
            "build_info": f"tallow {__version__}",
        }

    @app.post("/v1/embeddings", dependencies=v1)
    async def embeddings(request: Request) -> dict[str, Any]:
        body = parse_json_body(await request.body())
        state.check_model(body.get("model"))
        llm = _ready_llm(state)
        fmt = body.get("encoding_format", "float")
        if fmt != "float":
            raise bad(f"'encoding_format' must be \"float\" (base64 is not supported), not {fmt!r}.", "encoding_format", "invalid_value")
        pooling = body.get("pooling", "mean")
        if pooling not in EMBEDDING_POOLING:
            raise bad(f"'pooling' must be one of {list(EMBEDDING_POOLING)}, not {pooling!r}.", "pooling", "invalid_value")
        raw = body.get("input")
        vocab = llm.spec.vocab_size
        if isinstance(raw, str):
            items: list = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
            items = [raw]  # one input given as token ids
        elif isinstance(raw, list) and raw:
            items = raw
        else:
            raise bad("'input' must be a string, an array of strings, or token ids.", "input", "invalid_type")
        inputs = []
        for i, item in enumerate(items):
            ids = llm.tokenize(item, add_special=True) if isinstance(item, str) else _token_ids(item, f"input[{i}]", vocab)
            if not ids:
                raise bad(f"'input[{i}]' is empty.", "input", "invalid_value")
            if len(ids) > llm.n_ctx:
                raise bad(f"'input[{i}]' has {len(ids)} tokens, but the context holds {llm.n_ctx}.", "input", "context_length_exceeded")
            inputs.append(ids)
        job = Job(WorkerCall(lambda model: embed(model, inputs, pooling)), asyncio.get_running_loop())
        state.worker.submit(job)
        event, payload = await job.events.get()
        if event == "error":
            raise payload
        n = sum(len(ids) for ids in inputs)
        request.scope.setdefault("state", {})["tallow_usage"] = {"prompt_tokens": n, "completion_tokens": 0}
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(payload)],
            "model": state.model_id,
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }
