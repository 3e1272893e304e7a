"""SentencePiece-style tokenizer (llama.cpp's ``LLAMA_VOCAB_TYPE_SPM``, tokenizer.ggml.model=llama).

llama.cpp does not run SentencePiece itself: it escapes spaces to U+2581 ("▁"), splits the text
into characters and greedily merges the adjacent pair whose concatenation is the highest-scoring
vocab entry (leftmost on ties) until no pair is in the vocab; characters left outside the vocab
fall back to byte tokens ``<0xXX>``. We reproduce that loop exactly.

Speed: the loop runs over the whole raw fragment, with no pre-tokenizer, so we split the fragment
into chunks where no merge can ever cross: just before a run of "▁" whose preceding character
``c`` never appears as ``c + "▁"`` inside any vocab entry (for gemma3 only ">" does). A bigram
across such a boundary would contain ``c▁`` and so can never be a vocab entry; merges inside the
chunks then happen in the same relative order as in the whole text, giving the same tokens. The
chunks (mostly "▁word") are cached.
"""

from __future__ import annotations

import heapq
import re
from typing import Sequence

from ..errors import ModelFileError

SPACE = "\u2581"


class SpmTokenizer:
    """Encodes one raw fragment (already space-escaped) to ids like llm_tokenizer_spm_session."""

    _CACHE_LIMIT = 200_000

    def __init__(self, tokens: Sequence[str], token_to_id: dict[str, int], scores: Sequence[float], path: str = "model"):
        self.token_to_id = token_to_id
        self.scores = scores
        self.path = path
        self._byte_ids: list[int | None] = [self._find_byte_token(b) for b in range(256)]
        # Characters c with some vocab entry containing c + "▁" (c != "▁"): we must not cut there.
        joined = "\x00".join(tokens)
        unsafe = set(re.findall(f"([^{SPACE}\x00]){SPACE}", joined))
        cls = "".join(re.escape(c) for c in sorted(unsafe))
        not_before = f"[^{SPACE}{cls}]"
        self._boundary = re.compile(f"(?<={not_before})(?={SPACE})")
        self._cache: dict[str, list[int]] = {}

    def _find_byte_token(self, b: int) -> int | None:
        """llama.cpp's byte_to_token: "<0xXX>", else the byte itself as a one-character entry."""
        tid = self.token_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self.token_to_id.get(chr(b))
        return tid

    def encode(self, text: str) -> list[int]:
        """Tokenize `text`, in which spaces have already been replaced by "▁"."""
        out: list[int] = []
        cache = self._cache
        for chunk in self._boundary.split(text):
            if not chunk:
                continue
            ids = cache.get(chunk)
            if ids is None:
                if len(cache) >= self._CACHE_LIMIT:
                    cache.clear()
                ids = cache[chunk] = self._encode_chunk(chunk)
            out.extend(ids)
        return out

    def _encode_chunk(self, text: str) -> list[int]:
        vocab = self.token_to_id
        scores = self.scores
        n = len(text)
        texts = list(text)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        # Max-heap on score, then leftmost: entries are (-score, left, right, size).
        heap: list[tuple[float, int, int, int]] = []
        for i in range(n - 1):
            tid = vocab.get(text[i:i + 2])
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            lt, rt = texts[left], texts[right]
            if not lt or not rt or len(lt) + len(rt) != size:
                continue  # one side was merged elsewhere since this pair was queued
            texts[left] = merged = lt + rt
            texts[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                pair = texts[before] + merged
                tid = vocab.get(pair)
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], before, left, len(pair)))
            if after >= 0:
                pair = merged + texts[after]
                tid = vocab.get(pair)
                if tid is not None:
                    heapq.heappush(heap, (-scores[tid], left, after, len(pair)))
        out: list[int] = []
        i = 0
        while i != -1:
            piece = texts[i]
            tid = vocab.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                # Only single characters can be missing (merged symbols are vocab entries).
                for b in piece.encode("utf-8"):
                    bid = self._byte_ids[b]
                    if bid is None:
                        raise ModelFileError(
                            f"{self.path}: the vocabulary has no byte token <0x{b:02X}> to spell {piece!r}; "
                            "llama.cpp fails on this input too."
                        )
                    out.append(bid)
            i = nxt[i]
        return out
