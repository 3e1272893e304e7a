"""What a request asks to be constrained to, in one place for the API and the server."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import GrammarError
from .limits import check_tool_count
from .raw import raw_grammar
from .schema import response_format_rule
from .gemma4_calls import gemma4_answer_grammar
from .tools import tool_grammar, tool_syntax
from .. import switches


def triggered_tools_enabled() -> bool:
    """TALLOW_GRAMMAR_AUTO=0: tool_choice "auto" stays free text (the parser still salvages calls)."""
    return switches.enabled("TALLOW_GRAMMAR_AUTO")


@dataclass
class GrammarSpec:
    response_format: dict[str, Any] | None = None
    grammar: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True

    def needs_constraint(self) -> bool:
        """Whether the answer is promised to follow a grammar (tool_choice auto promises nothing)."""
        text = self.response_format is None or (isinstance(self.response_format, dict) and self.response_format.get("type") == "text")
        return not text or self.grammar is not None or self.forced_tools()

    def forced_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice not in ("auto", "none")

    def lark(self, tok, template_source: str) -> str | None:
        """The grammar (Lark) for this request, or None for an unconstrained answer."""
        self._check_tool_choice()
        check_tool_count(self.tools)
        fmt = response_format_rule(self.response_format)
        # A response format and tools go together (OpenAI: a call, or the formatted answer);
        # a raw grammar is a whole language of its own and combines with neither.
        asked = [name for name, on in (("grammar", self.grammar is not None), ("response_format", fmt is not None), ("tool_choice", self.forced_tools())) if on]
        if self.grammar is not None and len(asked) > 1:
            raise GrammarError(f"'grammar' cannot be combined with {asked[1]}: it constrains the whole answer on its own.", asked[1])
        if self.grammar is not None:
            return raw_grammar(self.grammar)
        tools_on = bool(self.tools) and (self.forced_tools() or (self.tool_choice == "auto" and triggered_tools_enabled()))
        if tools_on:
            # Forced calls leave no room for a formatted answer this turn: the format is unused.
            return tool_grammar(tok, self.tools, self.tool_choice, self.parallel_tool_calls, tool_syntax(template_source), fmt)
        if fmt is not None:
            if tool_syntax(template_source) == "gemma4":
                return gemma4_answer_grammar(tok, fmt)  # an optional thought channel first
            return "%llguidance {}\nstart: answer\nanswer: " + fmt
        return None

    def _check_tool_choice(self) -> None:
        """The API has no protocol layer in front of it: a tool_choice that cannot be honoured
        is an error here, never an unconstrained answer."""
        c = self.tool_choice
        named = isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
        if not named and c not in ("auto", "none", "required"):
            raise GrammarError(f"'tool_choice' must be 'auto', 'none', 'required' or a named function, not {c!r}.", "tool_choice")
        if c not in ("auto", "none") and not self.tools:
            raise GrammarError("'tool_choice' asks for a tool call but no 'tools' were given.", "tool_choice")

    def describe(self) -> str:
        if self.forced_tools():
            return f"'tool_choice' {self.tool_choice if isinstance(self.tool_choice, str) else 'naming a function'!r}"
        if self.response_format is not None:
            return f"'response_format' {self.response_format.get('type')!r}"
        if self.grammar is not None:
            return "'grammar'"
        return f"'tool_choice' {self.tool_choice if isinstance(self.tool_choice, str) else 'naming a function'!r}"

    def param(self) -> str:
        if self.response_format is not None:
            return "response_format"
        return "grammar" if self.grammar is not None else "tool_choice"
