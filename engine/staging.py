"""One host-to-device copy of a step's index metadata.

A step's metadata (input ids, positions, cu_seqlens, slot tables, gather indices) is built on
the host with numpy (`engine.ragged`). `Staging.put(array)` hands back a device tensor at once:
on the CPU it shares the array's memory; on CUDA it is a view into a device buffer whose
contents arrive with the pinned, non-blocking copy `flush()` enqueues, so kernels enqueued after
`flush()` on the same stream see the data and nothing may read them before it (derived tensors
are built in the forward, `StepContext.finalize`). Buffers and graphs: see `Staging`.
"""
from __future__ import annotations

import numpy as np
import torch

MIN_ELEMENTS = 1 << 14


class _Segment:
    def __init__(self, n: int, device: torch.device):
        self.pinned = torch.empty(n, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.host = self.pinned.numpy()
        self.device = torch.empty(n, dtype=torch.int64, device=device)
        self.used = 0


class Staging:
    """Buffers are kept from step to step and grow by doubling: a step that outgrows them continues
    in a new segment (one more copy that step) and the next starts with one buffer large enough,
    so a steady state has one copy per step. The pinned host buffer is rewritten for step t+1
    only after step t's copy completed (the step's one readback waits for everything before it).
    A CUDA graph keeps its own Staging (`engine.graphs`): the same puts in the same order land at
    the same offsets, so a replay reads the new step's metadata from the captured buffer."""

    def __init__(self, device, capacity: int = 0, buffered: bool | None = None):
        """`buffered`: stage through a buffer even on the CPU (default: only on an accelerator),
        so a CPU run exercises what a CUDA graph replay relies on (`engine.graphs`)."""
        self.device = torch.device(device)
        self.on_host = self.device.type == "cpu" and not buffered
        self.segments: list[_Segment] = []
        self.copies = 0                               # copies enqueued by the last flush
        if capacity and not self.on_host:
            self.segments.append(_Segment(capacity, self.device))

    @property
    def used(self) -> int:
        return sum(s.used for s in self.segments)

    def begin(self) -> Staging:
        """Start a step's puts at offset 0 (merging last step's segments into one buffer)."""
        if len(self.segments) > 1:
            total = sum(s.device.numel() for s in self.segments)
            self.segments = [_Segment(total, self.device)]
        for s in self.segments:
            s.used = 0
        return self

    def put(self, a: np.ndarray) -> torch.Tensor:
        """An integer (or bool) host array as an int64 device tensor of the same shape."""
        a = np.asarray(a)
        if self.on_host:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
        n = a.size
        seg = self.segments[-1] if self.segments else None
        if seg is None or seg.used + n > seg.device.numel():
            cap = sum(s.device.numel() for s in self.segments)
            seg = _Segment(max(n, cap, MIN_ELEMENTS), self.device)
            self.segments.append(seg)
        a0 = seg.used
        seg.host[a0 : a0 + n] = a.reshape(-1)
        seg.used += n
        return seg.device[a0 : a0 + n].view(a.shape)

    def flush(self) -> None:
        """Enqueue the copies of everything put since `begin` (none on the CPU)."""
        self.copies = 0
        for s in self.segments:
            if s.used:
                s.device[: s.used].copy_(s.pinned[: s.used], non_blocking=True)
                self.copies += 1
