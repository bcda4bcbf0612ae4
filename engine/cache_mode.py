"""`cache=auto`: each request's cache mode, chosen at admission on the device's roofline (docs/SERVE.md)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

AUTO = "auto"
CODES = {"none": 0, "dual": 1, "sparse": 2}
SPARSE_MARGIN = 0.05


def refreshes(mode: str, steps_per_block: int, delay_step: int) -> int:
    """Full-canvas Refreshes per block: dual 1, sparse delay_step + 1 (none: every step)."""
    s = steps_per_block
    return 1 if mode == "dual" else min(s, delay_step + 1) if mode == "sparse" else s


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


def step_time(n_dual, n_sparse, s: Shape):
    """Roofline time in query rows of a step of `n_dual` + `n_sparse` requests of shape `s`; its tokens."""
    S = s.steps
    k_d, k_s = refreshes("dual", S, s.delay_step), refreshes("sparse", S, s.delay_step)
    reuse = (n_dual * (S - k_d) + n_sparse * (S - k_s)) * s.block / S
    keys = (n_dual * (S - k_d) * s.dual_need + n_sparse * (S - k_s) * s.sparse_need) / S
    base = np.maximum(s.ridge * (1 + keys * s.kv_per_weight), reuse)
    extra = (n_dual * k_d + n_sparse * k_s) / S * np.maximum(0.0, reuse + s.length * (1 + s.length * s.pair_per_row) - base)
    return s.overhead + base + extra, (n_dual + n_sparse) * s.block / S


@lru_cache(maxsize=1024)
def preferred_mode(capacity: int, max_seqs: int, s: Shape) -> str:
    """dual or sparse: which commits more tokens per step time filling `capacity` (sparse: by a margin)."""
    n_dual, n_sparse = min(max_seqs, capacity // s.dual_need), min(max_seqs, capacity // s.sparse_need)
    if s.sparse_need >= s.dual_need or n_sparse == 0:
        return "dual"
    if n_dual == 0:
        return "sparse"
    t_dual, tok_dual = step_time(n_dual, 0, s)
    t_sparse, tok_sparse = step_time(0, n_sparse, s)
    return "sparse" if tok_sparse / t_sparse > (1 + SPARSE_MARGIN) * tok_dual / t_dual else "dual"


def never_cached(capacity: int | None, sparse_need: int) -> bool:
    """No mode can ever hold a request whose sparse need exceeds the pool: it runs `none`."""
    return capacity is not None and sparse_need > capacity


SERVED = {"none": ("none",), "dual": ("dual",), "sparse": ("sparse",), AUTO: ("dual", "sparse", "none")}


def admission_mode(free: int | None, dual_need: int, sparse_need: int, preferred: str,
                   capacity: int | None = None) -> str | None:
    """The mode the head of the queue is admitted in, or None: it waits (`none` if never cached)."""
    if free is None:
        return "dual"
    if never_cached(capacity, sparse_need):
        return "none"
    return preferred if (dual_need if preferred == "dual" else sparse_need) <= free else None
