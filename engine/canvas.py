"""Every running request's canvas in one token tensor.

At admission a request's canvas moves into a contiguous range of `CanvasPool.tokens` and
`req.canvas` becomes a view of it, so a step gathers the input ids of all requests with one
indexed read and commits every decision with one indexed write. On release the canvas is copied
out again (the request keeps its tokens, the range is reused).
"""
from __future__ import annotations

import torch

from engine.kv_cache import SlotRanges
from engine.request import Request


class CanvasPool:
    def __init__(self, device):
        self.device = device
        self.tokens = torch.empty(0, dtype=torch.long, device=device)
        self.ranges = SlotRanges(0)
        self.placed: dict[int, Request] = {}        # offset -> request

    def place(self, req: Request) -> None:
        n = req.length
        got = self.ranges.take(n, contiguous=True)
        if got is None:
            old = self.tokens
            self.tokens = torch.empty(max(2 * old.numel(), old.numel() + n, 1024), dtype=torch.long, device=self.device)
            self.tokens[: old.numel()] = old
            self.ranges.grow(self.tokens.numel())
            for off, r in self.placed.items():      # re-point the views at the new storage
                r.canvas = self.tokens[off : off + r.length]
            got = self.ranges.take(n, contiguous=True)
        off = got[0][0]
        self.tokens[off : off + n] = req.canvas
        req.canvas, req.canvas_offset, req.canvas_pool = self.tokens[off : off + n], off, self
        self.placed[off] = req

    def release(self, req: Request) -> None:
        off = req.canvas_offset
        if self.placed.pop(off, None) is None:
            return
        req.canvas = req.canvas.clone()
        req.canvas_offset = req.canvas_pool = None
        self.ranges.put([(off, off + req.length)])
