"""StepMeta: the scalars of every request in one step as numpy columns, read in one pass."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from engine.cache_mode import CODES as CACHE_CODES
from engine.request import Phase, Request

CODES = {Phase.REFRESH: 0, Phase.REFRESH_STORE: 1, Phase.REFRESH_SELECT: 2, Phase.REUSE: 3}
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class StepMeta:
    offset: np.ndarray        # canvas offset in the step's token tensor
    length: np.ndarray        # canvas length
    block_len: np.ndarray
    block_start: np.ndarray   # canvas position of the current block
    kv: np.ndarray            # KV slots reserved (kv_tokens)
    k: np.ndarray             # tokens this step commits (its transfer schedule at this step)
    phase: np.ndarray         # CODES
    slot_base: np.ndarray     # where each member's slot table starts in `slots`
    slot_len: np.ndarray
    slots: np.ndarray         # every member's slot table, concatenated
    refresh: np.ndarray       # bool: a Refresh* phase (the whole canvas is queried)
    q_start: np.ndarray       # canvas position of the first query: 0 (Refresh*), else block start - lead
    n_q: np.ndarray           # queries: the canvas (Refresh*) or lead + the block (Reuse)
    cu_q: np.ndarray          # [B + 1] packed query offsets
    lead: np.ndarray          # Reuse: query-only rows before the block (a shifted family's edge row), else 0
    # each member's cache mode (engine.cache_mode.CODES); None: all in the engine's policy
    cache: np.ndarray | None = None

    @classmethod
    def of(cls, batch: list[tuple[Request, Phase]], offsets: np.ndarray, host_slots, shift: int = 0) -> StepMeta:
        """`host_slots(table)`: a request's slot table as a host array (`KVPool.host_slots`);
        `shift`: the model's prediction shift (a Reuse step also queries that many rows before the block)."""
        cols = np.fromiter(chain.from_iterable(
            (r.length, r.block_length, r.prompt_len + r.block * r.block_length, r.kv_tokens,
             r.commit_count, CODES[p], CACHE_CODES.get(r.cache, 0)) for r, p in batch), dtype=np.int64,
            count=7 * len(batch)).reshape(-1, 7).T
        tables = [_EMPTY if r.slots is None else host_slots(r.slots) for r, _ in batch]
        slot_len = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
        slots = np.concatenate(tables) if tables else _EMPTY
        length, block_len, block_start, _, _, phase, cache = cols
        refresh = phase != CODES[Phase.REUSE]
        lead = np.where(refresh, 0, np.minimum(block_start, shift))
        n_q = np.where(refresh, length, block_len + lead)
        cu_q = np.zeros(len(batch) + 1, dtype=np.int64)
        np.cumsum(n_q, out=cu_q[1:])
        return cls(offsets, *cols[:6], np.cumsum(slot_len) - slot_len, slot_len, slots, refresh,
                   np.where(refresh, 0, block_start - lead), n_q, cu_q, lead, cache)

    def has(self, phase: Phase) -> np.ndarray:
        return self.phase == CODES[phase]
