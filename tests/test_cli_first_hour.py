"""A user's first hour with the command line (issue 13): --version, flags checked before the
model loads, the documented exit codes, `inspect` never downloading, `bench` with nothing to
measure, `models`/`rm`, and the chat REPL's multi-line input and /help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tallow import __version__
from tallow.repl import read_message, user_turns


def _tallow(*args: str, env: dict | None = None, timeout: int = 60) -> subprocess.CompletedProcess:
    """The real command in its own process (for what a process shows: exit code, stdio)."""
    import os

    return subprocess.run([sys.executable, "-m", "tallow.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def cli(capsys, monkeypatch):
    """`tallow ARGS` in this process (fast): returns (exit code, stdout, stderr)."""
    from tallow.cli import main

    def run(*args: str, env: dict | None = None):
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_version():
    r = _tallow("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tallow {__version__}"


@pytest.mark.parametrize("args, message", [
    (["run", "-p", "hi", "-n", "-5"], "-n/--max-tokens must be at least 1, not -5."),
    (["run", "-p", "hi", "--temp", "-1"], "--temp must be at least 0, got -1.0."),
    (["run", "-p", "hi", "--top-p", "2"], "--top-p must be at most 1, got 2.0."),
    (["chat", "--min-p", "-0.5"], "--min-p must be at least 0, got -0.5."),
    (["run", "-p", "hi", "--ctx", "4"], "--ctx (the context size in tokens) must be at least 16, not 4."),
    (["serve", "--temp", "-2"], "--temp must be at least 0, got -2.0."),
    (["serve", "--port", "99999"], "--port must be between 1 and 65535, not 99999."),
    (["inspect", "--ctx", "-5"], "--ctx (the context size in tokens) must be at least 16, not -5."),
    (["bench", "-p", "0", "-n", "0"], "-p and -n are all 0: there is nothing to measure"),
])
def test_flags_are_checked_before_the_model_loads(cli, args, message):
    """The model named does not exist: an answer about the flag proves the flag came first."""
    code, _, err = cli(*args[:1], "-m", "/nonexistent/model.gguf", *args[1:])
    assert code == 2, err
    assert err.startswith("tallow: error: ") and message in err and err.count("\n") == 1


def test_a_bad_flag_in_a_process_is_one_line_and_exit_2():
    r = _tallow("run", "-m", "/nonexistent/model.gguf", "-p", "hi", "--top-p", "2")
    assert r.returncode == 2 and r.stderr == "tallow: error: --top-p must be at most 1, got 2.0.\n"


def test_inspect_and_plan_never_download(cli, tmp_path):
    """A registry model that is not pulled: a hint to pull it, exit 2, nothing written."""
    for cmd in ("inspect", "plan"):
        code, _, err = cli(cmd, "smollm2-135m", env={"TALLOW_HOME": str(tmp_path)})
        assert code == 2, err
        assert "is not downloaded yet: run `tallow pull smollm2-135m`" in err
    assert not (tmp_path / "models" / "smollm2-135m.gguf").exists()


def test_unwritable_home_is_exit_4(tmp_path):
    home = tmp_path / "home"
    home.write_text("a file where the home folder should be")
    r = _tallow("pull", "smollm2-135m", env={"TALLOW_HOME": str(home)})
    assert r.returncode == 4, r.stderr
    assert "cannot create the model folder" in r.stderr and "TALLOW_HOME" in r.stderr and "Traceback" not in r.stderr


def test_models_shows_sizes_and_rm_deletes(cli, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    from tallow.registry import MODELS

    size = MODELS["smollm2-135m"].size_bytes
    with open(models / "smollm2-135m.gguf", "wb") as f:
        f.truncate(size)  # sparse: the right size is what "pulled" means
    (models / ".smollm2-135m-pull-x1y2").mkdir()  # a killed pull's work folder
    env = {"TALLOW_HOME": str(tmp_path)}
    code, out, _ = cli("models", env=env)
    assert code == 0
    line = next(ln for ln in out.splitlines() if "smollm2-135m" in ln)
    assert "93.8 MiB" in line and str(models / "smollm2-135m.gguf") in line
    assert "not pulled (tallow pull gemma3-270m)" in out and "pulled: 93.8 MiB on disk" in out
    code, out, _ = cli("rm", "smollm2")
    assert code == 0 and "removed smollm2 (93.8 MiB freed)" in out
    assert sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) == []
    code, out, _ = cli("rm", "smollm2")
    assert code == 0 and "was not pulled" in out
    code, _, err = cli("rm", "nope")
    assert code == 2 and "unknown model 'nope'" in err


def _reader(lines):
    it = iter(lines)

    def read(prompt):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None

    return read


def test_chat_multi_line_input():
    # a paste: the next lines were already waiting when the first was read
    waiting = iter([True, True, False])
    assert read_message(_reader(["def f():", "    return 1", "", "after"]), lambda: next(waiting)) == "def f():\n    return 1\n"
    # a """ block, and a one-line """...""", and a block cut by the end of input
    assert read_message(_reader(['"""', "one", "", "two", '"""']), lambda: False) == "one\n\ntwo"
    assert read_message(_reader(['"""first', 'last"""']), lambda: False) == "first\nlast"
    assert read_message(_reader(['"""inline"""']), lambda: False) == "inline"
    assert read_message(_reader(['"""', "unfinished"]), lambda: False) == "unfinished"
    # typed lines (nothing waiting) stay separate messages; /help is a command
    turns = list(user_turns([], _reader(["one", "/help", "two", "/exit", "never"]), lambda: False))
    assert turns == ["one", "two"]


def test_chat_help_lists_the_commands(capsys):
    assert list(user_turns([], _reader(["/help"]), lambda: False)) == []
    err = capsys.readouterr().err
    assert "/clear" in err and "/exit" in err and '"""' in err and "unknown command" not in err


class _FakeLLM:
    """Records what `tallow run` asks of the API (no model: this is about the CLI's wiring)."""

    def __init__(self):
        self.calls = []
        from types import SimpleNamespace

        last = SimpleNamespace(prompt_tokens=1, reused_tokens=0, reused_from_disk=0, saved_s=0, prefill_tokens=1, prefill_s=0.1,
                               prefill_tok_s=10, decode_tokens=1, decode_s=0.1, decode_tok_s=10, draft_tokens=0, ttft_s=0.1,
                               finish_reason="stop", grammar_steered=0)
        self.stats = SimpleNamespace(last=last, load=SimpleNamespace(load_s=0.1))

    def chat(self, messages, **kwargs):
        self.calls.append(("chat", kwargs))
        return iter(["ok"])

    def generate(self, prompt, **kwargs):
        self.calls.append(("generate", kwargs))
        return iter(["ok"])


def test_run_leaves_the_length_to_the_api_unless_n_is_given(cli, monkeypatch):
    """The README's demo must finish: `run` uses the API's default (chat 1024), not a shorter cut."""
    import tallow.api

    fake = _FakeLLM()
    monkeypatch.setattr(tallow.api, "load", lambda *a, **k: fake)
    assert cli("run", "-p", "hi")[0] == 0
    assert cli("run", "-p", "hi", "-n", "7")[0] == 0
    assert cli("run", "-p", "hi", "--raw")[0] == 0
    (k1, a1), (k2, a2), (k3, a3) = fake.calls
    assert k1 == "chat" and "max_tokens" not in a1
    assert a2["max_tokens"] == 7
    assert k3 == "generate" and "max_tokens" not in a3
    import inspect

    assert inspect.signature(tallow.api.LLM.chat).parameters["max_tokens"].default == 1024


def test_serve_passes_device_memory_and_default_sampling(cli, monkeypatch):
    import tallow.server.app

    seen = {}
    monkeypatch.setattr(tallow.server.app, "serve", lambda model, **kw: seen.update(kw, model=model) or 0)
    code, _, err = cli("serve", "-m", "x.gguf", "--device", "cpu", "--mem-budget", "2GiB", "--reserve", "1GiB", "--ctx", "1024",
                       "--temp", "0", "--top-k", "5", "-n", "99", "--quiet")
    assert code == 0, err
    assert (seen["device"], seen["mem_budget"], seen["reserve"], seen["ctx"], seen["max_tokens"]) == ("cpu", "2GiB", "1GiB", 1024, 99)
    assert seen["sampling"] == {"temperature": 0.0, "top_k": 5} and seen["log_requests"] is False
