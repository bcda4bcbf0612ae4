"""Host work per engine step, counted with torch dispatch modes on any device (a CPU included):
operator calls (OpCounter: each is one eager dispatch, one kernel launch or more on a GPU) and
host syncs (SyncCounter). Measuring tools of the benchmarks and tests; the engine never imports them.

A host sync makes the host wait for all device work queued before it. In an engine step all host
data is numpy and every torch tensor is device data, so each of these counts wherever it lives:
ops that read device values on the host (`_local_scalar_dense`: item/bool/int, `nonzero`,
`masked_select`, `unique`, `repeat_interleave` without an output size, boolean-mask indexing);
copies to the host (a dispatched `_to_copy`/`copy_` to the CPU from another device, and the
`tolist`/`numpy`/`cpu` methods, patched while counting since on a CPU tensor they dispatch nothing).
"""
from __future__ import annotations

from collections import Counter

import torch
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
    mode class: operator calls here, host syncs with `SyncCounter`)."""
    counts = []
    while engine.has_unfinished():
        with counter() as c:
            engine.step()
        counts.append(c.total)
    return counts


_SYNC_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
             "aten._unique2.default", "aten.unique_dim.default", "aten.unique_consecutive.default",
             "aten.repeat_interleave.Tensor"}
_PATCHED = ("tolist", "numpy", "cpu")


class SyncCounter(TorchDispatchMode):
    """`with SyncCounter() as s: engine.step()` then `s.total` and `s.by_kind`."""

    def __init__(self) -> None:
        super().__init__()
        self.by_kind: Counter[str] = Counter()
        self._saved: dict = {}
        self._on_host: dict[int, torch.Tensor] = {}   # what a counted `.cpu()` returned (kept alive)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if name in _SYNC_OPS and not (name == "aten.repeat_interleave.Tensor" and kwargs.get("output_size")):
            self.by_kind[name] += 1
        elif name.startswith(("aten.index.", "aten.index_put", "aten._index_put_impl_")) and _bool_index(args):
            self.by_kind[f"{name} (boolean mask)"] += 1
        elif name in ("aten._to_copy.default", "aten.copy_.default") and _to_host(name, args, kwargs):
            self.by_kind["device-to-host copy"] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        for m in _PATCHED:
            original = getattr(torch.Tensor, m)
            self._saved[m] = original
            setattr(torch.Tensor, m, self._counting(m, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for m, original in self._saved.items():
            setattr(torch.Tensor, m, original)
        self._saved.clear()
        return super().__exit__(*exc)

    def _counting(self, name: str, original):
        counter, on_host = self.by_kind, self._on_host

        def method(t, *a, **kw):
            if id(t) not in on_host:                  # .cpu().numpy() is one readback, not two
                counter[f"Tensor.{name}"] += 1
            out = original(t, *a, **kw)
            if name == "cpu":
                on_host[id(out)] = out
            return out

        return method

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


def _bool_index(args) -> bool:
    idx = args[1] if len(args) > 1 else None
    return isinstance(idx, (list, tuple)) and any(
        torch.is_tensor(i) and i.dtype == torch.bool for i in idx if i is not None)


def _to_host(name: str, args, kwargs) -> bool:
    if name == "aten._to_copy.default":
        src, dst = args[0], kwargs.get("device")
        return dst is not None and torch.device(dst).type == "cpu" and src.device.type != "cpu"
    dst, src = args[0], args[1]
    return dst.device.type == "cpu" and src.device.type != "cpu"


def syncs_per_step(engine) -> list[int]:
    """Step `engine` until it has nothing left; the host syncs of every step."""
    return ops_per_step(engine, SyncCounter)
