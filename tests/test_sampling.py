"""Sampler stages on hand-built logits, checked against llama.cpp's definitions."""

from __future__ import annotations

import math

import pytest
import torch

from tallow.errors import UsageError
from tallow.sampling import (
    Sampler,
    SamplingParams,
    apply_penalties,
    min_p,
    temperature,
    top_k,
    top_p,
)

OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}  # all filters disabled


def cand(values: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(len(values)), torch.tensor(values, dtype=torch.float32)


def ids(c: tuple[torch.Tensor, torch.Tensor]) -> list[int]:
    return c[0].tolist()


def test_greedy_is_argmax_first_on_ties() -> None:
    s = Sampler(SamplingParams(temperature=0.0), vocab_size=5)
    assert s.sample(torch.tensor([0.0, 3.0, -1.0, 3.0, 2.0]), []) == 1
    assert s.sample(torch.tensor([5.0, 3.0, -1.0, 3.0, 5.0]), []) == 0


def test_greedy_applies_penalties_first() -> None:
    # As in llama.cpp, the penalties stage runs before the temp<=0 argmax.
    p = SamplingParams(temperature=0.0, repeat_penalty=2.0)
    s = Sampler(p, vocab_size=3)
    assert s.sample(torch.tensor([4.0, 3.0, 0.0]), history=[0]) == 1  # 4/2 = 2 < 3


def test_seed_reproducibility() -> None:
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    a = Sampler(params, 1000)
    b = Sampler(params, 1000)
    seq_a = [a.sample(logits, []) for _ in range(50)]
    seq_b = [b.sample(logits, []) for _ in range(50)]
    assert seq_a == seq_b
    assert len(set(seq_a)) > 5  # it really samples
    c = Sampler(
        SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=4321), 1000
    )
    assert [c.sample(logits, []) for _ in range(50)] != seq_a


def test_unseeded_samplers_record_their_seed() -> None:
    s = Sampler(SamplingParams(), 10)
    replay = Sampler(SamplingParams(seed=s.seed), 10)
    logits = torch.zeros(10)
    assert [s.sample(logits, []) for _ in range(20)] == [
        replay.sample(logits, []) for _ in range(20)
    ]


def test_sampling_distribution_follows_temperature() -> None:
    logits = torch.tensor([math.log(0.7), math.log(0.2), math.log(0.1)])
    s = Sampler(SamplingParams(temperature=1.0, **OFF, seed=7), 3)
    n = 4000
    counts = torch.bincount(
        torch.tensor([s.sample(logits, []) for _ in range(n)]), minlength=3
    )
    freq = counts.double() / n
    assert torch.allclose(
        freq, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64), atol=0.03
    )


def test_top_k() -> None:
    c = top_k(cand([1.0, 5.0, 3.0, 4.0, 2.0]), 3)
    assert ids(c) == [1, 3, 2]  # sorted by logit
    assert ids(top_k(cand([1.0, 2.0]), 0)) == [0, 1]  # disabled
    assert ids(top_k(cand([1.0, 2.0]), 10)) == [1, 0]  # k > n keeps all, sorted
    # Exactly k survive even with ties at the cut; lower ids win.
    assert ids(top_k(cand([2.0, 1.0, 2.0, 3.0, 2.0]), 3)) == [3, 0, 2]


def test_top_p() -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    c = cand([math.log(p) for p in probs])
    assert ids(top_p(c, 0.79)) == [0, 1]  # stop at the first token where cum >= p
    assert ids(top_p(c, 0.81)) == [0, 1, 2]
    assert ids(top_p(c, 0.5 - 1e-6)) == [0]
    assert ids(top_p(c, 0.1)) == [0]  # always at least one
    assert ids(top_p(c, 1.0)) == [0, 1, 2, 3]  # disabled, order untouched
    # Probabilities are renormalised over the candidates that reach this stage.
    assert ids(top_p(top_k(c, 2), 0.6)) == [0]  # 0.5/0.8 = 0.625 >= 0.6


def test_min_p() -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    c = cand([math.log(p) for p in probs])
    assert ids(min_p(c, 0.3)) == [0, 1, 2]  # keep p >= 0.3 * 0.5 = 0.15
    assert ids(min_p(c, 0.61)) == [0]
    assert ids(min_p(c, 0.0)) == [0, 1, 2, 3]
    # Order-preserving on unsorted candidates (llama.cpp's unsorted path).
    assert ids(min_p(cand([0.0, 5.0, 4.9]), 0.5)) == [1, 2]


def test_temperature_scales_logits() -> None:
    _, logits = temperature(cand([2.0, -4.0]), 0.5)
    assert logits.tolist() == [4.0, -8.0]


def test_filters_restrict_the_draw() -> None:
    logits = torch.tensor([0.0, 10.0, 9.9, 9.8, -5.0])
    s = Sampler(
        SamplingParams(temperature=5.0, top_k=2, top_p=1.0, min_p=0.0, seed=1), 5
    )
    drawn = {s.sample(logits, []) for _ in range(200)}
    assert drawn == {1, 2}


def test_repeat_penalty_math() -> None:
    p = SamplingParams(repeat_penalty=2.0, repeat_last_n=64)
    logits = torch.tensor([4.0, -4.0, 0.0, 1.0])
    out = apply_penalties(logits, [0, 1, 2, 0, 0], p)
    # positive divided, negative (and zero) multiplied, once per distinct token
    assert out.tolist() == [2.0, -8.0, 0.0, 1.0]
    assert logits.tolist() == [4.0, -4.0, 0.0, 1.0]  # input untouched


def test_presence_and_frequency_penalties() -> None:
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(torch.tensor([1.0, 1.0, 1.0]), [0, 0, 0, 1], p)
    assert out.tolist() == pytest.approx([1.0 - 0.75 - 0.5, 1.0 - 0.25 - 0.5, 1.0])


def test_combined_penalties_order() -> None:
    # llama.cpp: repeat penalty first, then subtract count*freq + presence.
    p = SamplingParams(repeat_penalty=2.0, presence_penalty=1.0, frequency_penalty=1.0)
    out = apply_penalties(torch.tensor([6.0, -6.0]), [0, 1, 1], p)
    assert out.tolist() == [6.0 / 2 - 1 - 1, -6.0 * 2 - 2 - 1]


def test_penalty_window() -> None:
    logits = torch.tensor([4.0, 4.0, 4.0])
    last2 = SamplingParams(repeat_penalty=2.0, repeat_last_n=2)
    assert apply_penalties(logits, [0, 1, 2], last2).tolist() == [4.0, 2.0, 2.0]
    everything = SamplingParams(repeat_penalty=2.0, repeat_last_n=-1)
    assert apply_penalties(logits, [0, 1, 2], everything).tolist() == [2.0, 2.0, 2.0]
    off = SamplingParams(repeat_penalty=2.0, repeat_last_n=0)
    assert apply_penalties(logits, [0, 1, 2], off).tolist() == [4.0, 4.0, 4.0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -0.1}, "temperature must be at least 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_k": -1}, "top_k must be at least 0"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"top_k": True}, "top_k must be an integer"),
        ({"top_p": 1.5}, "top_p must be at most 1"),
        ({"min_p": -0.1}, "min_p must be at least 0"),
        ({"repeat_penalty": 0.0}, "repeat_penalty must be greater than 0"),
        ({"repeat_last_n": -2}, "repeat_last_n must be at least -1"),
        (
            {"presence_penalty": float("inf")},
            "presence_penalty must be a finite number",
        ),
        ({"frequency_penalty": "1"}, "frequency_penalty must be a finite number"),
        ({"seed": -1}, "seed must be at least 0"),
        ({"seed": 1.0}, "seed must be an integer"),
    ],
)
def test_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(UsageError, match=match) as info:
        SamplingParams(**kwargs)
    assert str(info.value).count(".") >= 1 and "\n" not in str(info.value)


def test_logits_shape_checked() -> None:
    with pytest.raises(ValueError):
        Sampler(SamplingParams(), 4).sample(torch.zeros(5), [])


def reference_top_p(values: torch.Tensor, p: float) -> list[int]:
    """Straightforward llama.cpp top_p: full stable sort, softmax, first cum >= p."""
    order = torch.sort(values, descending=True, stable=True).indices
    cum = torch.cumsum(torch.softmax(values[order].double(), dim=0), dim=0)
    last = int(torch.nonzero(cum >= p).flatten()[0]) + 1
    return order[:last].tolist()


@pytest.mark.parametrize("p", [0.05, 0.5, 0.95, 0.999])
def test_top_p_on_large_vocab_matches_full_sort(p: float) -> None:
    g = torch.Generator().manual_seed(5)
    values = (torch.randn(50000, generator=g) * 3).round(decimals=1)  # many exact ties
    got = ids(top_p((torch.arange(50000), values), p))
    want = reference_top_p(values, p)
    assert len(got) == len(want)
    assert got == want


def test_top_k_on_large_vocab_with_ties_at_the_cut() -> None:
    values = torch.zeros(100000)
    values[[5, 99, 70000]] = 2.0
    got = ids(top_k((torch.arange(100000), values), 6))
    assert got == [5, 99, 70000, 0, 1, 2]


def test_masked_greedy_equals_masking_a_host_copy():
    """The GPU path of constrained greedy decoding (mask words up, argmax where the logits are)
    picks what masking a copy with -inf and taking its argmax picks: ties to the lowest id,
    tokens past the mask's words never allowed, the sign bit of a word included."""
    import numpy as np

    from tallow.sampling import masked_greedy

    g = torch.Generator().manual_seed(4)
    for vocab, n_bits in ((100, 96), (70, 64), (64, 64)):
        for _ in range(20):
            logits = torch.randint(-3, 3, (vocab,), generator=g).float()  # many ties
            allowed = torch.rand(n_bits, generator=g) < 0.3
            allowed[31] = True  # bit 31: the sign bit of word 0
            words = np.packbits(allowed.numpy(), bitorder="little").view(np.int32)
            want = logits.clone()
            want[:n_bits][~allowed] = float("-inf")
            want[n_bits:] = float("-inf")
            assert masked_greedy(logits, words) == int(torch.argmax(want))
            cut = n_bits - 7  # a grammar vocabulary shorter than the mask's words
            want[cut:] = float("-inf")
            assert masked_greedy(logits, words, cut) == int(torch.argmax(want))
