"""`cache=auto`: each request's cache mode, chosen once at its admission.

Per block a dual request (Fast-dLLM's cache: one Refresh per block) computes L + (S-1)·B query
rows, a sparse one (head-centric sparse KV: a Refresh, then a Refresh-select at `delay_step`)
2L + (S-2)·B: sparse holds about twice the requests in a KV pool at the price of a second
full-canvas Refresh per block. Twice the requests pay only while a step is bound by reading the
weights (and cached keys), i.e. while its query rows are below the device's ridge
(`EngineConfig.ridge_rows`: peak FLOP/s / bandwidth x bytes per weight / 2); past it a step's
time grows with its rows; every step also pays a fixed cost (`EngineConfig.overhead_rows`) that
fuller batches amortise. `preferred_mode` weighs both on a roofline (`step_time`): which mode,
with the pool full of requests of the head's shape (up to `max_num_seqs`, however few wait now),
commits more tokens per unit of step time; `admission_mode` admits the head in it once it fits.
A request no cache mode can ever hold (`never_cached`) is admitted `none`. A request keeps its
mode for its life.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

AUTO = "auto"
# Per-member codes of a step's `StepMeta.cache` column (a mixed step holds several modes).
CODES = {"none": 0, "dual": 1, "sparse": 2}
SPARSE_MARGIN = 0.05


def refreshes(mode: str, steps_per_block: int, delay_step: int) -> int:
    """Full-canvas Refreshes per block: dual 1, sparse delay_step + 1 (none: every step)."""
    s = steps_per_block
    return 1 if mode == "dual" else min(s, delay_step + 1) if mode == "sparse" else s


@dataclass(frozen=True)
class Shape:
    """A request as the mix sees it: canvas L, block B, steps per block S, its KV need in each
    mode (dual: L; sparse: retained + B), and the model on the device: `ridge` rows,
    `kv_per_weight` and `pair_per_row` (`LLaDAConfig`'s: a cached key's bytes per weight byte, an
    attention pair's FLOPs per query row's), and a step's fixed `overhead` in rows."""

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
    """Roofline time of a step in query rows, and the tokens it commits, for `n_dual` +
    `n_sparse` requests of shape `s` (numpy-broadcast). Their Reuse steps share one read of the
    weights and of their cached keys: the ridge x (1 + keys x kv_per_weight) rows, or their rows
    when more; each Refresh of a canvas adds what its rows (and its L x L attention) take past
    that (Refreshes of different requests in different steps); the step's fixed overhead adds."""
    S = s.steps
    k_d, k_s = refreshes("dual", S, s.delay_step), refreshes("sparse", S, s.delay_step)
    reuse = (n_dual * (S - k_d) + n_sparse * (S - k_s)) * s.block / S
    keys = (n_dual * (S - k_d) * s.dual_need + n_sparse * (S - k_s) * s.sparse_need) / S
    base = np.maximum(s.ridge * (1 + keys * s.kv_per_weight), reuse)
    extra = (n_dual * k_d + n_sparse * k_s) / S * np.maximum(0.0, reuse + s.length * (1 + s.length * s.pair_per_row) - base)
    return s.overhead + base + extra, (n_dual + n_sparse) * s.block / S


@lru_cache(maxsize=1024)
def preferred_mode(capacity: int, max_seqs: int, s: Shape) -> str:
    """dual or sparse: which fills `capacity` KV slots with requests of shape `s` (at most
    `max_seqs` of them) committing more tokens per unit of step time (`step_time`). Sparse must win
    by SPARSE_MARGIN: the roofline leaves out work only sparse does (scoring, top-k, packing the
    retained keys) and a sparse request holds its slots through twice the Refreshes."""
    n_dual, n_sparse = min(max_seqs, capacity // s.dual_need), min(max_seqs, capacity // s.sparse_need)
    if s.sparse_need >= s.dual_need or n_sparse == 0:
        return "dual"
    if n_dual == 0:
        return "sparse"
    t_dual, tok_dual = step_time(n_dual, 0, s)
    t_sparse, tok_sparse = step_time(0, n_sparse, s)
    return "sparse" if tok_sparse / t_sparse > (1 + SPARSE_MARGIN) * tok_dual / t_dual else "dual"


def never_cached(capacity: int | None, sparse_need: int) -> bool:
    """No cache mode can ever hold a request whose sparse need (its least) exceeds the whole
    pool. It runs without one (`none`: every step a full Refresh, chunked beyond the token
    budget) rather than being refused: a long canvas's own KV, not the step, is what binds."""
    return capacity is not None and sparse_need > capacity


# The modes an engine's requests may run in (the profiler reserves for each).
SERVED = {"none": ("none",), "dual": ("dual",), "sparse": ("sparse",), AUTO: ("dual", "sparse", "none")}


def admission_mode(free: int | None, dual_need: int, sparse_need: int, preferred: str,
                   capacity: int | None = None) -> str | None:
    """The mode the head of the queue is admitted in, or None (it waits): `none` if the pool of
    `capacity` slots can never hold it (`never_cached`), else its `preferred_mode` once that need
    fits `free` KV slots (None: an unbounded pool, where dual always fits)."""
    if free is None:
        return "dual"
    if never_cached(capacity, sparse_need):
        return "none"
    return preferred if (dual_need if preferred == "dual" else sparse_need) <= free else None
