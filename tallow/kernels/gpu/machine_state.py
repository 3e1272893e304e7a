"""The machine's state beside a speed figure, so a slow run can be told from a hot, throttled or
shared machine (issue 12): on a GPU the SM and memory clocks, temperature, power draw and power
limit from NVML (the `nvidia-ml-py` package, imported as `pynvml`); on the CPU the load average
and the current frequency where the system exposes them. Every field is best effort: a missing
library or counter leaves the field out, never fails the caller."""

from __future__ import annotations

import os

import torch


def gpu_state(index: int = 0) -> dict:
    """NVML readings of GPU `index`: {} when NVML (or the GPU) is not there."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001  (no driver, no device: no readings)
        return {}
    out: dict = {}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        readings = {
            "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "utilization_pct": lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
        }
        for name, read in readings.items():
            try:
                out[name] = read()
            except Exception:  # noqa: BLE001  (a counter this GPU or driver does not expose)
                pass
    except Exception:  # noqa: BLE001
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
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
