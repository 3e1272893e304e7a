"""Grammars and schemas too big or too deep for the engine are refused before they reach it.

llguidance overflows its stack (SIGSEGV, the whole process gone) on a GBNF chain of ~5,000 rules
or a schema whose `$ref`s chain ~2,500 definitions (measured, see tallow/grammar/limits.py); each
limit is tested on both sides, and the crash cases run in a child so a regression is a failed
test, not a dead test run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tallow.grammar import GrammarError, GrammarSpec
from tallow.grammar.limits import MAX_GRAMMAR_BYTES, MAX_GRAMMAR_RULES, MAX_SCHEMA_DEPTH, MAX_SCHEMA_REFS, MAX_TOOLS
from tallow.grammar.raw import raw_grammar
from tallow.grammar.schema import json_rule

ROOT = Path(__file__).resolve().parents[1]


def chain(n: int) -> str:
    return "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(n)) + f'r{n} ::= "b"\n'


def ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def nested(n: int) -> dict:
    s: dict = {"type": "string"}
    for _ in range(n):
        s = {"type": "array", "items": s}
    return s


def test_rule_count_limit_both_sides():
    raw_grammar(chain(MAX_GRAMMAR_RULES - 10))  # compiles
    with pytest.raises(GrammarError, match=f"the limit is {MAX_GRAMMAR_RULES}") as e:
        raw_grammar(chain(MAX_GRAMMAR_RULES + 10))
    assert e.value.param == "grammar"


def test_grammar_size_limit():
    raw_grammar('root ::= "' + "a" * (MAX_GRAMMAR_BYTES - 100) + '"')
    with pytest.raises(GrammarError, match=f"the limit is {MAX_GRAMMAR_BYTES}"):
        raw_grammar('root ::= "' + "a" * 1_000_000 + '"')


def test_ref_chain_limit_both_sides():
    json_rule(ref_chain(MAX_SCHEMA_REFS - 6), "response_format")
    with pytest.raises(GrammarError, match=f"the limit of {MAX_SCHEMA_REFS} '\\$ref's"):
        json_rule(ref_chain(MAX_SCHEMA_REFS + 1), "response_format")


def test_schema_depth_limit_and_no_recursion_error():
    json_rule(nested(20), "response_format")  # 41 levels of objects and arrays
    for depth in (MAX_SCHEMA_DEPTH, 450, 5000):  # 450: was a 500 (RecursionError in closed_objects)
        with pytest.raises(GrammarError, match=f"the limit of {MAX_SCHEMA_DEPTH} levels"):
            json_rule(nested(depth), "tools[0].function.parameters")


def test_tool_count_limit():
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(MAX_TOOLS + 1)]
    with pytest.raises(GrammarError, match=f"the limit is {MAX_TOOLS}"):
        GrammarSpec(tools=tools, tool_choice="required").lark(None, "")


CHILD = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
    from tallow.grammar import GrammarError, GrammarSpec
    from test_hostile_grammar import chain, ref_chain
    specs = [GrammarSpec(grammar=chain(5000)),
             GrammarSpec(response_format={{"type": "json_schema", "json_schema": {{"schema": ref_chain(3000)}}}})]
    for spec in specs:
        try:
            spec.lark(None, "")
        except GrammarError as exc:
            print("refused:", exc)
""")


def test_inputs_that_crashed_the_engine_are_refused_in_a_child():
    """Before the limits, both of these killed the process with SIGSEGV (exit -11)."""
    code = CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (out.returncode, out.stderr[-500:])
    assert out.stdout.count("refused:") == 2, out.stdout


def test_engine_failure_at_decode_time_is_a_short_grammar_error():
    """`"a"{1000000}` compiles but the engine gives up on the first token: a GrammarError (the
    server's 400) of one short sentence, not a RuntimeError quoting the parser's whole state."""
    from tallow.grammar import build_constraint
    from tallow.tokenizer import Tokenizer
    from tallow.gguf_file import GGUFFile
    from model_paths import require_model

    tok = Tokenizer.from_gguf(GGUFFile(require_model("smollm2-135m")))
    c = build_constraint(tok, tok.vocab_size, GrammarSpec(grammar='root ::= "a"{1000000}'), "")
    a = tok.encode("a", add_special=False)[0]
    with pytest.raises(GrammarError, match="too complex") as e:
        c.allowed()
        c.advance(a)
        c.allowed()
    assert len(str(e.value)) < 420 and "\n" not in str(e.value)


@pytest.mark.parametrize("flag,text", [
    ("--grammar", chain(5000)),  # exited 139 silently before the limits
    ("--json-schema", "[" * 100_000 + "]" * 100_000),  # was a RecursionError traceback
], ids=["grammar-chain-5000", "json-schema-depth-100000"])  # the texts as ids: PYTEST_CURRENT_TEST over 128 KiB, E2BIG at exec
def test_cli_refuses_hostile_grammars_in_one_sentence_before_loading(tmp_path, flag, text):
    f = tmp_path / "g.txt"
    f.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "tallow.cli", "run", "-m", str(tmp_path / "absent.gguf"), "-p", "x", flag, str(f)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-300:])
    assert proc.stderr.startswith("tallow: error:") and proc.stderr.count("\n") == 1 and flag in proc.stderr, proc.stderr
