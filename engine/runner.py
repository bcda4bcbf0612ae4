"""ModelRunner: the scheduled requests in one packed forward, decoded under the logit budget."""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from engine import chunking, graphs
from engine.attention import PACKED, PackedKernel
from engine.config import EngineConfig
from engine.decoding import commit_mask, policy_columns
from engine.graphs import PadSpec, StepGraphs, pad_meta
from engine.kv_cache import KVPool
from engine.logits import DecodeResult, RowSegment, decode_rows
from engine.models import DenseLM, ModelConfig
from engine.regions import DECODE, in_region
from engine.request import Phase, Request
from engine.scheduler import serves_long
from engine.step import Staging, StepDecisions, StepMeta, StepStats, offsets, padded, ragged
from engine.step_context import CachePolicy, StepContext
from engine.unmask import rescored


class ModelRunner:
    def __init__(self, model: DenseLM, config: EngineConfig, backend: str, pool: KVPool | None = None,
                 max_model_len: int | None = None, refresh_chunk: int | None = None):
        self.model, self.config, self.backend, self.pool = model, config, backend, pool
        self.model_config, self.dtype, self.device = model.config, model.dtype, model.device
        self.decode_rows = getattr(model, "decode_rows", decode_rows)
        self.policy = CachePolicy(config, getattr(model, "head_mean", None))
        self.max_model_len = max_model_len or model.config.max_sequence_length
        self.key_budget = max(self.max_model_len, config.max_num_batched_tokens)
        self.key_chunk = config.max_num_batched_tokens
        self.kernel = PackedKernel(backend) if backend in PACKED else None
        self.in_place_keys = True       # the profiler turns it off (gathered keys: the larger peak)
        self.staging, self.long_staging = Staging(self.device), Staging(self.device)
        # a Refresh over the token budget runs in chunks: profiled, else half the token budget
        self.refresh_chunk = refresh_chunk or config.refresh_chunk_tokens or max(1, config.max_num_batched_tokens // 2)
        self.long_possible = serves_long(config)
        self.graphs = StepGraphs(self) if graphs.enabled(config, self.device) and pool is not None else None

    def prepare(self, batch: list[tuple[Request, Phase]], pad: PadSpec | None = None,
                fwd_staging: Staging | None = None) -> PackedStep:
        """The step's inputs, attention and commit plan, staged (`pad`: dummies; `fwd_staging`: a graph's)."""
        main = self.staging.begin()
        fwd = main if fwd_staging is None else fwd_staging.begin()
        real, plan, tokens = self._plan(batch, main)
        p = self.packed(real, real if pad is None else pad_meta(real, pad), fwd, None if pad is None else pad.keys,
                        tokens=tokens)
        p.plan = plan
        fwd.flush()
        if fwd is not main:
            main.flush()
        return p

    def _plan(self, batch: list[tuple[Request, Phase]], staging: Staging) -> tuple[StepMeta, CommitPlan, np.ndarray]:
        """The step's columns, commit plan and host tokens (the canvas pool's when it holds every canvas)."""
        reqs = [r for r, _ in batch]
        pool = getattr(reqs[0], "canvas_pool", None)
        in_pool = pool is not None and all(getattr(r, "canvas_pool", None) is pool for r in reqs)
        if in_pool:
            tokens, starts = pool.host, np.fromiter((r.canvas_offset for r in reqs), dtype=np.int64, count=len(reqs))
        else:
            tokens = np.concatenate([r.host_canvas for r in reqs])
            starts = offsets(np.fromiter((r.length for r in reqs), dtype=np.int64, count=len(reqs)))[:-1]
        m = StepMeta.of(batch, starts, self.pool.host_slots, self.model_config.shift)
        return m, _plan_commit(m, reqs, tokens, self.model_config, staging, in_pool), tokens

    def packed(self, real: StepMeta, m: StepMeta, fwd: Staging, static_keys: int | None = None, *,
               tokens: np.ndarray | None = None, ids: np.ndarray | None = None) -> PackedStep:
        """`m`'s forward inputs and attention staged in `fwd` (`real`: `m` without dummies; ids read from `tokens`)."""
        pos = ragged(m.q_start, m.n_q)
        ids = ids if tokens is None else tokens[np.minimum(np.repeat(m.offset, m.n_q) + pos, len(tokens) - 1)]
        return PackedStep(real, m, fwd.put(ids), fwd.put(pos), int(m.length.max()) - 1,
                          StepContext(m, self.policy, self.pool, self.backend, self.key_budget, fwd, self.dtype,
                                      static_keys, self.kernel, self.in_place_keys, self.key_chunk))

    def forward(self, p: PackedStep) -> torch.Tensor:
        """The forward of a prepared step (what CUDA graphs capture)."""
        p.ctx.finalize()
        rotation = self.model.rope.at(p.positions, self.dtype, top=p.top)
        return self.model.hidden_states(p.ids, p.positions, p.ctx, rope=rotation)

    @torch.no_grad()
    def run(self, batch: list[tuple[Request, Phase]]) -> StepStats:
        reqs, budget = [r for r, _ in batch], self.config.max_num_batched_tokens
        long = [i for i, (r, p) in enumerate(batch) if p is not Phase.REUSE and r.length > budget]
        if self.long_possible and long:
            m, c, res, queries, keys = self._run_long(batch, long)
            n_ref, n_padded, graph = sum(p is not Phase.REUSE for _, p in batch), len(batch), False
        else:
            step = self.graphs.run(batch) if self.graphs is not None and self.graphs.takes(batch) else None
            if step is not None:
                p, hidden, graph = step
            else:
                p, graph = self.prepare(batch), False
                hidden = self.forward(p)
            m, c = p.meta, p.plan
            res = self._decode(reqs, hidden, c)
            queries, n_ref, n_padded = int(m.cu_q[-1]), int(m.refresh.sum()), len(p.padded_meta.n_q)
            keys = self._keys(m)
        conf = res.conf
        for i, r in enumerate(reqs):
            a, n = int(c.seg_start[i]), int(c.counts[i])
            ranked = rescored(conf, a, n, r.params, r.commit_count, r.gens)
            if ranked is not None:
                conf = conf.clone() if conf is res.conf else conf
                conf[a : a + n] = ranked
        monolithic = self.config.max_num_logits is None
        decisions = _choose(conf, res.x0, res.entropy, c, (m.n_q if monolithic else c.counts).tolist())
        return StepStats(queries, res.rows_materialized, res.max_rows_at_once, n_ref, len(batch) - n_ref,
                         decisions, key_tokens=keys, padded_requests=n_padded, graph=graph,
                         cache=dict(Counter(r.cache or self.config.cache for r in reqs)))

    def _keys(self, m: StepMeta) -> int:
        cached, fresh, _ = self.policy.spec(m)
        return int(cached.sum() + fresh.sum())

    def _decode(self, reqs: list[Request], hidden: torch.Tensor, c: CommitPlan, rows: torch.Tensor | None = None):
        """The candidates' proposals under the logit budget (`rows`: their hidden rows)."""
        return self.decode_rows(self.model.lm_head, hidden, c.rows if rows is None else rows, row_segments(reqs, c),
                                self.config.max_num_logits, self.model_config.mask_token_id, entropy=c.entropy)

    def _run_long(self, batch: list[tuple[Request, Phase]], long: list[int]) -> tuple:
        """The `long` members' Refresh chunked and decoded, then the others packed."""
        m, c, _ = self._plan([(r, Phase.REUSE if i in long else p) for i, (r, p) in enumerate(batch)],
                             self.long_staging.begin())
        self.long_staging.flush()
        parts, decodes = {}, []            # member -> (its decode, first row, rows)
        for i in long:
            r, p = batch[i]
            a, n = int(c.seg_start[i]), int(c.counts[i])
            one = dataclasses.replace(c, seg_start=np.zeros(1, dtype=np.int64), counts=c.counts[i : i + 1])
            hidden = chunking.refresh_rows(self.model, r, p, self.pool.storage, self.config, self.refresh_chunk,
                                           self.backend)
            decodes.append(self._decode([r], hidden, one, c.rows[a : a + n] - int(m.cu_q[i])))
            parts[i] = (decodes[-1], 0, n)
            del hidden
        short = [i for i in range(len(batch)) if i not in parts]
        queries = keys = sum(batch[i][0].length for i in long)
        if short:
            ps = self.prepare([batch[i] for i in short])
            decodes.append(self._decode([batch[i][0] for i in short], self.forward(ps),
                                        dataclasses.replace(ps.plan, entropy=c.entropy)))
            queries += int(ps.meta.cu_q[-1])
            keys += self._keys(ps.meta)
            parts.update((i, (decodes[-1], int(ps.plan.seg_start[j]), int(ps.plan.counts[j])))
                         for j, i in enumerate(short))

        def cat(field: str) -> torch.Tensor | None:
            if getattr(decodes[0], field) is None:
                return None
            return torch.cat([getattr(d, field)[a : a + n] for d, a, n in (parts[i] for i in range(len(batch)))])

        joined = DecodeResult(cat("x0"), cat("conf"), sum(d.rows_materialized for d in decodes),
                              max(d.max_rows_at_once for d in decodes), cat("entropy"))
        return m, c, joined, queries, keys


@dataclass
class CommitPlan:
    """The candidates (each block's masked positions p, read at hidden row p - shift), cells of a [B, W] table."""
    rows: torch.Tensor            # [R] each candidate's hidden row, request then position order
    counts: np.ndarray            # [B] candidates per request
    seg_start: np.ndarray         # [B] each request's first candidate in `rows`
    flat: torch.Tensor            # [R] each candidate's cell of the [B, W] table
    rel: torch.Tensor             # [B, W] table cell -> canvas position
    counts_t: torch.Tensor
    k: torch.Tensor               # [B] the fixed schedule's count this step
    kinds: torch.Tensor | None    # [B] decoding policy codes (engine.decoding); None: all `fixed`
    values: torch.Tensor | None   # [B] their values, float64 bits
    entropy: bool                 # a request decodes by entropy: the decode computes it
    row: torch.Tensor             # [B*W] the request of each table cell
    canvas_start: torch.Tensor | None  # [B] where each canvas starts in the canvas pool's tokens


def _plan_commit(m: StepMeta, reqs: list[Request], host_tokens: np.ndarray, cfg: ModelConfig, staging: Staging,
                 in_pool: bool) -> CommitPlan:
    W, s = int(m.block_len.max()), cfg.shift
    idx, valid = padded(m.offset + m.block_start, m.block_len, W)
    cand = (host_tokens[idx] == cfg.mask_token_id) & valid
    for i, r in enumerate(reqs):
        moves = r.moves()                     # `origin`: only this step's movers are candidates
        if moves is not None:
            cand[i, np.flatnonzero(cand[i])[~moves]] = False
    policies = [r.decoding for r in reqs]
    rel = idx - m.offset[:, None]
    hid = np.where(rel >= s, rel - s, rel)        # the hidden predicting position p: p - shift (row 0: its own)
    rows = (hid - m.q_start[:, None] + m.cu_q[:-1, None])[cand]
    counts = cand.sum(1)
    fixed = all(p.fixed for p in policies)
    kinds, values = (None, None) if fixed else map(staging.put, policy_columns(policies))
    return CommitPlan(staging.put(rows), counts, np.cumsum(counts) - counts, staging.put(np.flatnonzero(cand)),
                      staging.put(rel), staging.put(counts), staging.put(m.k), kinds, values,
                      any(p.kind == "entropy" for p in policies), staging.put(np.repeat(np.arange(len(reqs)), W)),
                      staging.put(m.offset) if in_pool else None)


def row_segments(reqs: list[Request], c: CommitPlan) -> list[RowSegment]:
    """The candidate rows of each request that samples (T > 0) or decodes by Dream's rule."""
    return [RowSegment(int(c.seg_start[i]), int(c.counts[i]), r.params.temperature, r.gens.gumbel,
                       r.params if r.params.dream_rule else None)
            for i, r in enumerate(reqs) if r.params.temperature > 0 or r.params.dream_rule]


@in_region(DECODE)
def _choose(conf: torch.Tensor, x0: torch.Tensor, entropy: torch.Tensor | None, c: CommitPlan,
            logits_rows: list[int]) -> StepDecisions:
    """Each request's candidates by confidence (ties: lower position first), its policy's prefix taken."""
    B, W = c.rel.shape

    def table(v: torch.Tensor, fill) -> torch.Tensor:
        t = torch.full((B * W,), fill, dtype=v.dtype, device=v.device)
        t[c.flat] = v
        return t.view(B, W)

    score = table(conf, -torch.inf)
    order = torch.sort(score, dim=1, descending=True, stable=True).indices
    s_conf = score.gather(1, order)
    s_ent = None if entropy is None else table(entropy, 0).gather(1, order)
    take = commit_mask(s_conf, s_ent, c.counts_t, c.k, c.kinds, c.values)
    positions = c.rel.gather(1, order)
    tokens = table(x0, 0).gather(1, order)
    pool_index = None if c.canvas_start is None else (c.canvas_start[:, None] + positions).view(-1)
    return StepDecisions(c.row, positions.view(-1), tokens.view(-1), s_conf.view(-1), logits_rows,
                         canvas_index=pool_index, taken=take.view(-1))


@dataclass
class PackedStep:
    meta: StepMeta                # the real members' scalars (offsets, phases, query ranges, slots)
    padded_meta: StepMeta         # what the forward runs: `meta`, or it plus dummy members
    ids: torch.Tensor
    positions: torch.Tensor
    top: int                      # a bound on the largest position (RoPE table rows)
    ctx: StepContext
    plan: CommitPlan | None = None

