"""`tallow chat`: an interactive multi-turn chat in the terminal.

/clear forgets the conversation, /exit (or Ctrl-D) leaves, /help lists the commands; Ctrl-C
stops the answer being written, not the program. A message may span lines: pasted lines
arrive as one message, and a line of three double quotes opens a block that a line ending in
three double quotes closes. The KV pool keeps the conversation's prefix, so each turn only
prefills the new message.
"""

from __future__ import annotations

import argparse
import signal
import sys

from collections.abc import Callable, Iterator
from typing import Any

try:  # line editing and history when the platform has it
    import readline  # noqa: F401
except ImportError:  # pragma: no cover
    pass

HELP = "commands: /help, /clear (forget the conversation), /exit (leave); \"\"\" opens and closes a multi-line message; Ctrl-C stops an answer"
HELP_LONG = """\
  /help    this list
  /clear   forget the conversation (the system message stays)
  /exit    leave (also /quit, or Ctrl-D)
  \"\"\"      on its own (or starting a line) opens a multi-line message; a line ending in \"\"\" sends it
  Pasted lines arrive as one message. Ctrl-C stops the answer being written, not the chat."""
BLOCK = '"""'
PASTE_WAIT_S = 0.03  # a paste's next line is already waiting; a typed one is not


def _stdin_pending() -> bool:
    """Whether more input is already waiting on an interactive stdin (the rest of a paste)."""
    if not sys.stdin.isatty():
        return False  # piped input: every line is a message, as scripts expect
    try:
        import select

        return bool(select.select([sys.stdin], [], [], PASTE_WAIT_S)[0])
    except (OSError, ValueError):  # pragma: no cover - no select on this stdin
        return False


def read_message(read: Callable[[str], str] = input, pending: Callable[[], bool] = _stdin_pending) -> str:
    """One message from the `> ` prompt: a line, the lines of a paste (all already waiting),
    or a \"\"\"-block spanning lines. Raises EOFError at the end of input."""
    line = read("> ")
    if line.lstrip().startswith(BLOCK):
        first = line.lstrip()[len(BLOCK):]
        if first.rstrip().endswith(BLOCK) and first.strip():  # \"\"\"one line\"\"\"
            return first.rstrip()[: -len(BLOCK)]
        lines = [first] if first.strip() else []
        while True:
            try:
                more = read("... ")
            except EOFError:
                break  # the block ends with the input
            if more.rstrip().endswith(BLOCK):
                lines.append(more.rstrip()[: -len(BLOCK)])
                break
            lines.append(more)
        return "\n".join(lines).strip("\n")
    lines = [line]
    while pending():
        try:
            lines.append(read(""))
        except EOFError:
            break
    return "\n".join(lines)


def user_turns(history: list[dict], read: Callable[[str], str] = input, pending: Callable[[], bool] = _stdin_pending) -> Iterator[str]:
    """The user's messages, read at the `> ` prompt until /exit or end of input; /clear empties
    `history`, /help lists the commands. Shared by the local and the --url chat."""
    while True:
        try:
            message = read_message(read, pending)
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print()
            continue
        text = message.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return
        if text == "/clear":
            history.clear()
            _err("[tallow] conversation cleared")
            continue
        if text in ("/help", "/?"):
            _err(HELP_LONG)
            continue
        if text.startswith("/") and "\n" not in text:
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
