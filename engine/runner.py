"""ModelRunner: packs the scheduled requests into one batch, runs the model with a
`StepContext` as its attention, decodes the committable rows under the logit budget and
returns what every request decided (`engine.step.StepDecisions`); it mutates no request.

Per request and phase, the query set is the whole canvas (Refresh*) or the current block
(Reuse). Packing, candidate finding and the choice of tokens to commit are batched tensor
ops over the whole step; only per-request random streams (Gumbel noise at T > 0, random
remasking) are drawn request by request, as the randomness contract requires.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.cache_policy import POLICIES
from engine.config import EngineConfig
from engine.kv_cache import KVPool
from engine.logits import RowSegment, decode_rows
from engine.models.llada import LLaDAModelLM
from engine.ragged import padded, ragged
from engine.request import Phase, Request
from engine.step import StepDecisions, StepStats
from engine.step_context import StepContext
from engine.unmask import random_confidence


class ModelRunner:
    def __init__(self, model: LLaDAModelLM, config: EngineConfig, backend: str, pool: KVPool | None = None,
                 max_model_len: int | None = None):
        self.model, self.config, self.backend, self.pool = model, config, backend, pool
        self.model_config, self.dtype, self.device = model.config, model.dtype, model.device
        self.policy = POLICIES[config.cache](config)
        # Padded key rows of one attention call: one canvas at most, the bound the profiler's
        # largest single Reuse measures.
        self.key_budget = max_model_len or model.config.max_sequence_length

    def prepare(self, batch: list[tuple[Request, Phase]]) -> PackedStep:
        """The step's packed inputs and its attention context (everything before the forward)."""
        dev = self.device
        tokens, offsets = _canvases([r for r, _ in batch], dev)
        q_start = [0 if p.is_refresh else r.block_range[0] for r, p in batch]
        n_q = [r.length if p.is_refresh else r.params.block_length for r, p in batch]
        cu_q = [0]
        for n in n_q:
            cu_q.append(cu_q[-1] + n)
        positions = ragged(q_start, n_q, dev)
        ids = tokens[ragged([o + s for o, s in zip(offsets, q_start)], n_q, dev)]
        rotation = self.model.rope.at(positions, self.model.dtype)
        ctx = StepContext(batch, cu_q, self.policy, self.pool, rotation, self.backend, self.key_budget, dev, self.dtype)
        return PackedStep(tokens, offsets, q_start, n_q, cu_q, ids, positions, ctx)

    @torch.no_grad()
    def run(self, batch: list[tuple[Request, Phase]]) -> StepStats:
        dev = self.device
        reqs = [r for r, _ in batch]
        p = self.prepare(batch)
        tokens, offsets, q_start, n_q, cu_q = p.tokens, p.offsets, p.q_start, p.n_q, p.cu_q
        hidden = self.model.hidden_states(p.ids, p.positions, p.ctx, rope=p.ctx.rotation)

        # Candidates: still-masked positions of each request's current block, [B, max block].
        bl = [r.params.block_length for r in reqs]
        starts = [r.block_range[0] for r in reqs]
        idx, valid = padded([o + s for o, s in zip(offsets, starts)], bl, max(bl), dev)
        cand = valid & (tokens[idx] == self.model_config.mask_token_id)
        rel = idx - _col(offsets, dev)                                            # canvas positions
        rows = (rel - _col(q_start, dev) + _col(cu_q[:-1], dev))[cand]           # hidden rows, request order
        counts = cand.sum(1).tolist()
        seg_start = [0]
        for n in counts:
            seg_start.append(seg_start[-1] + n)
        segments = [RowSegment(seg_start[i], counts[i], r.params.temperature, r.gens.gumbel)
                    for i, r in enumerate(reqs) if r.params.temperature > 0]
        res = decode_rows(self.model.lm_head, hidden, rows, segments, self.config.max_num_logits,
                          self.model_config.mask_token_id)
        conf = res.conf
        for i, r in enumerate(reqs):
            if r.params.remasking == "random":
                conf = conf.clone() if conf is res.conf else conf
                conf[seg_start[i] : seg_start[i + 1]] = random_confidence(counts[i], r.gens.remask).to(conf)

        # Each request commits its k most confident candidates (k from its linear schedule);
        # ties go to the lower position.
        B, W = cand.shape
        score = torch.full((B, W), -torch.inf, dtype=conf.dtype, device=dev)
        score[cand] = conf
        order = torch.sort(score, dim=1, descending=True, stable=True).indices
        k = _col([r.schedule[r.step_in_block] for r in reqs], dev)
        chosen = torch.zeros_like(cand).scatter_(1, order, torch.arange(W, device=dev)[None] < k) & cand
        x0 = torch.zeros((B, W), dtype=torch.long, device=dev)
        x0[cand] = res.x0
        row, col = chosen.nonzero(as_tuple=True)
        monolithic = self.config.max_num_logits is None
        decisions = StepDecisions(row, rel[row, col], x0[row, col], score[row, col],
                                  n_q if monolithic else counts)
        n_ref = sum(1 for _, p in batch if p.is_refresh)
        return StepStats(cu_q[-1], res.rows_materialized, res.max_rows_at_once, n_ref, len(batch) - n_ref, decisions)


@dataclass
class PackedStep:
    tokens: torch.Tensor          # the token tensor holding every canvas
    offsets: list[int]            # each request's canvas offset in it
    q_start: list[int]            # canvas position of each request's first query
    n_q: list[int]                # queries per request
    cu_q: list[int]               # packed query offsets
    ids: torch.Tensor             # [N] packed input ids
    positions: torch.Tensor       # [N] their canvas positions
    ctx: StepContext


def _col(xs: list[int], device) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long, device=device)[:, None]


def _canvases(reqs: list[Request], device) -> tuple[torch.Tensor, list[int]]:
    """The token tensor holding every canvas, and each canvas's offset in it: the engine's
    canvas pool when all are placed there, else (profiling, direct calls) a concatenation."""
    pool = getattr(reqs[0], "canvas_pool", None)
    if pool is not None and all(getattr(r, "canvas_pool", None) is pool for r in reqs):
        return pool.tokens, [r.canvas_offset for r in reqs]
    offs, acc = [], 0
    for r in reqs:
        offs.append(acc)
        acc += r.length
    return torch.cat([r.canvas for r in reqs]), offs
