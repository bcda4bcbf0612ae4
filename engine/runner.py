"""ModelRunner: the scheduled requests in one packed forward, decoded under the logit budget."""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from engine import chunking
from engine.attention import PACKED, PackedKernel
from engine.config import EngineConfig, cuda_graphs_on
from engine.decoding import commit_mask, policy_columns
from engine.graphs import PadSpec, StepGraphs, pad_meta
from engine.kv_cache import KVPool
from engine.logits import DecodeResult, RowSegment, decode_rows
from engine.models import DenseLM
from engine.regions import DECODE, region
from engine.request import Phase, Request
from engine.scheduler import serves_long
from engine.step import Batch, Staging, StepDecisions, StepMeta, StepStats, offsets, padded, ragged
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
        self.key_chunk = config.max_num_batched_tokens
        self.key_budget = max(self.max_model_len, self.key_chunk)
        self.kernel = PackedKernel(backend) if backend in PACKED else None
        self.in_place_keys = True
        self.staging, self.long_staging = Staging(self.device), Staging(self.device)
        self.refresh_chunk = refresh_chunk or config.refresh_chunk_tokens or max(1, config.max_num_batched_tokens // 2)
        self.graphs = StepGraphs(self) if cuda_graphs_on(config.cuda_graphs, self.device) and pool is not None else None

    def prepare(self, batch: Batch, pad: PadSpec | None = None, fwd_staging: Staging | None = None) -> PackedStep:
        """The step's inputs, attention and commit plan, staged (`pad`: dummies; `fwd_staging`: a graph's)."""
        main = self.staging.begin()
        fwd = main if fwd_staging is None else fwd_staging.begin()
        real, plan, tokens = self._plan(batch, main)
        m = real if pad is None else pad_meta(real, pad)
        at = np.repeat(m.offset, m.n_q) + ragged(m.q_start, m.n_q)         # a dummy's rows: any token
        p = self.packed(real, m, fwd, tokens[np.minimum(at, len(tokens) - 1)], None if pad is None else pad.keys)
        p.plan = plan
        fwd.flush()
        if fwd is not main:
            main.flush()
        return p

    def _plan(self, batch: Batch, staging: Staging) -> tuple[StepMeta, CommitPlan, np.ndarray]:
        """The step's columns, commit plan and host tokens (the canvas pool's when it holds every canvas)."""
        reqs, cfg = [r for r, _ in batch], self.model_config
        pool = reqs[0].canvas_pool
        in_pool = pool is not None and all(r.canvas_pool is pool for r in reqs)
        if in_pool:
            tokens, starts = pool.host, np.array([r.canvas_offset for r in reqs], dtype=np.int64)
        else:
            tokens = np.concatenate([r.host_canvas for r in reqs])
            starts = offsets(np.array([r.length for r in reqs], dtype=np.int64))[:-1]
        m = StepMeta.of(batch, starts, self.pool.host_slots, cfg.shift)
        W = int(m.block_len.max())
        idx, valid = padded(m.offset + m.block_start, m.block_len, W)
        cand = (tokens[idx] == cfg.mask_token_id) & valid
        for i, r in enumerate(reqs):
            moves = r.moves()                     # `origin`: only this step's movers are candidates
            if moves is not None:
                cand[i, np.flatnonzero(cand[i])[~moves]] = False
        policies = [r.decoding for r in reqs]
        rel = idx - m.offset[:, None]
        rows = np.where(rel >= cfg.shift, rel - cfg.shift, rel) - m.q_start[:, None] + m.cu_q[:-1, None]
        counts = cand.sum(1)
        kinds, values = (None, None) if all(p.fixed for p in policies) else map(staging.put, policy_columns(policies))
        plan = CommitPlan(staging.put(rows[cand]), counts, counts.cumsum() - counts, staging.put(np.flatnonzero(cand)),
                          staging.put(rel), staging.put(counts), staging.put(m.k), kinds, values,
                          any(p.kind == "entropy" for p in policies), staging.put(np.repeat(np.arange(len(reqs)), W)),
                          staging.put(m.offset) if in_pool else None)
        return m, plan, tokens

    def packed(self, real: StepMeta, m: StepMeta, fwd: Staging, ids: np.ndarray, static_keys: int | None = None):
        return PackedStep(real, m, fwd.put(ids), fwd.put(ragged(m.q_start, m.n_q)), int(m.length.max()) - 1,
                          StepContext(m, self.policy, self.pool, self.backend, self.key_budget, fwd, self.dtype,
                                      static_keys, self.kernel, self.in_place_keys, self.key_chunk))

    def forward(self, p: PackedStep) -> torch.Tensor:
        p.ctx.finalize()
        rotation = self.model.rope.at(p.positions, self.dtype, top=p.top)
        return self.model.hidden_states(p.ids, p.positions, p.ctx, rope=rotation)

    @torch.no_grad()
    def run(self, batch: Batch) -> StepStats:
        reqs, budget = [r for r, _ in batch], self.config.max_num_batched_tokens
        long = [i for i, (r, p) in enumerate(batch) if p is not Phase.REUSE and r.length > budget]
        if long and serves_long(self.config):
            m, c, res, queries, keys = self._run_long(batch, long)
            n_ref, n_padded, graph = sum(p is not Phase.REUSE for _, p in batch), len(batch), False
        else:
            step = self.graphs.run(batch) if self.graphs is not None and self.graphs.takes(batch) else None
            if step is None:
                p = self.prepare(batch)
                step = p, self.forward(p), False
            p, hidden, graph = step
            m, c, queries, keys = p.meta, p.plan, int(p.meta.cu_q[-1]), self._keys(p)
            res, n_ref, n_padded = self._decode(reqs, hidden, c), int(m.refresh.sum()), len(p.padded_meta.n_q)
        for i, r in enumerate(reqs):
            a, n = int(c.seg_start[i]), int(c.counts[i])
            ranked = rescored(res.conf, a, n, r.params, r.commit_count, r.gens)
            if ranked is not None:
                res.conf[a : a + n] = ranked
        logit_rows = m.n_q if self.config.max_num_logits is None else c.counts    # monolithic: every query row
        cache = dict(Counter(r.cache or self.config.cache for r in reqs))
        return StepStats(queries, res.rows_materialized, res.max_rows_at_once, n_ref, len(batch) - n_ref,
                         _choose(res.conf, res.x0, res.entropy, c, logit_rows.tolist()), key_tokens=keys,
                         padded_requests=n_padded, graph=graph, cache=cache)

    def _keys(self, p: PackedStep) -> int:
        """Keys the real members attend to, from the step's planned attention (dummies come last)."""
        n = len(p.meta.n_q)
        return int(p.ctx.cached[:n].sum() + p.ctx.fresh[:n].sum())

    def _decode(self, reqs: list[Request], hidden: torch.Tensor, c: CommitPlan, rows: torch.Tensor | None = None):
        return self.decode_rows(self.model.lm_head, hidden, c.rows if rows is None else rows, row_segments(reqs, c),
                                self.config.max_num_logits, self.model_config.mask_token_id, entropy=c.entropy)

    def _run_long(self, batch: Batch, long: list[int]) -> tuple:
        """The `long` members' Refresh chunked and decoded, then the others packed."""
        m, c, _ = self._plan([(r, Phase.REUSE if i in long else p) for i, (r, p) in enumerate(batch)],
                             self.long_staging.begin())
        self.long_staging.flush()
        parts, decodes = [None] * len(batch), []     # per member: (its decode, first row, rows)
        queries = keys = sum(batch[i][0].length for i in long)
        for i in long:
            a, n = int(c.seg_start[i]), int(c.counts[i])
            one = dataclasses.replace(c, seg_start=np.zeros(1, dtype=np.int64), counts=c.counts[i : i + 1])
            hidden = chunking.refresh_rows(self.model, *batch[i], self.pool.storage, self.config, self.refresh_chunk,
                                           self.backend)
            decodes.append(self._decode([batch[i][0]], hidden, one, c.rows[a : a + n] - int(m.cu_q[i])))
            parts[i] = (decodes[-1], 0, n)
            del hidden
        short = [i for i in range(len(batch)) if i not in long]
        if short:
            ps = self.prepare([batch[i] for i in short])
            decodes.append(self._decode([batch[i][0] for i in short], self.forward(ps),
                                        dataclasses.replace(ps.plan, entropy=c.entropy)))
            queries, keys = queries + int(ps.meta.cu_q[-1]), keys + self._keys(ps)
            for j, i in enumerate(short):
                parts[i] = (decodes[-1], int(ps.plan.seg_start[j]), int(ps.plan.counts[j]))
        x0, conf = (torch.cat([getattr(d, f)[a : a + n] for d, a, n in parts]) for f in ("x0", "conf"))
        entropy = None if decodes[0].entropy is None else torch.cat([d.entropy[a : a + n] for d, a, n in parts])
        return m, c, DecodeResult(x0, conf, sum(d.rows_materialized for d in decodes),
                                  max(d.max_rows_at_once for d in decodes), entropy), queries, keys


@dataclass
class CommitPlan:
    """The candidates (block position p, read at hidden row p - shift) as cells of a [B, W] table (docs/ENGINE.md)."""
    rows: torch.Tensor            # [R] each candidate's hidden row, request then position order
    counts: np.ndarray
    seg_start: np.ndarray         # each request's first candidate in `rows`
    flat: torch.Tensor            # [R] each candidate's table cell
    rel: torch.Tensor             # [B, W] each cell's canvas position
    counts_t: torch.Tensor
    k: torch.Tensor               # the fixed schedule's count this step
    kinds: torch.Tensor | None    # policy codes (engine.decoding); None: all `fixed`
    values: torch.Tensor | None
    entropy: bool
    row: torch.Tensor             # [B*W] each cell's request
    canvas_start: torch.Tensor | None


def row_segments(reqs: list[Request], c: CommitPlan) -> list[RowSegment]:
    return [RowSegment(int(c.seg_start[i]), int(c.counts[i]), r.params.temperature, r.gens.gumbel,
                       r.params if r.params.dream_rule else None)
            for i, r in enumerate(reqs) if r.params.temperature > 0 or r.params.dream_rule]


@region(DECODE)
def _choose(conf: torch.Tensor, x0: torch.Tensor, entropy: torch.Tensor | None, c: CommitPlan,
            logits_rows: list[int]) -> StepDecisions:
    """Each request's candidates by confidence (ties: lower position first), its policy's prefix taken."""
    B, W = c.rel.shape

    def table(v: torch.Tensor, fill) -> torch.Tensor:
        return v.new_full((B * W,), fill).index_put_((c.flat,), v).view(B, W)
    s_conf, order = torch.sort(table(conf, -torch.inf), dim=1, descending=True, stable=True)
    s_ent = None if entropy is None else table(entropy, 0).gather(1, order)
    take = commit_mask(s_conf, s_ent, c.counts_t, c.k, c.kinds, c.values)
    positions = c.rel.gather(1, order)
    pool_index = None if c.canvas_start is None else (c.canvas_start[:, None] + positions).view(-1)
    return StepDecisions(c.row, positions.view(-1), table(x0, 0).gather(1, order).view(-1), s_conf.view(-1),
                         logits_rows, canvas_index=pool_index, taken=take.view(-1))


@dataclass
class PackedStep:
    meta: StepMeta
    padded_meta: StepMeta         # what the forward runs: `meta`, or it plus dummy members
    ids: torch.Tensor
    positions: torch.Tensor
    top: int                      # a bound on the largest position (RoPE table rows), an int for torch.compile
    ctx: StepContext
    plan: CommitPlan | None = None

