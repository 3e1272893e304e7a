"""Size and depth bounds on what a request may ask the grammar engine to compile.

llguidance compiles grammars and JSON schemas recursively in native code: deep enough input
overflows the thread's stack and kills the whole process (SIGSEGV), which no `except` can
catch. Measured on an 8 MiB stack (llguidance 1.9.1; docs/performance.md has the command): a
GBNF chain of 3,000 rules compiles, 5,000 crash; a JSON schema whose `$ref`s chain 2,200
definitions compiles, 2,500 crash. The bounds below sit 6-10x under those, far above any
grammar or schema written by hand, and are checked by plain iteration (no recursion) before
anything reaches the engine; each refusal is a GrammarError (a 400) naming the bound.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import GrammarError

MAX_GRAMMAR_BYTES = 64 * 1024  # the `grammar` text (UTF-8)
MAX_GRAMMAR_RULES = 500  # rule definitions in a grammar (GBNF `::=` or Lark `name:` lines)
MAX_SCHEMA_BYTES = 256 * 1024  # one JSON schema, serialized
MAX_SCHEMA_DEPTH = 64  # nested objects/arrays inside one schema
MAX_SCHEMA_NODES = 10_000  # objects and arrays inside one schema
MAX_SCHEMA_REFS = 256  # `$ref`s in one schema (or one grammar's inline `%json`)
MAX_TOOLS = 128  # tools declared in one request (OpenAI's own limit)

_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][\w.-]*\s*:(?!:)", re.MULTILINE)
_REF = re.compile(r'"\$ref"')


def check_grammar_text(text: str, param: str = "grammar") -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"'{param}' is {size} bytes; the limit is {MAX_GRAMMAR_BYTES}.", param)
    rules = max(text.count("::="), len(_LARK_RULE.findall(text)))
    if rules > MAX_GRAMMAR_RULES:
        raise GrammarError(f"'{param}' defines {rules} rules; the limit is {MAX_GRAMMAR_RULES}.", param)
    refs = len(_REF.findall(text))
    if refs > MAX_SCHEMA_REFS:
        raise GrammarError(f"'{param}' holds {refs} JSON schema '$ref's; the limit is {MAX_SCHEMA_REFS}.", param)


def check_schema_size(schema: Any, param: str) -> None:
    """Depth, node count, `$ref` count and serialized size of one schema, walked iteratively."""
    nodes = refs = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        nodes += 1
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(f"The JSON schema in '{param}' is nested deeper than the limit of {MAX_SCHEMA_DEPTH} levels.", param)
        if nodes > MAX_SCHEMA_NODES:
            raise GrammarError(f"The JSON schema in '{param}' has more than the limit of {MAX_SCHEMA_NODES} objects and arrays.", param)
        if isinstance(node, dict):
            refs += "$ref" in node
            if refs > MAX_SCHEMA_REFS:
                raise GrammarError(f"The JSON schema in '{param}' holds more than the limit of {MAX_SCHEMA_REFS} '$ref's.", param)
            stack.extend((v, depth + 1) for v in node.values())
        else:
            stack.extend((v, depth + 1) for v in node)
    size = len(json.dumps(schema, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > MAX_SCHEMA_BYTES:
        raise GrammarError(f"The JSON schema in '{param}' is {size} bytes; the limit is {MAX_SCHEMA_BYTES}.", param)


def check_tool_count(tools: list | None) -> None:
    if tools and len(tools) > MAX_TOOLS:
        raise GrammarError(f"'tools' declares {len(tools)} tools; the limit is {MAX_TOOLS}.", "tools")
