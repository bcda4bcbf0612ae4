"""Timing an operation on a device: wait for the device before each start and stop, take the
median of a few calls after an untimed one (calibrate's operators, the speed gauge, doctor's
layer timing)."""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch


def device_sync(device) -> Callable[[], None] | None:
    """What makes a timing honest on `device`: a CUDA kernel launch returns before the kernel
    has run, so a CUDA timing waits for the device; a CPU op has finished when it returns."""
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
