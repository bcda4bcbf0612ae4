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

import numpy as np
import torch

from engine.cache_policy import POLICIES
from engine.config import EngineConfig
from engine.kv_cache import KVPool
from engine.logits import RowSegment, decode_rows
from engine.models.llada import LLaDAModelLM
from engine.ragged import padded, ragged, to_device
from engine.request import Phase, Request
from engine.step import StepDecisions, StepStats
from engine.step_context import StepContext
from engine.step_meta import StepMeta
from engine.unmask import random_confidence


class ModelRunner:
    def __init__(self, model: LLaDAModelLM, config: EngineConfig, backend: str, pool: KVPool | None = None,
                 max_model_len: int | None = None):
        self.model, self.config, self.backend, self.pool = model, config, backend, pool
        self.model_config, self.dtype, self.device = model.config, model.dtype, model.device
        self.policy = POLICIES[config.cache](config)
        # Padded key rows of one attention call: a full canvas, or the token budget's worth when
        # that is more (a full Refresh step already gathers that many fresh keys). The profiler
        # measures chunks of exactly this bound, so a step never gathers more than it measured.
        self.key_budget = max(max_model_len or model.config.max_sequence_length, config.max_num_batched_tokens)

    def prepare(self, batch: list[tuple[Request, Phase]]) -> PackedStep:
        """The step's packed inputs and its attention context (everything before the forward)."""
        dev = self.device
        tokens, offsets = _canvases([r for r, _ in batch], dev)
        host_slots = self.pool.host_slots if self.pool is not None else _host_slots
        m = StepMeta.of(batch, offsets, host_slots)
        pos = ragged(m.q_start, m.n_q)
        positions = to_device(pos, dev)
        ids = tokens[to_device(np.repeat(m.offset, m.n_q) + pos, dev)]
        rotation = self.model.rope.at(positions, self.model.dtype, top=int(m.length.max()) - 1)
        ctx = StepContext(m, self.policy, self.pool, rotation, self.backend, self.key_budget, dev, self.dtype)
        return PackedStep(tokens, m, m.cu_q, ids, positions, ctx)

    @torch.no_grad()
    def run(self, batch: list[tuple[Request, Phase]]) -> StepStats:
        dev = self.device
        reqs = [r for r, _ in batch]
        p = self.prepare(batch)
        m, tokens = p.meta, p.tokens
        hidden = self.model.hidden_states(p.ids, p.positions, p.ctx, rope=p.ctx.rotation)

        # Candidates: still-masked positions of each request's current block, [B, max block].
        idx, valid = padded(m.offset + m.block_start, m.block_len, int(m.block_len.max()))
        cand = (tokens[to_device(idx, dev)] == self.model_config.mask_token_id).cpu().numpy() & valid
        rel = idx - m.offset[:, None]                                             # canvas positions
        rows = (rel - m.q_start[:, None] + m.cu_q[:-1, None])[cand]              # hidden rows, request order
        counts = cand.sum(1)
        seg_start = np.cumsum(counts) - counts
        segments = [RowSegment(int(seg_start[i]), int(counts[i]), r.params.temperature, r.gens.gumbel)
                    for i, r in enumerate(reqs) if r.params.temperature > 0]
        res = decode_rows(self.model.lm_head, hidden, to_device(rows, dev), segments, self.config.max_num_logits,
                          self.model_config.mask_token_id)
        conf = res.conf
        for i, r in enumerate(reqs):
            if r.params.remasking == "random":
                conf = conf.clone() if conf is res.conf else conf
                a = int(seg_start[i])
                conf[a : a + int(counts[i])] = random_confidence(int(counts[i]), r.gens.remask).to(conf)
        monolithic = self.config.max_num_logits is None
        decisions = _choose(conf, res.x0, cand, counts, rel, m.k, dev, (m.n_q if monolithic else counts).tolist())
        n_ref = int(m.refresh.sum())
        return StepStats(int(m.cu_q[-1]), res.rows_materialized, res.max_rows_at_once, n_ref, len(batch) - n_ref,
                         decisions)


def _choose(conf: torch.Tensor, x0: torch.Tensor, cand: np.ndarray, counts: np.ndarray, rel: np.ndarray,
            k: np.ndarray, dev, logits_rows: list[int]) -> StepDecisions:
    """Each request commits its k most confident candidates (k from its linear schedule); ties
    go to the lower position. `conf`/`x0` [R]: the candidates in request order, then position
    order; cand [B, W] host mask of them, counts [B] its row sums; rel [B, W] their canvas positions. One sort on the
    device; which ranks are taken, and which candidate each (row, rank) is, are host arrays."""
    B, W = cand.shape
    score = torch.full((B, W), -torch.inf, dtype=conf.dtype, device=dev)
    score[to_device(cand, dev)] = conf
    order = torch.sort(score, dim=1, descending=True, stable=True).indices    # candidates first in each row
    row, rank = np.nonzero(np.arange(W) < np.minimum(k, counts)[:, None])
    cid = np.zeros((B, W), dtype=np.int64)
    cid[cand] = np.arange(conf.numel())                                   # [B, W] -> candidate index
    row_t = to_device(row, dev)
    col = order[row_t, to_device(rank, dev)]
    pick = to_device(cid, dev)[row_t, col]
    return StepDecisions(row_t, to_device(rel, dev)[row_t, col], x0[pick], conf[pick], logits_rows)


@dataclass
class PackedStep:
    tokens: torch.Tensor          # the token tensor holding every canvas
    meta: StepMeta                # every member's scalars (offsets, phases, query ranges, slots)
    cu_q: np.ndarray              # packed query offsets
    ids: torch.Tensor             # [N] packed input ids
    positions: torch.Tensor       # [N] their canvas positions
    ctx: StepContext


def _host_slots(table: torch.Tensor) -> np.ndarray:
    return table.cpu().numpy()


def _canvases(reqs: list[Request], device) -> tuple[torch.Tensor, np.ndarray]:
    """The token tensor holding every canvas, and each canvas's offset in it: the engine's
    canvas pool when all are placed there, else (profiling, direct calls) a concatenation."""
    pool = getattr(reqs[0], "canvas_pool", None)
    if pool is not None and all(getattr(r, "canvas_pool", None) is pool for r in reqs):
        return pool.tokens, np.fromiter((r.canvas_offset for r in reqs), dtype=np.int64, count=len(reqs))
    lens = np.fromiter((r.length for r in reqs), dtype=np.int64, count=len(reqs))
    return torch.cat([r.canvas for r in reqs]), np.cumsum(lens) - lens
