"""Named parts of a step a caller can observe: `region(name)` enters `observe`'s factory(name), if any."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager

LM_HEAD = "lm_head"     # the final norm and LM head GEMM of the decoded rows
DECODE = "decode"       # proposals, confidences, the commit choice

Factory = Callable[[str], AbstractContextManager]
_factory: Factory | None = None


def observe(factory: Factory | None) -> Factory | None:
    """Install `factory` (None: none) for every region from now on; returns the one it replaces."""
    global _factory
    previous, _factory = _factory, factory
    return previous


def region(name: str) -> AbstractContextManager:
    return contextlib.nullcontext() if _factory is None else _factory(name)


def in_region(name: str):
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with region(name):
                return fn(*args, **kwargs)
        return inner
    return wrap
