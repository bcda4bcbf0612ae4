"""How a calibration times its device. A CPU op has finished when it returns and a shared CPU's
speed drifts: the wall clock, a speed gauge around everything. A CUDA launch returns before the
kernel ran and a GPU's first calls of a shape choose kernels and allocate: CUDA events after a
few untimed calls, each host-time batch warmed on its own shapes, the GPU's clocks read through
NVML (clocks.py) instead of a gauge.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dllm_bench.timing import device_median_time, device_sync, median_time

CUDA_WARMUP = 3
Timer = Callable[[Callable[[], object], int], float]


@dataclass(frozen=True)
class Mode:
    """`events`: operators timed by CUDA events after CUDA_WARMUP untimed calls (else the wall
    clock after one); `gauge`: the CPU speed gauge read around everything; `warm_steps` /
    `timed_steps`: each host-time batch first runs this many steps untimed on its own prompts,
    then is timed for at most this many (None: whole requests after one warm-up request);
    `saturate`: default sizes run ascending to the largest the budget admits, stopping once
    rows/s no longer grows."""

    name: str
    events: bool
    gauge: bool
    warm_steps: int | None
    timed_steps: int | None
    saturate: bool

    def timer(self, device) -> Timer:
        if self.events:
            return lambda fn, repeats: device_median_time(fn, repeats, device, CUDA_WARMUP, events=True)
        sync = device_sync(device)
        return lambda fn, repeats: median_time(fn, repeats, sync)


CPU = Mode("cpu", events=False, gauge=True, warm_steps=None, timed_steps=None, saturate=False)
GPU = Mode("gpu", events=True, gauge=False, warm_steps=8, timed_steps=32, saturate=True)


def mode_for(device) -> Mode:
    return GPU if torch.device(device).type == "cuda" else CPU
