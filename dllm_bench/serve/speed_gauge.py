"""Readings of how fast this machine runs right now, each the median of a few timings of one fixed
piece of work: one GEMM (256 rows through the model's MLP up-projection, `SpeedGauge`) or one
forward of the served model over a fixed 64-token sequence (`ForwardGauge`).

A virtual machine changes speed by up to 1.5x within minutes. `calibrate` reads the gauges around
its operator timings (and the GEMM one around each timed batch); a CPU serving point reads both
before and after its replay, so a simulated-vs-measured comparison can tell the machine's drift
from the simulator's error (dllm_bench.simulate.validate). The GEMM sees how fast the machine
multiplies; the forward also sees the per-operator dispatch and the small kernels that make up most
of a small model's step, and follows a step's time more closely when the machine changes speed
(docs/SIMULATE.md, "Which gauge").
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


class Gauge:
    """A fixed piece of work, timed on demand; `readings` keeps every reading taken."""

    def __init__(self, work: Callable[[], object], repeats: int, sync: Callable[[], None] | None = None):
        self.work, self.repeats, self.sync = work, max(3, repeats), sync
        self.readings: list[float] = []

    def read(self) -> float:
        t = median_time(self.work, self.repeats, self.sync)
        self.readings.append(t)
        return t


class SpeedGauge(Gauge):
    """One GEMM of the model's MLP up-projection shape, in its dtype, on `device`."""

    def __init__(self, d_model: int, mlp_hidden: int, dtype, repeats: int = 7, seed: int = 0, device="cpu"):
        import torch

        g = torch.Generator().manual_seed(seed)
        x = torch.randn(GAUGE_ROWS, d_model, generator=g).to(device=device, dtype=dtype)
        w = torch.randn(d_model, 2 * mlp_hidden, generator=g).to(device=device, dtype=dtype)
        super().__init__(lambda: x @ w, repeats, device_sync(device))


FORWARD_TOKENS = 64


class ForwardGauge(Gauge):
    """One forward (every layer and the LM head) of `model` over fixed token ids, batch 1."""

    def __init__(self, model, repeats: int = 5, tokens: int = FORWARD_TOKENS, seed: int = 0):
        import torch

        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=g).to(model.device)

        def work():
            with torch.inference_mode():
                return model(ids)

        super().__init__(work, repeats, device_sync(model.device))


DRIFT_WARN = 1.1


def drift(readings: Iterable[float]) -> float | None:
    """The slowest reading over the fastest (1.0: the machine held its speed); None with < 2."""
    r = [float(x) for x in readings if x]
    return max(r) / min(r) if len(r) >= 2 else None
