"""`cache=auto`: each request's cache mode, chosen once at its admission.

The dual cache (Fast-dLLM's: one Refresh per block, every canvas token cached) does the least
work per generated token; head-centric sparse KV (retained tokens + one block of slots, a
Refresh then a Refresh-select at `delay_step`) holds the most requests in a KV pool. So an auto
engine serves a request dual while the pool can afford it and sparse when memory binds: the
head of the queue goes dual when, after its dual reservation, the pool could still reserve the
sparse needs of the requests queued behind it that `max_num_seqs` would let in with it; else
sparse if its sparse need fits now; else it waits (FCFS, as every admission). A request keeps
its mode for its life (its slot table and phases follow from it).
"""
from __future__ import annotations

from collections.abc import Iterable

AUTO = "auto"
# Per-member codes of a step's `StepMeta.cache` column (a mixed step holds several modes).
CODES = {"none": 0, "dual": 1, "sparse": 2}


def admission_mode(free: int | None, dual_need: int, sparse_need: int, behind: Iterable[int]) -> str | None:
    """The mode the head of the queue is admitted in, or None (it waits).

    `free`: KV slots free now (None: an unbounded pool); `dual_need` / `sparse_need`: the
    head's whole-life reservation in each mode; `behind`: the sparse needs of the requests
    queued behind it that could be admitted with it (at most `max_num_seqs` running). Sparse
    is chosen only where it reserves less than dual (at retention 1 it does not)."""
    if free is None or sparse_need >= dual_need and dual_need <= free:
        return "dual"
    if dual_need <= free and dual_need + sum(behind) <= free:
        return "dual"
    return "sparse" if sparse_need <= free else None
