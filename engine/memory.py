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


def _is_cpu_tensor(t, device_type: str = "cpu") -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == device_type and not t.is_meta


def _tensors(obj):
    """The tensors in an op's (nested) arguments or outputs: tree_flatten's leaves that are
    tensors, without its per-leaf cost (the meter runs on every op of a step)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)
    elif obj is not None and not isinstance(obj, (int, float, bool, str, torch.dtype, torch.device)):
        yield from (t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor))


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _LiveBytes(TorchDispatchMode):
    """`tag(tensor) -> str`: a label kept per storage (what it is, e.g. by its shape) and, with
    it, `at_peak`: every live storage's (bytes, label) at the moment of the peak (`LiveTracker`)."""

    def __init__(self, device_type: str = "cpu", tag=None) -> None:
        super().__init__()
        self.device_type, self.tag = device_type, tag
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.tags: dict[int, str] = {}
        self.at_peak: dict[int, tuple[int, str]] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # Storages of the inputs: an output that aliases one of them (a view or an in-place
        # result) is not an allocation. Without this check, a view of a tensor from before the
        # meter (e.g. `kv[layer, 0]` of the KV pool) counted its whole storage as new bytes.
        dev = self.device_type
        inputs = {_storage_key(t) for t in _tensors((args, kwargs)) if _is_cpu_tensor(t, dev)}
        for t in _tensors(out):
            if _is_cpu_tensor(t, dev):
                self._track(t, inputs)
        return out

    def reset_peak(self) -> None:
        self.peak = self.current
        if self.tag is not None:
            self._snapshot()

    def _snapshot(self) -> None:
        self.at_peak = {k: (n, self.tags[k]) for k, n in self.sizes.items()}

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
            if self.tag is not None:
                self.tags[key] = self.tag(t)
            if self.current > self.peak:
                self.peak = self.current
                if self.tag is not None:
                    self._snapshot()
        self.refs[key] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        n = self.refs.get(key)
        if n is None:
            return
        if n <= 1:
            del self.refs[key]
            self.current -= self.sizes.pop(key)
            self.tags.pop(key, None)
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


class LiveTracker:
    """Every storage allocated on `device` while entered, until freed: the live bytes, their peak
    (`reset_peak` starts a new one, e.g. per step) and, with `tag`, what was live at the peak by
    label. Unlike `MemoryMeter` it counts on any device type (a CUDA run's breakdown, beside the
    allocator's own peak) and is meant to span a whole run."""

    def __init__(self, device: torch.device | str = "cpu", tag=None):
        self._mode = _LiveBytes(torch.device(device).type, tag)

    def __enter__(self) -> LiveTracker:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    @property
    def current_bytes(self) -> int:
        return self._mode.current

    @property
    def peak_bytes(self) -> int:
        return self._mode.peak

    def reset_peak(self) -> None:
        self._mode.reset_peak()

    def at_peak(self) -> dict[int, tuple[int, str]]:
        """storage key -> (bytes, label) of every storage live at the peak."""
        return dict(self._mode.at_peak)



def free_device_memory(device: torch.device | str) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device, after this process's cached blocks are returned:
    memory an earlier engine freed is still held by the caching allocator and not "free"."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return int(free), int(total)


def budget_from_free(free: int, resident: int, utilization: float) -> int:
    """The default budget for weights + activations + KV on a GPU: `utilization` of the memory
    that was free before the model's weights were loaded, i.e. `free` measured now plus
    `resident`, the bytes of those weights already on the device (0 when measured before
    loading). The rest covers the CUDA context and allocator fragmentation."""
    return int((free + resident) * utilization)
