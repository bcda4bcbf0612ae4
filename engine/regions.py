"""Named profiler regions: where `dllm-bench profile-step` files a step's ops as LM head or
decoding (sampling, top-k, the commit choice) whatever the ops are. Outside a profiler a region
costs one flag check (torch.profiler.record_function itself costs microseconds per use)."""
from __future__ import annotations

import contextlib
import functools

import torch

LM_HEAD = "dllm.lm_head"     # the final norm and LM head GEMM of the decoded rows
DECODE = "dllm.decode"       # proposals, confidences, the commit choice


def region(name: str):
    """A `record_function` region while a profiler runs, else a no-op context."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


def in_region(name: str):
    """Decorator: every call of the function runs in the region `name`."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with region(name):
                return fn(*args, **kwargs)
        return inner
    return wrap
