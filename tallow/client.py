"""`tallow chat --url URL`: the terminal chat REPL, talking to a running `tallow serve`.

It uses only the standard library (urllib + the SSE lines the server sends), so the client
side needs neither torch nor httpx. Same commands as local chat: /clear, /exit; Ctrl-C stops
the answer (closing the connection, which makes the server stop generating) but not the
program. Thinking (`reasoning_content`) is shown dimmed, before the answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from .errors import UsageError
from .repl import HELP, user_turns

DIM, RESET = "\033[2m", "\033[0m"


class RemoteError(UsageError):
    """The server answered with an error, or could not be reached."""


def _request(url: str, api_key: str | None, body: dict[str, Any] | None = None, timeout: float = 600.0) -> Any:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {exc.code}"
        raise RemoteError(f"the server at {url} answered {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise RemoteError(f"cannot reach a tallow server at {url} ({reason}).") from None


def stream_chat(base_url: str, api_key: str | None, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yield the parsed SSE chunks of one streaming chat completion."""
    with _request(base_url.rstrip("/") + "/v1/chat/completions", api_key, {**body, "stream": True}) as resp:
        for raw in resp:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                return
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RemoteError(f"the server failed mid-answer: {chunk['error'].get('message')}")
            yield chunk


def run_remote_repl(args: argparse.Namespace) -> int:
    base = args.url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise UsageError(f"--url must start with http:// or https://, not {args.url!r}.")
    with _request(base + "/v1/models", args.api_key, timeout=10) as resp:
        model = json.loads(resp.read())["data"][0]["id"]
    print(f"[tallow] {model} at {base}. {HELP}", file=sys.stderr, flush=True)
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict[str, Any]] = []
    sampling = {
        "temperature": args.temp,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repeat_penalty": args.repeat_penalty,
        "presence_penalty": args.presence_penalty,
        "frequency_penalty": args.frequency_penalty,
        "seed": args.seed,
        "max_tokens": args.max_tokens,
        "stop": args.stop,
    }
    sampling = {k: v for k, v in sampling.items() if v is not None}
    tty = sys.stdout.isatty()
    for text in user_turns(history):
        history.append({"role": "user", "content": text})
        answer: list[str] = []
        calls: list[list[str]] = []  # [name, arguments] of each tool call, printed once complete
        thinking = False
        timings: dict[str, Any] = {}
        t0 = time.perf_counter()
        try:
            for chunk in stream_chat(base, args.api_key, {"model": model, "messages": system + history, "stream_options": {"include_usage": True}, **sampling}):
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta", {})
                    if delta.get("reasoning_content"):
                        if not thinking and tty:
                            sys.stdout.write(DIM)
                        thinking = True
                        sys.stdout.write(delta["reasoning_content"])
                    if delta.get("content"):
                        if thinking:
                            sys.stdout.write((RESET if tty else "") + "\n")
                            thinking = False
                        answer.append(delta["content"])
                        sys.stdout.write(delta["content"])
                    for call in delta.get("tool_calls") or []:  # streamed: the name first, then argument pieces
                        fn = call.get("function", {})
                        if call.get("id"):
                            calls.append([fn.get("name"), fn.get("arguments") or ""])
                        elif calls:
                            calls[-1][1] += fn.get("arguments") or ""
                sys.stdout.flush()
            for name, arguments in calls:
                sys.stdout.write(f"[tool call] {name}({arguments})\n")
        except KeyboardInterrupt:
            print(("\n" + RESET if tty else "\n") + "[tallow] (stopped)", file=sys.stderr, flush=True)
        except RemoteError as exc:
            history.pop()
            print(f"\ntallow: error: {exc}", file=sys.stderr, flush=True)
            continue
        if thinking and tty:
            sys.stdout.write(RESET)
        print()
        history.append({"role": "assistant", "content": "".join(answer)})
        if timings:
            print(f"[{timings.get('predicted_per_second', 0):.1f} tok/s, {timings.get('cache_n', 0)} prompt tokens reused, {time.perf_counter() - t0:.1f} s]", file=sys.stderr, flush=True)
    return 0
