"""Memory meter: the CUDA allocator's peak, or the live storages a step creates on a CPU (docs/ENGINE.md)."""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _tensors(obj):
    """The tensors in an op's (nested) arguments or outputs, without tree_flatten's per-leaf cost."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple, dict)):
        for o in obj.values() if isinstance(obj, dict) else obj:
            yield from _tensors(o)


class LiveBytes(TorchDispatchMode):
    """While entered: the bytes of the storages ops create on `device_type` that a tensor still
    refers to (`current`) and their `peak`. Storages from before it are never counted."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in self._mine((args, kwargs))}
        for t in self._mine(out):
            key = t.untyped_storage().data_ptr()
            if key == 0 or (key not in self.refs and key in inputs):    # a view or an in-place result
                continue
            if key not in self.refs:
                self._add(key, t)
            self.refs[key] += 1
            weakref.finalize(t, self._release, key)
        return out

    def _mine(self, obj):
        return (t for t in _tensors(obj) if t.device.type == self.device_type and not t.is_meta)

    def _add(self, key: int, t: torch.Tensor) -> None:
        n = t.untyped_storage().nbytes()
        self.refs[key], self.sizes[key] = 0, n
        self.current += n
        self.peak = max(self.peak, self.current)

    def _release(self, key: int) -> None:
        if key in self.refs:
            self.refs[key] -= 1
            if not self.refs[key]:
                del self.refs[key]
                self.current -= self.sizes.pop(key)


class MemoryMeter:
    """`with MemoryMeter(device) as m: ...` then `m.peak_bytes` (bytes above the starting level)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.peak_bytes = 0
        self.mode = None if self.device.type == "cuda" else LiveBytes()

    def __enter__(self) -> MemoryMeter:
        if self.mode is None:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self.mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.mode is None:
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            self.mode.__exit__(*exc)
            self.peak_bytes = self.mode.peak


def free_device_memory(device: torch.device | str) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device once this process's cached blocks are returned."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return int(free), int(total)


def budget_from_free(free: int, resident: int, utilization: float) -> int:
    """The default GPU budget: `utilization` of the memory free before the weights (`resident`) loaded."""
    return int((free + resident) * utilization)
