"""Every running request's canvas in one token tensor mirrored on the host (`req.canvas` views a range)."""
from __future__ import annotations

import numpy as np
import torch

from engine.kv_cache import SlotRanges
from engine.request import Request


class CanvasPool:
    def __init__(self, device):
        self.device = device
        self.tokens = torch.empty(0, dtype=torch.long, device=device)
        self.host = np.empty(0, dtype=np.int64)
        self.ranges = SlotRanges(0)
        self.placed: dict[int, Request] = {}        # offset -> request
        self.trash: int | None = None               # a cell no canvas owns: writes that commit nothing

    def place(self, req: Request) -> None:
        if self.trash is None:
            self.trash = self._take(1)
        n = req.length
        off = self._take(n)
        self.tokens[off : off + n] = req.canvas
        self.host[off : off + n] = req.host_canvas
        req.canvas, req.canvas_offset, req.canvas_pool = self.tokens[off : off + n], off, self
        req.host_canvas = self.host[off : off + n]
        self.placed[off] = req

    def _take(self, n: int) -> int:
        """A contiguous range of n cells (growing both arrays if needed) -> its offset."""
        got = self.ranges.take(n, contiguous=True)
        if got is None:
            added = max(len(self.host), n, 1024 - len(self.host))   # zeros (a valid id): twice the size or room for n
            self.tokens = torch.cat([self.tokens, torch.zeros(added, dtype=torch.long, device=self.device)])
            self.host = np.concatenate([self.host, np.zeros(added, dtype=np.int64)])
            self.ranges.grow(len(self.host))
            for off, r in self.placed.items():      # re-point the views at the new storage
                r.canvas = self.tokens[off : off + r.length]
                r.host_canvas = self.host[off : off + r.length]
            got = self.ranges.take(n, contiguous=True)
        return got[0][0]

    def release(self, req: Request) -> None:
        off = req.canvas_offset
        if self.placed.pop(off, None) is None:
            return
        req.canvas, req.host_canvas = req.canvas.clone(), req.host_canvas.copy()
        req.canvas_offset = req.canvas_pool = None
        self.ranges.put([(off, off + req.length)])
