"""A user's own grammar (the request's `grammar` field): Lark as llguidance reads it, or GBNF.

GBNF (llama.cpp's format, `root ::= ...`) is converted by llguidance's own translator; text
that already looks like Lark (`start:` or a `%llguidance` header) is taken as is.
"""

from __future__ import annotations

from llguidance import LLMatcher
from llguidance.gbnf_to_lark import any_to_lark

from .errors import GrammarError, engine_message
from .limits import check_grammar_text


def raw_grammar(text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("'grammar' must be a non-empty string (Lark, or GBNF with a 'root' rule).", "grammar")
    check_grammar_text(text)  # a grammar too big or deep for the engine would crash the process
    try:
        lark = any_to_lark(text)
    except Exception as exc:  # noqa: BLE001 - the translator raises plain exceptions on bad GBNF
        raise GrammarError(f"'grammar' is neither Lark nor valid GBNF: {engine_message(exc)}.", "grammar") from None
    error = LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(lark))
    if error:
        raise GrammarError(f"'grammar' cannot be compiled: {engine_message(error)}.", "grammar")
    return lark
