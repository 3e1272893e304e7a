"""StopMatcher: no stop string ever leaks, even split across deltas."""

from __future__ import annotations

import random

import pytest

from tallow.errors import UsageError
from tallow.stop import StopMatcher


def run(stops: list[str], deltas: list[str]) -> tuple[str, bool, list[str]]:
    """Push all deltas; return (all emitted text incl. flush, stopped, per-push emits)."""
    m = StopMatcher(stops)
    emits = []
    stopped = False
    for d in deltas:
        out, stopped = m.push(d)
        emits.append(out)
        if stopped:
            break
    return "".join(emits) + m.flush(), stopped, emits


def reference(stops: list[str], deltas: list[str]) -> tuple[str, bool]:
    """Streaming semantics (llama.cpp's server): after each delta, if any stop string is
    complete in the text so far, cut at the earliest complete one.  A longer stop string
    that started earlier but is not complete yet does not win: we cannot see the future."""
    text = ""
    for d in deltas:
        text += d
        hits = [i for i in (text.find(s) for s in stops) if i != -1]
        if hits:
            return text[: min(hits)], True
    return text, False


def test_no_stop_strings_passes_through() -> None:
    assert run([], ["ab", "c"]) == ("abc", False, ["ab", "c"])


def test_simple_stop_in_one_delta() -> None:
    m = StopMatcher(["</s>"])
    assert m.push("hello</s>world") == ("hello", True)
    assert m.matched == "</s>"
    assert m.push("more") == ("", True)
    assert m.flush() == ""


def test_split_across_many_deltas_never_leaks() -> None:
    stop = "<|im_end|>"
    deltas = ["Hi", " there", "<", "|", "im", "_", "end", "|", ">", "ignored"]
    text, stopped, emits = run([stop], deltas)
    assert (text, stopped) == ("Hi there", True)
    assert emits[:3] == ["Hi", " there", ""]
    for i in range(len(emits)):
        assert "<" not in "".join(emits[: i + 1])


def test_false_start_is_released() -> None:
    m = StopMatcher(["STOP"])
    assert m.push("ST") == ("", False)
    assert m.held == "ST"
    assert m.push("ART") == ("START", False)  # "STA" cannot become "STOP"
    assert m.push("S") == ("", False)
    assert m.push("x") == ("Sx", False)
    assert m.push("STO") == ("", False)
    assert m.flush() == "STO"  # generation ended: held text is real output


def test_overlapping_candidates() -> None:
    # "aab" inside "aaab" starts at index 1: the held tail must slide over self-overlap.
    assert run(["aab"], ["a", "a", "a", "b", "c"])[:2] == ("a", True)
    # Two stop strings sharing a prefix; the shorter one completes first.
    assert run(["abcd", "abc"], ["ab", "c", "d"])[:2] == ("", True)
    # A later-starting stop string completes while an earlier candidate is still partial.
    text, stopped, _ = run(["xyz123", "z1"], ["xy", "z1"])
    assert (text, stopped) == ("xy", True)
    # Earliest start wins when two complete in the same delta.
    m = StopMatcher(["cd", "bcde"])
    assert m.push("abcdef") == ("a", True)
    assert m.matched == "bcde"
    # Same start: the longer one is reported; the output is the same either way.
    m = StopMatcher(["bc", "bcd"])
    assert m.push("abcd") == ("a", True)
    assert m.matched == "bcd"


def test_hold_back_is_longest_possible_prefix() -> None:
    m = StopMatcher(["abab", "b!"])
    assert m.push("xaba") == ("x", False)  # "aba" is a prefix of "abab"
    assert m.held == "aba"
    assert m.push("b") == ("", True)
    assert m.matched == "abab"
    m = StopMatcher(["abab", "b!"])
    assert m.push("xab") == ("x", False)
    assert (
        m.held == "ab"
    )  # both "ab…" (abab) and "b…" (b!) are possible; keep the longer
    assert m.push("!") == ("a", True)


def test_unicode() -> None:
    stops = ["🛑", "終了", "ß€"]
    assert run(stops, ["日本語の", "終", "了です"])[:2] == ("日本語の", True)
    assert run(stops, ["a🛑b"])[:2] == ("a", True)
    assert run(stops, ["Straß", "e"])[:2] == ("Straße", False)
    assert run(stops, ["Stra", "ß", "€!"])[:2] == ("Stra", True)


def test_stop_at_very_start_and_end() -> None:
    assert run(["###"], ["###", "rest"])[:2] == ("", True)
    assert run(["###"], ["text", "##"])[:2] == ("text##", False)


def test_randomized_against_reference() -> None:
    rng = random.Random(0)
    alphabet = "ab<>|é"
    for _ in range(2000):
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        ]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, len(text))))
        deltas = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        got, stopped, emits = run(stops, deltas)
        assert (got, stopped) == reference(stops, deltas), (stops, deltas)
        # At no point has a complete stop string been emitted.
        shown = "".join(emits)
        assert not any(s in shown for s in stops)


@pytest.mark.parametrize("bad", ["</s>", [""], ["ok", None], None])
def test_validation(bad: object) -> None:
    with pytest.raises(UsageError):
        StopMatcher(bad)  # type: ignore[arg-type]
