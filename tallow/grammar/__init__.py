"""Constrained decoding: grammars compiled by llguidance, applied as a mask before sampling.

`build_constraint(tokenizer, vocab_size, spec)` turns what a request asks for (a JSON
response format, tool calls, a raw Lark/GBNF grammar; see `spec.GrammarSpec`) into a
`Sampler` constraint, or None when the request asks for nothing constrained. Why llguidance:
measured against xgrammar and outlines-core on our three vocabularies (docs/performance.md),
it is as cheap per token, compiles lazily, and takes Lark with inline JSON schemas, special
tokens and lazy (triggered) rules — exactly what tool calls in a model's own syntax need.

TALLOW_GRAMMAR=0 switches constrained decoding off: a request that needs it gets a clear
error (a 400 from the server) rather than a silently unconstrained answer. Given the answer's
token budget, the constraint also steers it to end, valid, inside the budget (closing.py;
TALLOW_GRAMMAR_CLOSE=0 lets max_tokens cut it instead).
"""

from __future__ import annotations


from .closing import closing_enabled, closing_vocab
from .constraint import GrammarConstraint
from .errors import GrammarError
from .spec import GrammarSpec
from .vocab import grammar_tokenizer
from .. import switches

__all__ = ["GrammarConstraint", "GrammarError", "GrammarSpec", "build_constraint", "grammar_enabled", "grammar_tokenizer"]


def grammar_enabled() -> bool:
    return switches.enabled("TALLOW_GRAMMAR")


def build_constraint(tokenizer, vocab_size: int, spec: GrammarSpec, template_source: str = "",
                     budget: int | None = None, greedy: bool = False) -> GrammarConstraint | None:
    """The constraint for a request, or None when it asks for free text (incl. tool_choice auto
    with the triggered grammar switched off). `budget`: the samples the answer may take, its
    end-of-generation token included (None: no closing); `greedy`: the decoding is."""
    if not grammar_enabled():
        if spec.needs_constraint():
            raise GrammarError(f"{spec.describe()} needs constrained decoding, which is switched off here (TALLOW_GRAMMAR=0).", spec.param())
        return None  # tool_choice auto: free text, the parser still finds calls
    grammar = spec.lark(tokenizer, template_source)
    if grammar is None:
        return None
    ll = grammar_tokenizer(tokenizer)
    # Only answers promised to follow the grammar are closed: under tool_choice auto the answer is
    # free text until a call opens, and ending prose early would only hide that it was cut.
    closing = closing_vocab(tokenizer, ll.vocab_size) if budget is not None and closing_enabled() and spec.needs_constraint() else None
    return GrammarConstraint(ll, grammar, vocab_size, spec.param(), budget, closing, greedy)
