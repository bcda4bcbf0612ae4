"""The speed gauge: one fixed GEMM (256 rows through a model's MLP up-projection), timed on
demand, which tells how fast this machine runs right now. A shared machine changes speed by up
to 1.5x within minutes; `calibrate` reads the gauge around what it times, and a serve point
reads it around its replay when a validation asks for it (`DLLM_BENCH_SPEED_GAUGE=1`).
What calibration and validation do with the readings is dllm_bench.simulate.drift."""
from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from dllm_bench.timing import device_sync, median_time

GAUGE_ROWS = 256
# Serve points read the gauge only when this is set: a validation's measured side
# (`make bench-validate`); every other run skips the extra GEMM timings.
GAUGE_ENV = "DLLM_BENCH_SPEED_GAUGE"
DRIFT_WARN = 1.1


def requested() -> bool:
    """Whether serve's points should read the speed gauge (`DLLM_BENCH_SPEED_GAUGE=1`)."""
    return os.environ.get(GAUGE_ENV, "").strip().lower() not in ("", "0", "false", "no")


class SpeedGauge:
    """The gauge for one model shape, dtype and device; `readings` keeps every reading taken."""

    def __init__(self, d_model: int, mlp_hidden: int, dtype, repeats: int = 7, seed: int = 0, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(GAUGE_ROWS, d_model, generator=g).to(device=device, dtype=dtype)
        self.w = torch.randn(d_model, 2 * mlp_hidden, generator=g).to(device=device, dtype=dtype)
        self.sync = device_sync(device)
        self.repeats = max(3, repeats)
        self.readings: list[float] = []

    def read(self) -> float:
        t = median_time(lambda: self.x @ self.w, self.repeats, self.sync)
        self.readings.append(t)
        return t


def drift(readings: Iterable[float]) -> float | None:
    """The slowest reading over the fastest (1.0: the machine held its speed); None with < 2."""
    r = [float(x) for x in readings if x]
    return max(r) / min(r) if len(r) >= 2 else None
