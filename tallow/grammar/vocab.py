"""llguidance's view of a tallow tokenizer: every token's bytes, built once per model.

The bytes are llama.cpp's token pieces (what our detokenizer prints). Control tokens, and
user-defined ones that look like markers (`<tool_call>`), are prefixed with 0xFF — llguidance's
sign for a special token — so free-text rules can never produce them and grammars name them
as `<tool_call>`, the way llama.cpp's own llguidance binding marks them.
"""

from __future__ import annotations

import weakref

import llguidance

from ..tokenizer.detok import ATTR_CONTROL, ATTR_USER_DEFINED

_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Wrapper:
    """The duck-typed tokenizer llguidance.TokenizerWrapper expects."""

    def __init__(self, tok) -> None:
        self.eos_token_id = min(tok.eog_ids) if tok.eog_ids else (tok.eos_id or 0)
        self.bos_token_id = tok.bos_id
        self.tokens = []
        self.special_token_ids = []
        for i in range(tok.vocab_size):
            piece = tok.token_to_bytes(i, special=True)
            attr = tok.attrs[i]
            if attr & ATTR_CONTROL or (attr & ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")):
                piece = b"\xff" + piece
                self.special_token_ids.append(i)
            self.tokens.append(piece)
        self._tok = tok

    def __call__(self, text: bytes | str) -> list[int]:
        # llguidance tokenizes forced text with this; partial UTF-8 is its own business.
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text, add_special=False, parse_special=False)


def grammar_tokenizer(tok) -> llguidance.LLTokenizer:
    """The LLTokenizer of a tallow Tokenizer, cached for the tokenizer's lifetime (0.1-0.8 s to build)."""
    ll = _cache.get(tok)
    if ll is None:
        eog = sorted(tok.eog_ids) or None
        ll = _cache[tok] = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapper(tok)), eos_token=eog)
    return ll


_special_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def special_ids(tok) -> list[int]:
    """Ids the grammar vocabulary marks special (see the module doc); cached per tokenizer
    (a pass over gemma3's 262k tokens costs ~0.1 s, too much per request)."""
    ids = _special_cache.get(tok)
    if ids is None:
        ids = _special_cache[tok] = [i for i in range(tok.vocab_size) if _is_special(tok, i)]
    return ids


def _is_special(tok, i: int) -> bool:
    text = tok.tokens[i]
    return bool(tok.attrs[i] & ATTR_CONTROL or (tok.attrs[i] & ATTR_USER_DEFINED and text.startswith("<") and text.endswith(">")))


def special_token(tok, text: str) -> bool:
    """Whether `text` is one token that the grammar vocabulary marks special (usable as `<text>`)."""
    i = tok.token_to_id.get(text)
    return i is not None and _is_special(tok, i)
