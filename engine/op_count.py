"""Torch operator calls per engine step, counted with a dispatch mode: a hardware-independent
measure of host work (every call is one eager dispatch, one kernel launch or more on a GPU)."""
from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """`with OpCounter() as c: ...` then `c.total` and `c.by_op` (aten overload name -> calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.by_op[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_op.values())


def ops_per_step(engine, counter=OpCounter) -> list[int]:
    """Step `engine` until it has nothing left; each step's `total` under `counter` (a dispatch
    mode class: operator calls here, host syncs with `engine.sync_count.SyncCounter`)."""
    counts = []
    while engine.has_unfinished():
        with counter() as c:
            engine.step()
        counts.append(c.total)
    return counts
