"""The `tallow` command as a user runs it: text on stdout, stats on stderr, one-sentence errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from model_paths import model_path


def _tallow(*args: str, stdin: str | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tallow.cli", *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def smollm2() -> str:
    path = model_path("smollm2-135m")
    if path is None:
        if os.environ.get("TALLOW_REQUIRE_MODELS") == "1":
            pytest.fail("smollm2-135m is required but missing")
        pytest.skip("smollm2-135m not found")
    return str(path)


def test_tokenize_matches_llama_cpp(smollm2):
    fixture = json.loads(open(os.path.join(os.path.dirname(__file__), "fixtures", "tokenizer_smollm2-135m.json")).read())
    case = next(c for c in fixture["cases"] if c["text"].strip())
    r = _tallow("tokenize", "-m", smollm2, case["text"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == case["ids"]


def test_run_raw_prints_only_generated_text(smollm2):
    r = _tallow("run", "-m", smollm2, "-p", "The capital of France is", "-n", "6", "--raw")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "The capital of France is" not in r.stdout
    for field in ("load", "prefill", "decode", "TTFT"):
        assert field in r.stderr


def test_run_chat_with_sampling_flags(smollm2):
    r = _tallow("run", "-m", smollm2, "-p", "Say hello.", "-n", "8", "--temp", "0.7", "--seed", "3", "--top-k", "20")
    again = _tallow("run", "-m", smollm2, "-p", "Say hello.", "-n", "8", "--temp", "0.7", "--seed", "3", "--top-k", "20")
    assert r.returncode == 0, r.stderr
    assert r.stdout == again.stdout and r.stdout.strip()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "-p", "hi", "-n", "0"], "-n/--max-tokens"),
        (["run", "-p", "hi", "--temp", "-1"], "--temp"),
        (["run", "-p", "hi", "--ctx", "4"], "context"),
        (["bench", "-p", "x"], "comma-separated"),
    ],
)
def test_bad_flags_are_one_sentence_exit_2(smollm2, args, needle):
    r = _tallow(*args[:1], "-m", smollm2, *args[1:])
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert needle in r.stderr


def test_run_constrained_output_flags(smollm2, tmp_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}
    r = _tallow("run", "-m", smollm2, "-p", "Pick a digit.", "-n", "16", "--json-schema", json.dumps(schema))
    assert r.returncode == 0, r.stderr
    n = json.loads(r.stdout)["n"]
    assert isinstance(n, int) and 0 <= n <= 9
    grammar = tmp_path / "yes_no.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    r = _tallow("run", "-m", smollm2, "-p", "Is the sky blue?", "-n", "8", "--grammar", str(grammar))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("yes", "no")
    r = _tallow("run", "-m", smollm2, "-p", "A JSON object:", "-n", "24", "--json", "--raw")
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads(r.stdout), dict)  # closed within -n 24, not cut


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--json-schema", "missing.json"], "--json-schema cannot read 'missing.json'"),
        (["--json-schema", "{nope"], "--json-schema is not valid JSON"),
        (["--json-schema", '{"type": "array", "uniqueItems": true}'], "cannot be enforced by constrained decoding: Unimplemented keys: [\"uniqueItems\"]"),
        (["--grammar", "missing.lark"], "--grammar cannot read 'missing.lark'"),
        (["--grammar", "BAD_GRAMMAR"], "--grammar is neither Lark nor valid GBNF"),
        (["--json", "--grammar", "x"], "not allowed with argument --json"),
    ],
)
def test_bad_constraint_flags_are_one_sentence_exit_2(smollm2, tmp_path, flags, needle):
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= (\n")
    r = _tallow("run", "-m", smollm2, "-p", "hi", *[str(bad) if f == "BAD_GRAMMAR" else f for f in flags])
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert needle in r.stderr


def test_unknown_model_name():
    r = _tallow("run", "-m", "no-such-model", "-p", "hi")
    assert r.returncode == 2
    assert "unknown model 'no-such-model'" in r.stderr and "Traceback" not in r.stderr


def test_inspect_and_models(smollm2):
    r = _tallow("inspect", smollm2, "--ctx", "1024")
    assert r.returncode == 0, r.stderr
    assert "architecture  llama" in r.stdout and "Q4_1: 210" in r.stdout and "@ctx 1024" in r.stdout
    r = _tallow("models")
    assert r.returncode == 0 and "qwen2.5-coder-1.5b-instruct" in r.stdout


def test_inspect_and_plan_show_gemma4_layer_kinds(tmp_path):
    """Per-layer kinds (head sizes, RoPE per type, shared-KV layers) and the KV bytes per token
    with and without sharing: 5 cached layers of the tiny E2B-style model, 8 layers in all."""
    from tiny_models import write_tiny_model

    path = str(write_tiny_model("gemma4", tmp_path / "g4.gguf"))
    r = _tallow("inspect", path, "--ctx", "128")
    assert r.returncode == 0, r.stderr
    assert "shared KV (no cache)   3 layers read an earlier layer's: 5->3, 6->3, 7->4" in r.stdout
    assert "global                 head 32, 1 KV heads, RoPE base 1e+06 on 32 dims, 4 of 16 pairs turning" in r.stdout
    assert "KV sharing    640 bytes/token (f16) with it, 1024 were every layer to own a cache" in r.stdout
    r = _tallow("plan", path, "--ctx", "128")
    assert r.returncode == 0, r.stderr
    assert "5 of 8 layers own a cache, the rest share one (1024 bytes per token without sharing)" in r.stdout


def test_bench_json(smollm2):
    r = _tallow("bench", "-m", smollm2, "-p", "8", "-n", "4", "-r", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["test"] for row in rows] == ["pp8", "tg4"]
    assert all(row["tok_s_mean"] > 0 for row in rows)
    assert all("load_avg_1m" in row["state"] for row in rows)  # the machine's state beside each figure


def test_chat_repl_commands(smollm2):
    r = _tallow("chat", "-m", smollm2, "-n", "8", stdin="What is 2+2?\n/clear\nHello\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert "conversation cleared" in r.stderr
    assert r.stdout.count("> ") >= 3
