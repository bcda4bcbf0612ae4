"""The runner seam: what one engine step hands a model runner (`Batch`) and what it gets back
(`StepStats`, `StepDecisions`); any `Runner` can be injected (docs/ENGINE.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.models import ModelConfig
from engine.request import Phase, Request

Batch = list[tuple[Request, Phase]]


@dataclass
class StepDecisions:
    """Every request's decision, flat over the batch: request `row[i]` (its index in the batch)
    commits `tokens[i]` at canvas position `positions[i]`, proposed with `confidence[i]`.
    `logits_rows[j]` is what batch entry j was charged in logits rows."""

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
    # for the step trace (engine.counters.StepRecord); padded_requests None = the batch
    graph: bool = False
    padded_requests: int | None = None
    key_tokens: int = 0
    cache: dict[str, int] | None = None


class Runner(Protocol):
    model_config: ModelConfig     # mask id, vocabulary, layer/head sizes (KV bytes per token)
    dtype: torch.dtype            # of the KV cache
    device: torch.device

    def run(self, batch: Batch) -> StepStats: ...
