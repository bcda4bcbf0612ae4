"""Memory meter: measured, not assumed.

On CUDA it reads the allocator's peak. On CPU there is no allocator statistic, so it tracks
live tensor storage with a TorchDispatchMode: every storage an op creates is counted while any
tensor created in the mode still refers to it (reference counts per storage, released by
weakref finalizers), and the peak of that live total is the activation peak. Tensors that
existed before the meter started (weights, KV pool) are not counted: the meter measures what
a step allocates on top of them, which is exactly what the profiler needs.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _is_cpu_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_meta


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _LiveBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Storages of the inputs: an output that aliases one of them (a view or an in-place
        # result) is not an allocation. Without this check, a view of a tensor from before the
        # meter (e.g. `kv[layer, 0]` of the KV pool) counted its whole storage as new bytes.
        inputs = {_storage_key(t) for t in tree_flatten((args, kwargs))[0] if _is_cpu_tensor(t)}
        for t in tree_flatten(out)[0]:
            if _is_cpu_tensor(t):
                self._track(t, inputs)
        return out

    def _track(self, t: torch.Tensor, inputs: set[int]) -> None:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key == 0:
            return
        if key not in self.refs:
            if key in inputs:  # aliases a tensor that predates the meter: not counted (see above)
                return
            self.refs[key] = 0
            self.sizes[key] = st.nbytes()
            self.current += st.nbytes()
            self.peak = max(self.peak, self.current)
        self.refs[key] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        n = self.refs.get(key)
        if n is None:
            return
        if n <= 1:
            del self.refs[key]
            self.current -= self.sizes.pop(key)
        else:
            self.refs[key] = n - 1


class MemoryMeter:
    """`with MemoryMeter(device) as m: ...` then `m.peak_bytes` (bytes above the starting level)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.peak_bytes = 0
        self._mode: _LiveBytes | None = None

    def __enter__(self) -> MemoryMeter:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._mode = _LiveBytes()
            self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            assert self._mode is not None
            self._mode.__exit__(*exc)
            self.peak_bytes = self._mode.peak

    @property
    def current_bytes(self) -> int:
        return self._mode.current if self._mode else 0


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
