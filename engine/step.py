"""The runner seam: what one engine step hands a model runner and what it gets back.

`LLMEngine.step` asks the `Scheduler` for a batch — a list of `(Request, Phase)` — and calls
`Runner.run(batch)`. The runner reads each request's canvas, block cursor and cache slots, runs
the forward and returns `StepStats`: the step's counters and the tokens each request decided
(`StepDecisions`). The engine commits those and each request advances its own cursor
(`Request.advance`); the runner never mutates a request's canvas or counters.

Any object with `model_config`, `dtype`, `device` and `run` can be injected
(`LLMEngine(config, runner=...)`), e.g. a simulator that charges a cost model instead of running
a forward. A runner that returns `decisions=None` has committed nothing: requests still advance
(they finish after `steps` steps whatever their tokens are), and their `nfe`/`logits_rows` are
the runner's business.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.models.llada import LLaDAConfig
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
    # Fixed-size decisions (one per candidate cell): only the entries where `taken` is True
    # commit; None = every entry commits.
    taken: torch.Tensor | None = None


@dataclass
class StepStats:
    query_tokens: int
    logits_rows: int
    max_logits_rows: int
    refresh: int
    reuse: int
    decisions: StepDecisions | None = None
    # What a step trace reports (engine.counters.TRACE_FIELDS): whether the forward was a
    # CUDA-graph replay, the members it ran (dummies of a padded step included; None = the
    # batch), keys attended summed over the members, members per KV cache mode (None = not told).
    graph: bool = False
    padded_requests: int | None = None
    key_tokens: int = 0
    cache: dict[str, int] | None = None


class Runner(Protocol):
    model_config: LLaDAConfig     # mask id, vocabulary, layer/head sizes (KV bytes per token)
    dtype: torch.dtype            # of the KV cache
    device: torch.device

    def run(self, batch: Batch) -> StepStats: ...
