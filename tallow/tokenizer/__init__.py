"""The tokenizer of a GGUF model, producing the same ids and text as llama.cpp.

``Tokenizer.from_gguf(gf)`` reads the ``tokenizer.ggml.*`` metadata and rebuilds what llama.cpp's
``llama_vocab::load`` builds: token attributes (including the overrides llama.cpp applies by
token text), special ids, the end-of-generation set, and the list of special tokens that are cut
out of the text before tokenizing. ``encode`` mirrors ``llama_tokenize(text, add_special,
parse_special)``; ``decode`` mirrors llama-cpp-python's ``Llama.detokenize`` (see ``detok.py`` for
the exact rules). Supported vocabularies: byte-level BPE (``gpt2``) and SentencePiece-style
(``llama``), and Gemma 4's SentencePiece-shaped BPE (``gemma4``); others raise a clear error instead of tokenizing differently.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from typing import Iterable, Sequence

import numpy as np

from ..errors import ModelFileError, TallowError
from ..gguf_file import GGUFFile
from .bpe import BpeTokenizer, pre_tokenizer_for
from .detok import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_LSTRIP,
    ATTR_NORMAL,
    ATTR_RSTRIP,
    ATTR_SPECIAL,
    ATTR_UNDEFINED,
    ATTR_UNKNOWN,
    ATTR_UNUSED,
    ATTR_USER_DEFINED,
    StreamDecoder,
    token_piece,
)
from .spm import SPACE, SpmTokenizer

__all__ = ["Tokenizer", "StreamDecoder", "TokenizerError"]

log = logging.getLogger("tallow.tokenizer")


class TokenizerError(TallowError):
    """A token id or argument the tokenizer cannot use."""


# gguf token types (llama_token_type) -> llama_token_attr bits; unknown types are UNDEFINED.
_TYPE_TO_ATTR = np.array(
    [ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE, ATTR_UNDEFINED],
    dtype=np.int32,
)

# Texts llama.cpp recognises when the GGUF does not name these ids (llama-vocab.cpp, load()).
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
              "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
                "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
                "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
                "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
              "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
              "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")
_SPECIAL_ID_KEYS = (
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),  # sic: the GGUF key is spelled this way
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
    ("fim_pre", "tokenizer.ggml.fim_pre_token_id"),
    ("fim_suf", "tokenizer.ggml.fim_suf_token_id"),
    ("fim_mid", "tokenizer.ggml.fim_mid_token_id"),
    ("fim_pad", "tokenizer.ggml.fim_pad_token_id"),
    ("fim_rep", "tokenizer.ggml.fim_rep_token_id"),
    ("fim_sep", "tokenizer.ggml.fim_sep_token_id"),
    ("fim_pre", "tokenizer.ggml.prefix_token_id"),  # deprecated names, read last as llama.cpp does
    ("fim_suf", "tokenizer.ggml.suffix_token_id"),
    ("fim_mid", "tokenizer.ggml.middle_token_id"),
)
_C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale, used by llama.cpp's lstrip/rstrip


class Tokenizer:
    """A GGUF model's tokenizer. Build with ``Tokenizer.from_gguf``.

    Attributes: ``vocab_size``, ``bos_id``/``eos_id`` (None if the model has none), ``eog_ids``
    (every id llama.cpp's ``llama_vocab_is_eog`` accepts), ``add_bos``/``add_eos`` (what
    ``encode(add_special=True)`` adds), ``kind`` ("bpe" or "spm"), ``tokens`` (vocab texts).
    """

    def __init__(self, gf: GGUFFile):
        md = gf.metadata
        path = gf.path
        self.path = path
        model = md.get("tokenizer.ggml.model")
        if not isinstance(model, str):
            raise ModelFileError(f"{path}: the file has no tokenizer (tokenizer.ggml.model is missing).")
        tokens = md.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise ModelFileError(f"{path}: the file has no vocabulary (tokenizer.ggml.tokens is missing or empty).")
        n = len(tokens)
        if "" in tokens:
            tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.tokens: list[str] = tokens
        self.vocab_size = n
        self.token_to_id: dict[str, int] = dict(zip(tokens, range(n)))
        if len(self.token_to_id) != n:  # llama.cpp refuses such a vocabulary too
            first = next(i for i, t in enumerate(tokens) if self.token_to_id[t] != i)
            raise ModelFileError(f"{path}: the vocabulary lists the token {tokens[first]!r} twice.")

        ids: dict[str, int | None] = {k: None for k, _ in _SPECIAL_ID_KEYS}
        self.add_space_prefix = False
        self.add_bos = False
        self.add_eos = False
        if model == "llama":
            self.kind = "spm"
            ids.update(bos=1, eos=2, unk=0)
            self.add_space_prefix = True
            self.add_bos = True
            pre = None
        elif model == "gpt2":
            self.kind = "bpe"
            ids.update(bos=11, eos=11)
            pre = pre_tokenizer_for(md.get("tokenizer.ggml.pre"), path)
            self.add_bos = pre.add_bos
            if not pre.has_bos:
                ids["bos"] = None
        elif model == "gemma4":
            # BPE merges over "▁"-escaped text with "<0xXX>" byte fallback; every special id comes
            # from the metadata (no defaults), and BOS is always added (llama.cpp PR 21500).
            self.kind = "bpe"
            pre = pre_tokenizer_for("gemma4", path)
        else:
            raise ModelFileError(
                f"{path}: tokenizer type {model!r} (tokenizer.ggml.model) is not supported; tallow supports "
                "'gpt2' (byte-level BPE), 'llama' (SentencePiece-style) and 'gemma4'."
            )
        prefix = md.get("tokenizer.ggml.add_space_prefix")
        if isinstance(prefix, bool):
            self.add_space_prefix = prefix

        # Special ids: defaults outside the vocab are dropped; metadata outside it is ignored.
        for name, key in _SPECIAL_ID_KEYS:
            if ids[name] is not None and ids[name] >= n:  # type: ignore[operator]
                ids[name] = None
            value = md.get(key)
            if value is None:
                continue
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                log.warning("%s: %s is not an integer (%r); ignored", path, key, value)
            elif 0 <= int(value) < n:
                ids[name] = int(value)
            else:
                log.warning("%s: %s = %s is outside the vocabulary; using %s", path, key, value, ids[name])
        for flag, key in (("add_bos", "tokenizer.ggml.add_bos_token"), ("add_eos", "tokenizer.ggml.add_eos_token")):
            value = md.get(key)
            if isinstance(value, (bool, np.bool_)):
                setattr(self, flag, bool(value))
        if pre is not None and pre.spm_style:
            self.add_bos = True  # llama.cpp overrides a false add_bos_token for Gemma 4
        if self.add_bos and ids["bos"] is None:
            raise ModelFileError(f"{path}: tokenizer.ggml.add_bos_token is true but the model has no BOS token.")
        if self.add_eos and ids["eos"] is None:
            raise ModelFileError(f"{path}: tokenizer.ggml.add_eos_token is true but the model has no EOS token.")

        attrs = self._load_attrs(md, n, path)
        self._detect_special_ids(ids, attrs)
        self.eog_ids: set[int] = self._eog(ids, attrs)
        self._apply_name_rules(md, attrs)
        self.attrs: list[int] = attrs.tolist()
        self.bos_id: int | None = ids["bos"]
        self.eos_id: int | None = ids["eos"]
        self.special_ids = ids

        # Special tokens cut out of the text first, longest first (llama.cpp cache_special_tokens;
        # its sort is not stable, ours breaks ties by id: only overlapping equal-length texts differ).
        special = np.flatnonzero(attrs & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)).tolist()
        special.sort(key=lambda i: -len(tokens[i].encode("utf-8")))
        self._special_all: list[int] = special
        self._special_user: list[int] = [i for i in special if not self.attrs[i] & ATTR_SPECIAL]
        self._special_rank: dict[int, int] = {t: r for r, t in enumerate(special)}
        self._groups_all = self._prefix_groups(special)
        self._groups_user = self._prefix_groups(self._special_user)

        if self.kind == "spm":
            scores = md.get("tokenizer.ggml.scores")
            if scores is None:
                score_list: Sequence[float] = [0.0] * n
            elif len(scores) < n:
                raise ModelFileError(f"{path}: tokenizer.ggml.scores has {len(scores)} entries for {n} tokens.")
            else:
                score_list = np.asarray(scores, dtype=np.float32)[:n].astype(np.float64).tolist()
            self._spm: SpmTokenizer | None = SpmTokenizer(tokens, self.token_to_id, score_list, path)
            self._bpe: BpeTokenizer | None = None
        else:
            merges = md.get("tokenizer.ggml.merges")
            if not isinstance(merges, list):
                raise ModelFileError(f"{path}: a BPE tokenizer needs tokenizer.ggml.merges, which is missing.")
            self._bpe = BpeTokenizer(self.token_to_id, merges, pre)  # type: ignore[arg-type]
            self._spm = None
        self.pre = pre.name if pre is not None else None
        self._gpt2_bytes = pre is not None and not pre.spm_style  # NORMAL pieces spelled in GPT-2 byte characters
        self._pieces: list[bytes | None] = [None] * n

    # ------------------------------------------------------------------ loading helpers
    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> "Tokenizer":
        """Build the tokenizer from an opened GGUF file (the file may be closed afterwards)."""
        return cls(gf)

    @staticmethod
    def _load_attrs(md: dict, n: int, path: str) -> np.ndarray:
        types = md.get("tokenizer.ggml.token_type")
        if types is None:
            return np.full(n, ATTR_NORMAL, dtype=np.int64)
        types = np.asarray(types)
        if types.shape[0] < n:
            raise ModelFileError(f"{path}: tokenizer.ggml.token_type has {types.shape[0]} entries for {n} tokens.")
        t = types[:n].astype(np.int64)
        t = np.where((t < 0) | (t >= len(_TYPE_TO_ATTR)), 0, t)
        return _TYPE_TO_ATTR[t].astype(np.int64)

    def _prefix_groups(self, ids: list[int], width: int = 6) -> list[tuple[str, list[int]]]:
        """Special tokens grouped by their first `width` characters, for a cheap presence test."""
        groups: dict[str, list[int]] = {}
        for t in ids:
            groups.setdefault(self.tokens[t][:width], []).append(t)
        return list(groups.items())

    def _mark_control(self, tid: int, attrs: np.ndarray) -> None:
        # llama.cpp: "control-looking token ... was not control-type; its type will be overridden"
        attrs[tid] |= ATTR_CONTROL

    def _detect_special_ids(self, ids: dict[str, int | None], attrs: np.ndarray) -> None:
        """Find EOT/EOM/FIM ids by their text when the metadata does not give them.

        llama.cpp takes the first match in unordered_map order, which is unspecified; when a vocab
        holds several candidates for one role we take the lowest id. The EOG set does not depend
        on this choice (every EOT candidate is an EOG text).
        """
        t2i = self.token_to_id
        groups = [("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), *_FIM_TEXTS.items()]
        for name, texts in groups:
            if ids[name] is not None:
                continue
            found = sorted(t2i[t] for t in texts if t in t2i)
            if found:
                ids[name] = found[0]
                self._mark_control(found[0], attrs)
        # Control tokens whose text says "unused" are flagged UNUSED (rendering is unaffected).
        for i in np.flatnonzero(attrs & ATTR_CONTROL).tolist():
            if "unused" in self.tokens[i]:
                attrs[i] |= ATTR_UNUSED

    def _eog(self, ids: dict[str, int | None], attrs: np.ndarray) -> set[int]:
        """The end-of-generation set, built as llama.cpp builds special_eog_ids."""
        t2i = self.token_to_id
        eog: set[int] = set()
        for name in ("fim_pad", "fim_rep", "fim_sep"):
            if ids[name] is not None:
                eog.add(ids[name])  # type: ignore[arg-type]
        for text in _EOG_TEXTS:
            tid = t2i.get(text)
            if tid is not None:
                eog.add(tid)
                self._mark_control(tid, attrs)
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):  # gpt-oss: always rendered
            tid = t2i.get(text)
            if tid is not None:
                attrs[tid] = ATTR_USER_DEFINED
        for name in ("eos", "eot", "eom"):
            if ids[name] is not None and ids[name] not in eog:
                eog.add(ids[name])  # type: ignore[arg-type]
        texts = {self.tokens[i]: i for i in eog}
        # o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
        has_call = "<|call|>" in texts or "<|calls|>" in texts
        if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(texts["<|end|>"])
            attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
        # gemma4 / paddleocr: "</s>" is not EOG when "<|tool_response>" is.
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])
            attrs[texts["</s>"]] = ATTR_NORMAL
        return eog

    def _apply_name_rules(self, md: dict, attrs: np.ndarray) -> None:
        """Per-model lstrip/rstrip attributes llama.cpp sets from the model name or pre-tokenizer."""
        t2i = self.token_to_id
        name = str(md.get("general.name", "")).lower()
        pre = str(md.get("tokenizer.ggml.pre", ""))
        arch = str(md.get("general.architecture", ""))
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
        ):
            if "<mask>" in t2i:
                attrs[t2i["<mask>"]] |= ATTR_LSTRIP
        elif "phi-3" in name or "phi3" in name:
            attrs[(attrs & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) != 0] |= ATTR_RSTRIP
            if "</s>" in t2i:
                attrs[t2i["</s>"]] |= ATTR_RSTRIP
            for text in ("<unk>", "<s>", "<|endoftext|>"):
                if text in t2i:
                    attrs[t2i[text]] &= ~ATTR_RSTRIP
        elif "modern-bert" in name and "[MASK]" in t2i:
            attrs[t2i["[MASK]"]] |= ATTR_LSTRIP

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`, as ``llama_tokenize(text, add_special, parse_special)``.

        add_special: prepend BOS / append EOS when the model asks for them (``add_bos``,
        ``add_eos``). parse_special: text equal to a CONTROL or UNKNOWN token (``<|im_start|>``,
        ``<bos>``) becomes that token; USER_DEFINED tokens are always cut out, as in llama.cpp.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, not {type(text).__name__}.")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates cannot reach llama.cpp as UTF-8; drop them like llama-cpp-python's
            # encode(errors="ignore") does rather than fail.
            text = text.encode("utf-8", errors="ignore").decode("utf-8")
        fragments = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)  # type: ignore[arg-type]
        if self._spm is not None:
            prev_special = True
            for start, end, tid in fragments:
                if tid >= 0:
                    out.append(tid)
                    prev_special = True
                    continue
                raw = text[start:end]
                if self.add_space_prefix and prev_special:
                    raw = " " + raw
                out.extend(self._spm.encode(raw.replace(" ", SPACE)))
                prev_special = False
        elif self._bpe is not None:
            for start, end, tid in fragments:
                if tid >= 0:
                    out.append(tid)
                else:
                    out.extend(self._bpe.encode(text[start:end]))
        if add_special and self.add_eos:
            out.append(self.eos_id)  # type: ignore[arg-type]
        return out

    def _partition(self, text: str, parse_special: bool) -> list[tuple[int, int, int]]:
        """Cut special tokens out of `text` (llama.cpp's tokenizer_st_partition).

        Returns (start, end, token) triples: token -1 is raw text [start, end), otherwise the
        special token found there. Each special token, longest first, splits every remaining raw
        fragment at each of its occurrences, left to right. Tokens absent from `text` cannot split
        anything, so we first find the few that occur (grouped by prefix: one substring test
        rules out e.g. all 6,242 of gemma's "<unused…>" tokens) and only touch fragments that hold
        an occurrence.
        """
        tokens = self.tokens
        present: list[int] = []
        for prefix, members in (self._groups_all if parse_special else self._groups_user):
            if prefix in text:
                present.extend(t for t in members if tokens[t] in text)
        if not present:
            return [(0, len(text), -1)]
        present.sort(key=self._special_rank.__getitem__)
        frags: list[tuple[int, int, int]] = [(0, len(text), -1)]
        starts = [0]
        for tid in present:
            needle = tokens[tid]
            width = len(needle)
            affected: list[int] = []
            pos = text.find(needle)
            while pos >= 0:
                idx = bisect_right(starts, pos) - 1
                s, e, t = frags[idx]
                if pos >= e:  # in text stripped by lstrip/rstrip, outside every fragment
                    pos = text.find(needle, pos + 1)
                    continue
                if t < 0 and pos + width <= e:
                    affected.append(idx)
                # Any later occurrence starting in this fragment is either inside it (handled by
                # the split below) or runs past its end like this one: jump to the next fragment.
                pos = text.find(needle, e)
            if not affected:
                continue
            new: list[tuple[int, int, int]] = []
            last = 0
            for idx in affected:
                new.extend(frags[last:idx])
                s, e, _ = frags[idx]
                self._split_fragment(text, s, e, tid, new)
                last = idx + 1
            new.extend(frags[last:])
            frags = new
            starts = [f[0] for f in frags]
        return frags

    def _split_fragment(self, text: str, start: int, end: int, tid: int, out: list[tuple[int, int, int]]) -> None:
        """Split raw text [start, end) at every occurrence of token `tid`, appending to `out`."""
        needle = self.tokens[tid]
        width = len(needle)
        attr = self.attrs[tid]
        while True:
            at = text.find(needle, start, end)
            if at < 0:
                if start < end:
                    out.append((start, end, -1))
                return
            left_end = at
            if attr & ATTR_LSTRIP:
                while left_end > start and text[left_end - 1] in _C_SPACE:
                    left_end -= 1
            if left_end > start:
                out.append((start, left_end, -1))
            out.append((at, at + width, tid))
            start = at + width
            if attr & ATTR_RSTRIP:
                while start < end and text[start] in _C_SPACE:
                    start += 1
            if start >= end:
                return

    # ------------------------------------------------------------------ decoding
    def token_to_bytes(self, token_id: int, special: bool = True) -> bytes:
        """The bytes llama.cpp's token_to_piece gives for one id (see detok.py for the rules).

        special=True renders CONTROL/UNKNOWN tokens as their text; special=False renders them
        as nothing. A BYTE token yields one byte, which may be part of a multi-byte character.
        """
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1}).")
        attr = self.attrs[token_id]
        if not special and attr & ATTR_SPECIAL:
            return b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = token_piece(self.tokens[token_id], attr, self._gpt2_bytes)
        return piece

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """The bytes of ``decode``: pieces concatenated, BOS-prefix space rule applied."""
        ids = list(ids)
        data = b"".join([self.token_to_bytes(int(i), special=not skip_special) for i in ids])
        if ids and ids[0] == self.bos_id and data[:1] == b" ":
            data = data[1:]
        return data

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`, equal to llama-cpp-python ``Llama.detokenize(ids, special=not skip_special)``
        decoded as UTF-8 with U+FFFD for invalid bytes.

        skip_special=False renders control tokens such as ``<|im_end|>`` as text; True drops
        CONTROL/UNKNOWN tokens (USER_DEFINED ones are still rendered, as in llama.cpp).
        """
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def is_eog(self, token_id: int) -> bool:
        """Whether generation stops at this id (llama_vocab_is_eog)."""
        return token_id in self.eog_ids

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        """A StreamDecoder over this tokenizer: push ids one by one, get whole characters back."""
        return StreamDecoder(self, skip_special)

    def __repr__(self) -> str:
        return f"Tokenizer({self.kind}, pre={self.pre!r}, vocab_size={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id})"
