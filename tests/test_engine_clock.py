"""The prefill and decode clocks stop only after the device has finished (issue 12): on a GPU
the prefill loop returns while its kernels are still queued, so a clock read right then is ~40x
too short. Here the device wait is replaced by one that takes 50 ms, which the clocks must count."""

from __future__ import annotations

import time

import torch
from tiny_models import write_tiny_model

import tallow.engine.engine as engine_mod
from tallow.engine.engine import Engine, GenerationStats
from tallow.gguf_file import GGUFFile
from tallow.models import build_model
from tallow.sampling import Sampler, SamplingParams
from tallow.spec import spec_from_gguf

SLOW_DEVICE_S = 0.05


def test_prefill_and_decode_clocks_wait_for_the_device(tmp_path, monkeypatch):
    gf = GGUFFile(write_tiny_model("llama", tmp_path / "tiny.gguf"))
    spec = spec_from_gguf(gf)
    engine = Engine(build_model(gf, spec), n_ctx=64)
    sampler = Sampler(SamplingParams(temperature=0), spec.vocab_size)
    waited = []

    def slow_device(device: torch.device) -> None:
        waited.append(device)
        time.sleep(SLOW_DEVICE_S)  # the queued device work still running

    monkeypatch.setattr(engine_mod, "wait_for_device", slow_device)
    stats = GenerationStats()
    assert len(list(engine.generate(list(range(12)), 3, sampler, set(), stats))) == 3
    assert len(waited) == 2 and waited[0] == engine.model.device
    assert stats.prefill_s >= SLOW_DEVICE_S
    assert stats.decode_s >= SLOW_DEVICE_S
    assert stats.ttft_s >= stats.prefill_s  # the first token comes after the finished prefill


def test_wait_for_device_is_a_no_op_on_the_cpu():
    engine_mod.wait_for_device(torch.device("cpu"))  # must not touch torch.cuda
