"""A reading of how fast this machine runs right now: one fixed GEMM (256 rows through the
model's MLP up-projection), the median of a few timings.

A virtual machine changes speed by up to 1.5x within minutes. `calibrate` reads the gauge around
its operator timings and each timed batch; a CPU serving point reads it before and after its
replay, so a simulated-vs-measured comparison can tell the machine's drift from the simulator's
error (dllm_bench.simulate.validate).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np

GAUGE_ROWS = 256


def device_sync(device) -> Callable[[], None] | None:
    """What makes a timing honest on `device`: a CUDA kernel launch returns before the kernel
    has run, so a CUDA timing waits for the device; a CPU op has finished when it returns."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    return lambda: torch.cuda.synchronize(dev)


def median_time(fn: Callable[[], object], repeats: int, sync: Callable[[], None] | None = None) -> float:
    """Median wall time of `fn` over `repeats` calls after one untimed call; `sync` (from
    `device_sync`) is waited for before each start and stop."""
    wait = sync or (lambda: None)
    fn()
    ts = []
    for _ in range(repeats):
        wait()
        t0 = time.perf_counter()
        fn()
        wait()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


class SpeedGauge:
    """The gauge for one model shape, dtype and device; `readings` keeps every reading taken."""

    def __init__(self, d_model: int, mlp_hidden: int, dtype, repeats: int = 7, seed: int = 0, device="cpu"):
        import torch

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


DRIFT_WARN = 1.1


def drift(readings: Iterable[float]) -> float | None:
    """The slowest reading over the fastest (1.0: the machine held its speed); None with < 2."""
    r = [float(x) for x in readings if x]
    return max(r) / min(r) if len(r) >= 2 else None
