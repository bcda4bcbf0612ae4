"""The runner seam: what a step hands a `Runner` and gets back (docs/ENGINE.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.models import ModelConfig
from engine.request import Phase, Request

Batch = list[tuple[Request, Phase]]


@dataclass
class StepDecisions:
    """Flat over the batch: batch entry `row[i]` commits `tokens[i]` at canvas position `positions[i]`
    (confidence `confidence[i]`); entry j was charged `logits_rows[j]` logits rows."""

    row: torch.Tensor
    positions: torch.Tensor
    tokens: torch.Tensor
    confidence: torch.Tensor
    logits_rows: list[int]
    canvas_index: torch.Tensor | None = None   # positions in the engine's canvas pool, when known
    # one decision per candidate cell: only those where `taken` is True commit (None: all)
    taken: torch.Tensor | None = None


@dataclass
class StepStats:
    query_tokens: int
    logits_rows: int
    max_logits_rows: int
    refresh: int
    reuse: int
    decisions: StepDecisions | None = None
    graph: bool = False
    padded_requests: int | None = None      # these: the step trace's (engine.counters.StepRecord); None: the batch
    key_tokens: int = 0
    cache: dict[str, int] | None = None


class Runner(Protocol):
    model_config: ModelConfig     # mask id, vocabulary, layer/head sizes (KV bytes per token)
    dtype: torch.dtype            # of the KV cache
    device: torch.device

    def run(self, batch: Batch) -> StepStats: ...
