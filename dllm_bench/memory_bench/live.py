"""`LiveTracker`: every storage allocated on a device over a whole run, its live bytes, their
peak and, by label, what was live at the peak (engine.profiler's count, on any device type)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.profiler import LiveBytes


class _Tagged(LiveBytes):
    """LiveBytes keeping `tag(tensor)` per storage and every live storage's (bytes, label) at the peak."""

    def __init__(self, device_type: str, tag: Callable[[torch.Tensor], str]) -> None:
        super().__init__(device_type)
        self.tag = tag
        self.tags: dict[int, str] = {}
        self.at_peak: dict[int, tuple[int, str]] = {}

    def reset_peak(self) -> None:
        self.peak = self.current
        self._snapshot()

    def _snapshot(self) -> None:
        self.at_peak = {k: (n, self.tags[k]) for k, n in self.sizes.items()}

    def _add(self, key: int, t: torch.Tensor) -> None:
        self.tags[key] = self.tag(t)
        peak = self.peak
        super()._add(key, t)
        if self.current > peak:
            self._snapshot()

    def _release(self, key: int) -> None:
        super()._release(key)
        if key not in self.sizes:
            self.tags.pop(key, None)


class LiveTracker:
    """Every storage allocated on `device` while entered, until freed: the live bytes, their peak
    (`reset_peak` starts a new one, e.g. per step) and what was live at the peak by `tag`'s label.
    Unlike engine.profiler.MemoryMeter it counts on CUDA too (a breakdown beside the allocator's peak)."""

    def __init__(self, device: torch.device | str, tag: Callable[[torch.Tensor], str]):
        self._mode = _Tagged(torch.device(device).type, tag)

    def __enter__(self) -> LiveTracker:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    @property
    def peak_bytes(self) -> int:
        return self._mode.peak

    def reset_peak(self) -> None:
        self._mode.reset_peak()

    def at_peak(self) -> dict[int, tuple[int, str]]:
        """storage key -> (bytes, label) of every storage live at the peak."""
        return dict(self._mode.at_peak)
