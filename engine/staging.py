"""One host-to-device copy of a step's index metadata (docs/ENGINE.md)."""
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
    """Buffers kept from step to step, grown by doubling (the same puts land at the same offsets)."""

    def __init__(self, device, capacity: int = 0, buffered: bool | None = None):
        """`buffered`: through a buffer even on the CPU (what a CUDA graph replay relies on)."""
        self.device = torch.device(device)
        self.on_host = self.device.type == "cpu" and not buffered
        self.segments = [_Segment(capacity, self.device)] if capacity and not self.on_host else []

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
        for s in self.segments:
            if s.used:
                s.device[: s.used].copy_(s.pinned[: s.used], non_blocking=True)
