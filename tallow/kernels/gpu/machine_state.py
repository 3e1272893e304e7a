"""The machine's state beside a speed figure, so a slow run can be told from a hot, throttled or
shared machine (issue 12): on a GPU the SM and memory clocks, temperature, power draw and power
limit from NVML (the `nvidia-ml-py` package, imported as `pynvml`); on the CPU the load average
and the current frequency where the system exposes them. Every field is best effort: a missing
library or counter leaves the field out, never fails the caller.

Read after each `tallow bench` test, after each generation (`stats.machine`, the server's
`timings.machine`) and at each scrape of `/metrics` (the gauges in METRICS)."""

from __future__ import annotations

import os

import torch


_NVML: dict = {}  # "module": pynvml once initialised, "handles": {index: handle}; {"failed": True} if it cannot be


def _nvml_handle(index: int):
    """(pynvml, handle of GPU `index`), initialising NVML once per process (a per-reading init
    and shutdown would cost milliseconds per request); None where NVML or the GPU is missing."""
    if _NVML.get("failed"):
        return None
    try:
        if "module" not in _NVML:
            import pynvml

            pynvml.nvmlInit()
            _NVML.update(module=pynvml, handles={})
        nvml = _NVML["module"]
        if index not in _NVML["handles"]:
            _NVML["handles"][index] = nvml.nvmlDeviceGetHandleByIndex(index)
        return nvml, _NVML["handles"][index]
    except Exception:  # noqa: BLE001  (no package, no driver, no such device: no readings)
        if "module" not in _NVML:
            _NVML["failed"] = True
        return None


def gpu_state(index: int = 0) -> dict:
    """NVML readings of GPU `index`: {} when NVML (or the GPU) is not there."""
    found = _nvml_handle(index)
    if found is None:
        return {}
    nvml, h = found
    readings = {
        "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
        "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "power_limit_w": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        "utilization_pct": lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu,
    }
    out: dict = {}
    for name, read in readings.items():
        try:
            out[name] = read()
        except Exception:  # noqa: BLE001  (a counter this GPU or driver does not expose)
            pass
    return out


def cpu_state() -> dict:
    out: dict = {}
    try:
        out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        pass
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq") as f:
            out["cpu_mhz"] = int(f.read().strip()) // 1000
    except (OSError, ValueError):
        pass
    return out


def machine_state(device: torch.device | str) -> dict:
    """cpu_state(), plus gpu_state() of the device's GPU on a CUDA device."""
    device = torch.device(device)
    state = cpu_state()
    if device.type == "cuda":
        state.update(gpu_state(device.index or 0))
    return state


def describe(state: dict) -> str:
    """One short line for a terminal, e.g. 'SM 1980 MHz, mem 3201 MHz, 41 C, 259/700 W, load 1.2'."""
    parts = []
    if "sm_clock_mhz" in state:
        parts.append(f"SM {state['sm_clock_mhz']} MHz")
    if "mem_clock_mhz" in state:
        parts.append(f"mem {state['mem_clock_mhz']} MHz")
    if "temperature_c" in state:
        parts.append(f"{state['temperature_c']} C")
    if "power_w" in state:
        parts.append(f"{state['power_w']:.0f}" + (f"/{state['power_limit_w']:.0f}" if "power_limit_w" in state else "") + " W")
    if "cpu_mhz" in state:
        parts.append(f"CPU {state['cpu_mhz']} MHz")
    if "load_avg_1m" in state:
        parts.append(f"load {state['load_avg_1m']}")
    return ", ".join(parts)


# Prometheus gauges of /metrics, one per field a reading may carry: (name, help).
METRICS = {
    "load_avg_1m": ("tallow_machine_load_average_1m", "The host's 1-minute load average."),
    "cpu_mhz": ("tallow_machine_cpu_mhz", "CPU 0's current frequency."),
    "sm_clock_mhz": ("tallow_gpu_sm_clock_mhz", "The GPU's SM clock."),
    "mem_clock_mhz": ("tallow_gpu_memory_clock_mhz", "The GPU's memory clock."),
    "temperature_c": ("tallow_gpu_temperature_celsius", "The GPU's temperature."),
    "power_w": ("tallow_gpu_power_watts", "The GPU's power draw."),
    "power_limit_w": ("tallow_gpu_power_limit_watts", "The GPU's enforced power limit."),
    "utilization_pct": ("tallow_gpu_utilization_percent", "The GPU's utilization over NVML's last sample period."),
}
