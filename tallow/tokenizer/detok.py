"""Token ids back to bytes and text, as llama.cpp's ``token_to_piece`` and llama-cpp-python's
``Llama.detokenize`` produce them, plus a streaming decoder that never splits a character.

Semantics (mirrored from llama-cpp-python, documented because they surprise):

* A token's piece depends on its attribute, not on its text alone: NORMAL tokens of a byte-level
  BPE vocab are mapped back through the GPT-2 byte table; NORMAL tokens of an SPM vocab (and of
  Gemma 4's SentencePiece-shaped BPE) have "▁" turned into spaces; BYTE tokens ``<0xXX>`` give that one byte (possibly half a character);
  CONTROL, UNKNOWN and USER_DEFINED tokens give their text verbatim; UNUSED/UNDEFINED give nothing.
* ``special=False`` (tallow's ``skip_special=True``) renders CONTROL and UNKNOWN tokens as
  nothing, exactly like llama.cpp's ``token_to_piece(..., special=false)``. USER_DEFINED tokens
  (gemma's "\\n" and space runs) are always rendered.
* The text of a list is the concatenation of the pieces, except that when the list starts with
  the BOS token and the bytes start with a space, that one space is dropped (llama-cpp-python's
  "Llama 1 prefix space" rule). llama.cpp's ``llama_detokenize`` would also apply its
  ``clean_spaces`` rules for some BPE vocabularies; llama-cpp-python's ``detokenize`` does not,
  and neither do we: concatenating streamed pieces must give the same text as decoding the list.
* Bytes that are not valid UTF-8 become U+FFFD (``errors="replace"``).
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

from .bpe import CHAR_TO_BYTE
from .spm import SPACE

if TYPE_CHECKING:
    from . import Tokenizer

# llama_token_attr bits (llama.h)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

ATTR_SPECIAL = ATTR_UNKNOWN | ATTR_CONTROL


def _hex_prefix(s: str) -> int:
    """strtol(s, 16) on at most two characters: the leading hex digits, 0 if none."""
    value = 0
    for c in s[:2]:
        d = "0123456789abcdef".find(c.lower())
        if d < 0:
            break
        value = value * 16 + d
    return value


def bpe_normal_piece(text: str) -> bytes:
    """Undo the GPT-2 byte mapping; characters outside it are spelled like llama_decode_text."""
    out = bytearray()
    for c in text:
        b = CHAR_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:
            utf8 = c.encode("utf-8")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


def token_piece(text: str, attr: int, gpt2_bytes: bool) -> bytes:
    """llama.cpp's token_to_piece(token, special=true) for one vocab entry.

    gpt2_bytes: NORMAL tokens are spelled in GPT-2 byte characters (byte-level BPE); otherwise
    (SentencePiece, and Gemma 4's BPE) they are UTF-8 text with "▁" for spaces.
    """
    if attr & (ATTR_SPECIAL | ATTR_USER_DEFINED):
        return text.encode("utf-8")
    if attr & ATTR_NORMAL:
        if gpt2_bytes:
            return bpe_normal_piece(text)
        return text.replace(SPACE, " ").encode("utf-8")
    if attr & ATTR_BYTE:
        return bytes([_hex_prefix(text[3:5])])
    return b""


class StreamDecoder:
    """Turns ids into text one at a time; ``push`` returns only whole characters.

    The concatenation of every ``push`` and the final ``flush`` equals
    ``tokenizer.decode(ids, skip_special)``: bytes of a character split across tokens are held
    back until the character is complete, invalid bytes become U+FFFD at the same places a
    one-shot decode puts them, and the leading-space rule for BOS-first lists is applied.
    """

    def __init__(self, tokenizer: "Tokenizer", skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first_id = True
        self._strip_space = False  # the list began with BOS and no byte has come out yet
        self._seen_bytes = False

    def push(self, token_id: int) -> str:
        piece = self.tokenizer.token_to_bytes(token_id, special=not self.skip_special)
        if self._first_id:
            self._first_id = False
            self._strip_space = token_id == self.tokenizer.bos_id
        if piece and not self._seen_bytes:
            self._seen_bytes = True
            if self._strip_space and piece[:1] == b" ":
                piece = piece[1:]
        return self._decoder.decode(piece) if piece else ""

    def flush(self) -> str:
        """Finish: bytes of an incomplete character come out as U+FFFD. The decoder is reset."""
        text = self._decoder.decode(b"", final=True)
        self.reset()
        return text

    def reset(self) -> None:
        """Forget everything, to start a new list of ids."""
        self._decoder.reset()
        self._first_id = True
        self._strip_space = False
        self._seen_bytes = False
