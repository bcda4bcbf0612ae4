"""profile-step's profiler ranges: its own (the step, its bookkeeping) and, while `labelled()`,
the engine's and baselines' regions (engine.regions) as `dllm.<name>` ranges."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from engine import regions

STEP = "profile_step.step"                 # the range around one system.step()
BOOKKEEPING = "profile_step.bookkeeping"   # profile-step's own work inside a step (FLOP counts)
LM_HEAD = "dllm." + regions.LM_HEAD
DECODE = "dllm." + regions.DECODE


def profiler_range(name: str) -> contextlib.AbstractContextManager:
    """A `record_function` range while a profiler runs, else a no-op (record_function costs
    microseconds per use)."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


@contextlib.contextmanager
def labelled() -> Iterator[None]:
    """While inside, every engine region is a profiler range named `dllm.<name>`."""
    previous = regions.observe(lambda name: profiler_range("dllm." + name))
    try:
        yield
    finally:
        regions.observe(previous)
