"""Cancellation reaches the prompt too: should_stop is asked between prefill chunks."""

from __future__ import annotations

from tiny_models import write_tiny_model

from tallow.engine.engine import Engine, GenerationStats
from tallow.gguf_file import GGUFFile
from tallow.models import build_model
from tallow.sampling import Sampler, SamplingParams
from tallow.spec import spec_from_gguf


def test_should_stop_during_prefill_frees_the_engine_after_one_chunk(tmp_path):
    gf = GGUFFile(write_tiny_model("llama", tmp_path / "tiny.gguf"))
    spec = spec_from_gguf(gf)
    engine = Engine(build_model(gf, spec), n_ctx=64, prefill_chunk=4)
    sampler = Sampler(SamplingParams(temperature=0), spec.vocab_size)
    asked = []

    def gone() -> bool:
        asked.append(len(engine.kv.tokens))
        return True

    stats = GenerationStats()
    tokens = list(engine.generate(list(range(20)), 8, sampler, set(), stats, should_stop=gone))
    assert tokens == [] and stats.finish_reason == "stop"
    assert asked == [4] and engine.kv.tokens == [0, 1, 2, 3]  # one chunk done, a valid prefix kept
    # The engine is free: the next request reuses that prefix and completes.
    stats = GenerationStats()
    assert len(list(engine.generate(list(range(20)), 3, sampler, set(), stats))) == 3
    assert stats.reused_tokens == 4
