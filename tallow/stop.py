"""Stop strings over streamed text.

Generation is streamed to the user a few characters at a time, but a stop string can span
several deltas ("</" + "answer>").  Printing eagerly would leak half a stop string, so the
matcher holds back the longest tail of the text seen so far that could still grow into a
stop string, and releases it as soon as it cannot (or at `flush()` when generation ends
without a stop).  When a stop string completes, everything before its first character is
emitted and the rest is dropped, as llama.cpp's server does (the stop text itself is not
part of the output).

The matcher works on `str`, i.e. whole code points: the detokenizer must already hold back
incomplete UTF-8 byte sequences before pushing text here.
"""

from __future__ import annotations

from .errors import UsageError

__all__ = ["StopMatcher"]


class StopMatcher:
    """Feed text deltas with `push`; stops at the earliest complete stop string."""

    def __init__(self, stop_strings: list[str]) -> None:
        if isinstance(stop_strings, str) or not isinstance(stop_strings, (list, tuple)):
            raise UsageError("Stop strings must be given as a list of strings.")
        for s in stop_strings:
            if not isinstance(s, str) or s == "":
                raise UsageError(
                    f"Every stop string must be a non-empty string, got {s!r}."
                )
        # Longest first: when two stop strings match at the same place, report the longer.
        self.stop_strings: tuple[str, ...] = tuple(
            sorted(set(stop_strings), key=len, reverse=True)
        )
        self._max_len = max((len(s) for s in self.stop_strings), default=0)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended generation, if any

    def push(self, text_delta: str) -> tuple[str, bool]:
        """Add newly generated text; return (text safe to show now, whether a stop matched).

        After a stop, further pushes return ("", True): the caller should stop generating,
        but tokens already in flight are harmless.
        """
        if self.stopped:
            return "", True
        if not self.stop_strings:
            return text_delta, False
        buf = self._held + text_delta
        # The held tail is shorter than the longest stop string, so `buf` stays small and
        # searching all of it also finds a match that began in the held tail.
        cut = -1
        for s in self.stop_strings:
            i = buf.find(s)
            if i != -1 and (cut == -1 or i < cut):
                cut, self.matched = i, s
        if cut != -1:
            self.stopped = True
            self._held = ""
            return buf[:cut], True
        keep = self._partial_suffix_len(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """Generation ended without a stop string: release the held-back tail."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    @property
    def held(self) -> str:
        """Text withheld so far because it may be the start of a stop string."""
        return self._held

    def _partial_suffix_len(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        for n in range(min(len(buf), self._max_len - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return n
        return 0
