"""Every running request's canvas in one token tensor, mirrored on the host.

At admission a request's canvas moves into a contiguous range of `CanvasPool.tokens` (device)
and of `CanvasPool.host` (numpy); `req.canvas` and `req.host_canvas` become views of them, so a
step stages the input ids of all requests with one host gather, commits every decision with one
indexed device write, and finds candidates without reading the device. On release both are
copied out again (the request keeps its tokens, the range is reused).
"""
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

    def place(self, req: Request) -> None:
        n = req.length
        got = self.ranges.take(n, contiguous=True)
        if got is None:
            old, old_host = self.tokens, self.host
            size = max(2 * old.numel(), old.numel() + n, 1024)
            self.tokens = torch.empty(size, dtype=torch.long, device=self.device)
            self.tokens[: old.numel()] = old
            self.host = np.empty(size, dtype=np.int64)
            self.host[: old_host.size] = old_host
            self.ranges.grow(size)
            for off, r in self.placed.items():      # re-point the views at the new storage
                r.canvas = self.tokens[off : off + r.length]
                r.host_canvas = self.host[off : off + r.length]
            got = self.ranges.take(n, contiguous=True)
        off = got[0][0]
        self.tokens[off : off + n] = req.canvas
        self.host[off : off + n] = req.host_canvas
        req.canvas, req.canvas_offset, req.canvas_pool = self.tokens[off : off + n], off, self
        req.host_canvas = self.host[off : off + n]
        self.placed[off] = req

    def release(self, req: Request) -> None:
        off = req.canvas_offset
        if self.placed.pop(off, None) is None:
            return
        req.canvas = req.canvas.clone()
        req.host_canvas = req.host_canvas.copy()
        req.canvas_offset = req.canvas_pool = None
        self.ranges.put([(off, off + req.length)])
