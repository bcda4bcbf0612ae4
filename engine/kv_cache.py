"""The KV pool (one K/V storage in token slots, a slot table per request reserved whole at admission),
what each cache mode reserves in it, and the mode `cache=auto` admits a request in (docs/SERVE.md)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from engine.models import ModelConfig


def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    return cfg.n_layers * 2 * cfg.kv_heads * cfg.head_dim * torch.empty(0, dtype=dtype).element_size()


def retained_tokens(context_len: int, retention: float) -> int:
    return max(0, min(context_len, int(context_len * retention)))


def kv_need(cache: str, length: int, block_length: int, retention: float) -> int:
    """Token slots a request needs for its whole life under a cache policy (`auto`: the least, sparse's)."""
    if cache == "dual":
        return length
    if cache in ("sparse", "auto"):
        return retained_tokens(length - block_length, retention) + block_length
    return 0


AUTO = "auto"
CODES = {"none": 0, "dual": 1, "sparse": 2}
SPARSE_MARGIN = 0.05


@dataclass(frozen=True)
class Shape:
    """A request as the mix sees it (canvas, block, steps per block, KV needs) on the device's roofline."""

    length: int
    block: int
    steps: int
    delay_step: int
    dual_need: int
    sparse_need: int
    ridge: float
    kv_per_weight: float = 0.0
    pair_per_row: float = 0.0
    overhead: float = 0.0


def per_weight(cfg: ModelConfig) -> tuple[float, float]:
    """(a token's K/V, a (query, key) pair's attention FLOPs) per weight a forward reads, the whole model's."""
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.head_dim, (cfg.n_kv_heads or cfg.n_heads) * cfg.head_dim
    weights = cfg.n_layers * (d * (q + 2 * kv) + q * d + 3 * d * cfg.mlp_hidden_size) + d * cfg.padded_vocab
    return 2 * cfg.n_layers * kv / weights, 2 * cfg.n_layers * q / weights


def step_time(n_dual, n_sparse, s: Shape):
    """Roofline time in query rows of a step of `n_dual` + `n_sparse` requests of shape `s`; its tokens."""
    S = s.steps
    k_d, k_s = 1, min(S, s.delay_step + 1)       # Refreshes per block: dual one, sparse delay_step + 1
    reuse = (n_dual * (S - k_d) + n_sparse * (S - k_s)) * s.block / S
    keys = (n_dual * (S - k_d) * s.dual_need + n_sparse * (S - k_s) * s.sparse_need) / S
    base = np.maximum(s.ridge * (1 + keys * s.kv_per_weight), reuse)
    refresh = reuse + s.length * (1 + s.length * s.pair_per_row)
    extra = (n_dual * k_d + n_sparse * k_s) / S * np.maximum(0.0, refresh - base)
    return s.overhead + base + extra, (n_dual + n_sparse) * s.block / S


@lru_cache(maxsize=1024)
def preferred_mode(capacity: int, max_seqs: int, s: Shape) -> str:
    """dual or sparse: which commits more tokens per step time filling `capacity` (sparse: by a margin)."""
    n_dual, n_sparse = min(max_seqs, capacity // s.dual_need), min(max_seqs, capacity // s.sparse_need)
    if s.sparse_need >= s.dual_need or n_sparse == 0:
        return "dual"
    if n_dual == 0:
        return "sparse"
    (t_dual, tok_dual), (t_sparse, tok_sparse) = step_time(n_dual, 0, s), step_time(0, n_sparse, s)
    return "sparse" if tok_sparse / t_sparse > (1 + SPARSE_MARGIN) * tok_dual / t_dual else "dual"


def never_cached(capacity: int | None, sparse_need: int) -> bool:
    return capacity is not None and sparse_need > capacity


def admission_mode(free: int | None, dual_need: int, sparse_need: int, preferred: str,
                   capacity: int | None = None) -> str | None:
    """The mode the head of the queue is admitted in, or None: it waits (`none` if never cached)."""
    if free is None:
        return "dual"
    if never_cached(capacity, sparse_need):
        return "none"
    return preferred if (dual_need if preferred == "dual" else sparse_need) <= free else None


class SlotRanges:
    """Free slots as sorted [start, end) ranges: first fit, then any pieces; merged on release."""

    def __init__(self, size: int = 0):
        self.free: list[list[int]] = [[0, size]] if size else []
        self.size = size

    def grow(self, size: int) -> None:
        self.put([(self.size, size)])
        self.size = size

    def take(self, n: int, contiguous: bool = False) -> list[tuple[int, int]] | None:
        for r in self.free:
            if r[1] - r[0] >= n:
                r[0] += n
                self.free = [x for x in self.free if x[1] > x[0]]
                return [(r[0] - n, r[0])]
        if contiguous or sum(e - s for s, e in self.free) < n:
            return None
        got = []
        while self.free[0][1] - self.free[0][0] < n:       # no range fits: the first n free slots, in order
            s, e = self.free.pop(0)
            got.append((s, e))
            n -= e - s
        return got + self.take(n)

    def put(self, pieces: list[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for s, e in sorted([*map(tuple, self.free), *pieces]):
            if merged and merged[-1][1] == s:
                merged[-1][1] = e
            else:
                merged.append([s, e])
        self.free = merged


class KVPool:
    def __init__(self, capacity_tokens: int | None, cfg: ModelConfig, dtype: torch.dtype, device):
        self.capacity, self.cfg, self.dtype, self.device = capacity_tokens, cfg, dtype, device
        self.bytes_per_token = bytes_per_token(cfg, dtype)
        self.used = self.peak_used = 0
        self.storage = torch.empty(cfg.n_layers, 2, (capacity_tokens or 0) + 1, cfg.kv_heads, cfg.head_dim,
                                   dtype=dtype, device=device)
        self.ranges = SlotRanges(self.storage.shape[2])
        self.scratch = self.ranges.take(1)[0][0]
        self.tables: dict[int, tuple[list[tuple[int, int]], np.ndarray]] = {}   # id(slot table): its ranges, host copy

    def can_ever_fit(self, n: int) -> bool:
        return self.capacity is None or n <= self.capacity

    def can_reserve(self, n: int) -> bool:
        return self.capacity is None or self.used + n <= self.capacity

    def reserve(self, n: int) -> torch.Tensor | None:
        if not self.can_reserve(n):
            raise RuntimeError("KV pool over-committed: the scheduler must check can_reserve first")
        self.used += n
        self.peak_used = max(self.peak_used, self.used)
        if n == 0:
            return None
        pieces = self.ranges.take(n)
        if pieces is None:      # an unbounded pool doubles, or grows by n
            self.grow_to(self.storage.shape[2] + max(self.storage.shape[2], n))
            pieces = self.ranges.take(n)
        host = np.concatenate([np.arange(s, e) for s, e in pieces])
        table = torch.from_numpy(host.copy()).to(self.device)
        self.tables[id(table)] = pieces, host
        return table

    def grow_to(self, n: int) -> None:
        old = self.storage
        self.storage = old.new_empty(old.shape[0], 2, n, *old.shape[3:])
        self.storage[:, :, : old.shape[2]] = old
        self.ranges.grow(n)

    def host_slots(self, table: torch.Tensor) -> np.ndarray:
        return self.tables[id(table)][1] if id(table) in self.tables else table.cpu().numpy()

    def contiguous(self, table: torch.Tensor | None) -> bool:
        """Whether a slot table is one run of consecutive slots (read in place by a packed kernel)."""
        return table is not None and len(self.tables[id(table)][0]) == 1

    def release(self, n: int, table: torch.Tensor | None = None) -> None:
        self.used -= n
        assert self.used >= 0
        if table is not None:
            self.ranges.put(self.tables.pop(id(table))[0])
