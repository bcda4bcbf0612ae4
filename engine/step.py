"""A step on the host: its columns (`StepMeta`), index arrays and their one copy (`Staging`); the runner seam."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from engine.kv_cache import CODES as CACHE_CODES
from engine.models import ModelConfig
from engine.request import Phase, Request

Batch = list[tuple[Request, Phase]]
CODES = {Phase.REFRESH: 0, Phase.REFRESH_STORE: 1, Phase.REFRESH_SELECT: 2, Phase.REUSE: 3}
_EMPTY = np.zeros(0, dtype=np.int64)


def offsets(lens) -> np.ndarray:
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def ragged(starts, lens) -> np.ndarray:
    """Concatenated ranges [starts[i], starts[i] + lens[i]) as one index array."""
    starts, lens = np.asarray(starts, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    return np.repeat(starts - offsets(lens)[:-1], lens) + np.arange(int(lens.sum()))


def padded(starts, lens, width: int) -> tuple[np.ndarray, np.ndarray]:
    """[G, width] indices starts[g] + j, valid where j < lens[g] (a pad repeats the row's first) -> (index, valid)."""
    j = np.arange(width)
    valid = j < np.asarray(lens, dtype=np.int64)[:, None]
    return np.asarray(starts, dtype=np.int64)[:, None] + j * valid, valid


@dataclass
class StepMeta:
    offset: np.ndarray        # of the canvas in the step's token tensor
    length: np.ndarray
    block_len: np.ndarray
    block_start: np.ndarray
    kv: np.ndarray            # KV slots reserved
    k: np.ndarray             # tokens this step commits
    phase: np.ndarray
    slot_base: np.ndarray     # where each member's slot table starts in `slots` (the tables end to end)
    slots: np.ndarray
    refresh: np.ndarray
    q_start: np.ndarray
    n_q: np.ndarray           # the canvas (Refresh*) or lead + the block (Reuse)
    cu_q: np.ndarray
    lead: np.ndarray          # Reuse: query-only rows before the block (a shifted family's edge row)
    cache: np.ndarray         # kv_cache.CODES per member

    @classmethod
    def of(cls, batch: Batch, starts: np.ndarray, host_slots, shift: int = 0) -> StepMeta:
        """`starts`: each canvas's `offset`; `host_slots(table)`: a slot table on the host; `shift`: the model's."""
        cols = np.array([(r.length, r.block_length, r.prompt_len + r.block * r.block_length, r.kv_tokens,
                          r.commit_count, CODES[p], CACHE_CODES.get(r.cache, 0)) for r, p in batch],
                        dtype=np.int64).reshape(-1, 7).T
        tables = [_EMPTY if r.slots is None else host_slots(r.slots) for r, _ in batch]
        length, block_len, block_start, _, _, phase, cache = cols
        refresh = phase != CODES[Phase.REUSE]
        lead = np.where(refresh, 0, np.minimum(block_start, shift))
        n_q = np.where(refresh, length, block_len + lead)
        slot_base = offsets([len(t) for t in tables])[:-1]
        return cls(starts, *cols[:6], slot_base, np.concatenate([_EMPTY, *tables]), refresh,
                   np.where(refresh, 0, block_start - lead), n_q, offsets(n_q), lead, cache)


class _Segment:
    def __init__(self, n: int, device: torch.device):
        self.pinned = torch.empty(n, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.host = self.pinned.numpy()
        self.device = torch.empty(n, dtype=torch.int64, device=device)
        self.used = 0


class Staging:
    """Buffers kept from step to step, grown by doubling; `buffered`: even on the CPU (as a CUDA graph needs)."""

    def __init__(self, device, capacity: int = 0, buffered: bool = False):
        self.device = torch.device(device)
        self.on_host = self.device.type == "cpu" and not buffered
        self.segments = [_Segment(capacity, self.device)] if capacity and not self.on_host else []

    @property
    def used(self) -> int:
        return sum(s.used for s in self.segments)

    def begin(self) -> Staging:
        """Start a step's puts at offset 0 (merging last step's segments into one buffer)."""
        if len(self.segments) > 1:
            self.segments = [_Segment(sum(s.device.numel() for s in self.segments), self.device)]
        for s in self.segments:
            s.used = 0
        return self

    def put(self, a: np.ndarray) -> torch.Tensor:
        a = np.asarray(a)
        if self.on_host:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
        if not self.segments or self.segments[-1].used + a.size > self.segments[-1].device.numel():
            total = sum(s.device.numel() for s in self.segments)
            self.segments.append(_Segment(max(a.size, total, 1 << 14), self.device))
        seg = self.segments[-1]
        seg.host[seg.used : seg.used + a.size] = a.reshape(-1)
        seg.used += a.size
        return seg.device[seg.used - a.size : seg.used].view(a.shape)

    def flush(self) -> None:
        for s in self.segments:
            if s.used:
                s.device[: s.used].copy_(s.pinned[: s.used], non_blocking=True)


@dataclass
class StepDecisions:
    """Entry i: request `row[i]` commits `tokens[i]` at `positions[i]`; request j is charged `logits_rows[j]` rows."""
    row: torch.Tensor
    positions: torch.Tensor
    tokens: torch.Tensor
    confidence: torch.Tensor
    logits_rows: list[int]
    canvas_index: torch.Tensor | None = None   # positions in the engine's canvas pool, when known
    taken: torch.Tensor | None = None          # which entries commit (None: all)


@dataclass
class StepStats:
    query_tokens: int
    logits_rows: int
    max_logits_rows: int
    refresh: int
    reuse: int
    decisions: StepDecisions | None = None
    graph: bool = False
    padded_requests: int | None = None      # the step trace's padded batch; None: the batch
    key_tokens: int = 0
    cache: dict[str, int] | None = None


class Runner(Protocol):
    model_config: ModelConfig
    dtype: torch.dtype            # of the KV cache
    device: torch.device

    def run(self, batch: Batch) -> StepStats: ...
