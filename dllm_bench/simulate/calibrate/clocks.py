"""A GPU's clocks during a calibration, through NVML (the `pynvml` module of nvidia-ml-py): what
a GPU reports instead of the CPU's speed gauge. A GPU that holds its clocks needs no
rescaling; one whose SM clock drops (power or thermal limits) times slower than it serves cool,
and the calibration says so. Without pynvml nothing is read, and the calibration says that.
"""
from __future__ import annotations

import statistics

import torch

DROP_WARN = 0.9        # the lowest SM clock read below this share of the highest: warn


class Clocks:
    """Readings of one GPU: SM and memory clock (MHz), temperature (°C), power (W)."""

    def __init__(self, nvml, handle):
        self.nvml, self.handle = nvml, handle
        self.readings: list[dict] = []

    def read(self) -> dict:
        n, h = self.nvml, self.handle
        r = {"sm_mhz": float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
             "mem_mhz": float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
             "temp_c": float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
             "power_w": float(n.nvmlDeviceGetPowerUsage(h)) / 1e3}
        self.readings.append(r)
        return r

    def summary(self) -> dict:
        sm = [r["sm_mhz"] for r in self.readings]
        if not sm:
            return {"readings": 0}
        return {"readings": len(sm), "sm_mhz": [min(sm), statistics.median(sm), max(sm)],
                "mem_mhz": statistics.median(r["mem_mhz"] for r in self.readings),
                "temp_c": [min(r["temp_c"] for r in self.readings), max(r["temp_c"] for r in self.readings)],
                "power_w": max(r["power_w"] for r in self.readings), "dropped": min(sm) < DROP_WARN * max(sm)}

    def line(self) -> str:
        s = self.summary()
        if not s["readings"]:
            return "GPU clocks: no reading taken"
        lo, mid, hi = s["sm_mhz"]
        return (f"GPU clocks over {s['readings']} readings: SM {mid:.0f} MHz ({lo:.0f}–{hi:.0f}), memory "
                f"{s['mem_mhz']:.0f} MHz, {s['temp_c'][0]:.0f}–{s['temp_c'][1]:.0f} °C, up to {s['power_w']:.0f} W")


def open_clocks(device) -> tuple[Clocks | None, str]:
    """(the device's clocks, "") or (None, why none can be read)."""
    try:
        import pynvml  # optional: nvidia-ml-py
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py): no GPU clock read during calibration"
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.device(device).index or 0)
        clocks = Clocks(pynvml, handle)
        clocks.read()
    except Exception as e:  # NVML errors are their own exception type per library version
        return None, f"NVML could not read this GPU ({type(e).__name__}: {e}): no clock read during calibration"
    return clocks, ""
