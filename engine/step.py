"""One step's requests as numpy columns (`StepMeta`), and the runner seam: what a `Runner` gets and returns."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Protocol

import numpy as np
import torch

from engine.kv_cache import CODES as CACHE_CODES
from engine.models import ModelConfig
from engine.ragged import offsets
from engine.request import Phase, Request

Batch = list[tuple[Request, Phase]]
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
    cache: np.ndarray | None = None   # each member's cache mode (kv_cache.CODES); None: the engine's policy

    @classmethod
    def of(cls, batch: Batch, offsets_: np.ndarray, host_slots, shift: int = 0) -> StepMeta:
        """`host_slots(table)`: a slot table as a host array; `shift`: the model's prediction shift."""
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
        return cls(offsets_, *cols[:6], np.cumsum(slot_len) - slot_len, slot_len, slots, refresh,
                   np.where(refresh, 0, block_start - lead), n_q, offsets(n_q), lead, cache)

    def has(self, phase: Phase) -> np.ndarray:
        return self.phase == CODES[phase]


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
    model_config: ModelConfig     # mask id, vocabulary, layer/head sizes (KV bytes per token)
    dtype: torch.dtype            # of the KV cache
    device: torch.device

    def run(self, batch: Batch) -> StepStats: ...
