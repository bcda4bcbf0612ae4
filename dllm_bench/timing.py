"""Timing an operation on a device: wait for the device before each start and stop, take the
median of a few calls after an untimed one (calibrate's operators, the speed gauge, doctor's
layer timing); `device_median_time` times a GPU call by CUDA events (the peaks, `peak_rates`)."""
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


def device_median_time(fn: Callable[[], object], repeats: int, device, warmup: int = 1,
                       events: bool | None = None) -> float:
    """`median_time` on `device`, on a GPU by CUDA events recorded around each call: the device's
    own time, without the launch and synchronisation latency a host clock adds to a short call;
    after `warmup` untimed calls (a GPU's first calls of a shape choose kernels and allocate).
    `events`: force (or refuse) the events path whatever the device (tests fake CUDA's events)."""
    dev = torch.device(device)
    if not (dev.type == "cuda" if events is None else events):
        return median_time(fn, repeats, device_sync(dev))
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(dev)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        ts.append(start.elapsed_time(stop) / 1e3)
    return float(np.median(ts))


def peak_rates(n: int, copy_elems: int, dtype, device, repeats: int,
               timed: Callable[[Callable[[], object], int], float] | None = None) -> tuple[float, float]:
    """FLOP/s of an n x n x n GEMM in `dtype` and bytes/s of a `copy_elems` copy (read + write)
    on `device`: the device's peaks (calibrate, the ridge of `cache=auto`). `timed(fn, repeats)`
    times a call (calibrate's mode); None = device_median_time."""
    dev = torch.device(device)
    timed = timed or (lambda fn, r: device_median_time(fn, r, dev))
    a, b = torch.randn(n, n, dtype=dtype, device=dev), torch.randn(n, n, dtype=dtype, device=dev)
    flops = 2 * n**3 / timed(lambda: a @ b, repeats)
    x = torch.randn(copy_elems, dtype=torch.float32, device=dev).to(dtype)
    y = torch.empty_like(x)
    bw = 2 * x.numel() * x.element_size() / timed(lambda: y.copy_(x), repeats)
    return flops, bw
