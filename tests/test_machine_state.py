"""The machine's state beside every figure (issue 12): NVML readings on a GPU, load and frequency
on the CPU, in `tallow bench`, each generation's stats, the server's timings and /metrics. No GPU
here, so NVML is a stand-in module; the real one ran on the H200 (ledger)."""

from __future__ import annotations

import sys
import threading
import types

import pytest
import torch

from tallow.kernels.gpu import machine_state as ms
from tallow.kernels.gpu.machine_state import describe, gpu_state, machine_state


@pytest.fixture(autouse=True)
def fresh_nvml():
    """NVML is initialised once per process: each test starts from none."""
    ms._NVML.clear()
    yield
    ms._NVML.clear()


def _fake_pynvml(fail_power: bool = False) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    m.calls = []
    m.nvmlInit = lambda: m.calls.append("init")
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    m.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1980, 2: 3201}[kind]
    m.nvmlDeviceGetTemperature = lambda h, kind: 41

    def power(h):
        if fail_power:
            raise RuntimeError("not supported")
        return 259000

    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700000
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97)
    return m


def test_gpu_state_reads_nvml_and_skips_what_is_missing(monkeypatch):
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = gpu_state(0)
    assert s == {"sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "temperature_c": 41, "power_w": 259.0,
                 "power_limit_w": 700.0, "utilization_pct": 97}
    assert describe(s) == "SM 1980 MHz, mem 3201 MHz, 41 C, 259/700 W"
    assert gpu_state(0) == s and fake.calls == ["init"]  # initialised once, kept: a reading per request stays cheap
    ms._NVML.clear()
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail_power=True))
    s = gpu_state(0)
    assert "power_w" not in s and s["sm_clock_mhz"] == 1980


def test_no_nvml_or_no_driver_gives_no_readings(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert gpu_state(0) == {}
    broken = _fake_pynvml()

    def no_driver():
        raise OSError("NVML Shared Library Not Found")

    broken.nvmlInit = no_driver
    ms._NVML.clear()
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert gpu_state(0) == {}
    assert gpu_state(0) == {} and ms._NVML == {"failed": True}  # not retried per reading


def test_cpu_state_has_the_load_and_never_touches_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    s = machine_state(torch.device("cpu"))
    assert s["load_avg_1m"] >= 0
    assert "sm_clock_mhz" not in s
    assert "load" in describe(s)


def test_each_generation_carries_the_machine_state(tmp_path):
    from tiny_models import write_tiny_model

    import tallow

    llm = tallow.load(write_tiny_model("llama", tmp_path / "tiny.gguf"), ctx=64)
    c = llm.generate("hello", max_tokens=2)
    assert c.stats.machine["load_avg_1m"] >= 0
    assert set(llm.machine_state()) >= {"load_avg_1m"}


def test_metrics_expose_the_machine_as_gauges():
    from tallow.server.app import _prometheus
    from tallow.server.worker import Metrics

    reading = {"load_avg_1m": 1.5, "sm_clock_mhz": 1980, "power_w": 259.0, "power_limit_w": 700.0, "unknown_field": 3}
    llm = types.SimpleNamespace(context_used=3, n_ctx=64, machine_state=lambda: reading)
    worker = types.SimpleNamespace(metrics=Metrics(), llm=llm, queue_depth=0, running=None, ready=threading.Event())
    text = _prometheus(types.SimpleNamespace(worker=worker))
    for line in ("tallow_machine_load_average_1m 1.5", "tallow_gpu_sm_clock_mhz 1980", "tallow_gpu_power_watts 259",
                 "tallow_gpu_power_limit_watts 700", "# TYPE tallow_gpu_sm_clock_mhz gauge"):
        assert line in text.splitlines(), line
    assert "unknown_field" not in text
    worker.llm = None  # still loading: the host's readings only
    assert "tallow_machine_load_average_1m" in _prometheus(types.SimpleNamespace(worker=worker))
