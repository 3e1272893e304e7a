"""`tallow chat`: an interactive multi-turn chat in the terminal.

/clear forgets the conversation, /exit (or Ctrl-D) leaves; Ctrl-C stops the answer being
written, not the program. The KV pool keeps the conversation's prefix, so each turn only
prefills the new message.
"""

from __future__ import annotations

import argparse
import signal
import sys

from collections.abc import Iterator
from typing import Any

try:  # line editing and history when the platform has it
    import readline  # noqa: F401
except ImportError:  # pragma: no cover
    pass

HELP = "commands: /clear (forget the conversation), /exit (leave); Ctrl-C stops an answer"


def user_turns(history: list[dict]) -> Iterator[str]:
    """The user's messages, read at the `> ` prompt until /exit or end of input; /clear empties
    `history`, other /commands are explained. Shared by the local and the --url chat."""
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print()
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return
        if text == "/clear":
            history.clear()
            _err("[tallow] conversation cleared")
            continue
        if text.startswith("/"):
            _err(f"[tallow] unknown command {text.split()[0]}; {HELP}")
            continue
        yield text


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_repl(llm, args: argparse.Namespace, sampling: dict[str, Any]) -> int:
    """Chat with a loaded model; `args` carries system, max_tokens and stop, `sampling` the sampler's settings."""
    from .registry import display_name

    _err(f"[tallow] {display_name(llm.path)} ({llm.spec.architecture}), context {llm.n_ctx}. {HELP}")
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []
    interrupted = {"flag": False}

    def on_sigint(signum, frame):
        interrupted["flag"] = True

    for text in user_turns(history):
        history.append({"role": "user", "content": text})
        interrupted["flag"] = False
        previous = signal.signal(signal.SIGINT, on_sigint)
        answer = []
        try:
            for delta in llm.chat(
                system + history,
                **({} if args.max_tokens is None else {"max_tokens": args.max_tokens}),  # else the API's default
                stream=True,
                stop=args.stop,
                should_stop=lambda: interrupted["flag"],
                **sampling,
            ):
                answer.append(delta)
                sys.stdout.write(delta)
                sys.stdout.flush()
        finally:
            signal.signal(signal.SIGINT, previous)
        print()
        if interrupted["flag"]:
            _err("[tallow] (stopped)")
        history.append({"role": "assistant", "content": "".join(answer)})
        s = llm.stats.last
        _err(f"[{s.decode_tok_s:.1f} tok/s, {s.prompt_tokens} prompt tokens, {s.reused_tokens} reused]")
    return 0
