"""Named parts of a step a profiler can observe: `region(name)` runs inside `observe`'s factory(name), if any."""
from __future__ import annotations

import contextlib
from collections.abc import Callable

LM_HEAD = "lm_head"     # the final norm and LM head GEMM of the decoded rows
DECODE = "decode"       # proposals, confidences, the commit choice

Factory = Callable[[str], contextlib.AbstractContextManager]
_factory: Factory | None = None


def observe(factory: Factory | None) -> Factory | None:
    """Install `factory` (None: none) for every region from now on; returns the one it replaces."""
    global _factory
    previous, _factory = _factory, factory
    return previous


@contextlib.contextmanager
def region(name: str):
    """`with region(name):`, or on a function `@region(name)` (`in_region`)."""
    with contextlib.nullcontext() if _factory is None else _factory(name):
        yield


in_region = region
