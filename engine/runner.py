"""ModelRunner: packs the scheduled requests into one forward with a `StepContext` as its
attention, decodes the committable rows under the logit budget, returns each request's decisions."""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from engine import chunking, graphs
from engine.attention import PACKED, PackedKernel
from engine.cache_policy import POLICIES
from engine.config import EngineConfig
from engine.decoding import commit_mask, policy_columns
from engine.graphs import PadSpec, StepGraphs, pad_meta
from engine.kv_cache import KVPool
from engine.logits import DecodeResult, RowSegment, decode_rows
from engine.models.llada import LLaDAModelLM
from engine.ragged import padded, ragged
from engine.regions import DECODE, in_region
from engine.request import Phase, Request
from engine.scheduler import serves_long
from engine.staging import Staging
from engine.step import StepDecisions, StepStats
from engine.step_context import StepContext
from engine.step_meta import StepMeta
from engine.unmask import random_confidence


class ModelRunner:
    def __init__(self, model: LLaDAModelLM, config: EngineConfig, backend: str, pool: KVPool | None = None,
                 max_model_len: int | None = None, refresh_chunk: int | None = None):
        self.model, self.config, self.backend, self.pool = model, config, backend, pool
        self.model_config, self.dtype, self.device = model.config, model.dtype, model.device
        # a tensor-parallel rank's model brings its own vocabulary-column decode and head mean
        self.decode_rows = getattr(model, "decode_rows", decode_rows)
        self.policy = POLICIES[config.cache](config, getattr(model, "head_mean", None))
        self.max_model_len = max_model_len or model.config.max_sequence_length
        # a bound on one member's keys (a graph's kernel bound); gathered key rows per attention call
        self.key_budget = max(self.max_model_len, config.max_num_batched_tokens)
        self.key_chunk = config.max_num_batched_tokens
        self.kernel = PackedKernel(backend) if backend in PACKED else None
        # Reuse keys read in place where the kernel can; the profiler turns it off (the larger peak)
        self.in_place_keys = True
        self.staging = Staging(self.device)
        self.refresh_chunk = refresh_chunk or chunking.default_chunk(config)
        self.long_possible = serves_long(config)
        self.long_staging = Staging(self.device)
        self.graphs = StepGraphs(self) if graphs.enabled(config, self.device) and pool is not None else None

    def prepare(self, batch: list[tuple[Request, Phase]], pad: PadSpec | None = None,
                fwd_staging: Staging | None = None) -> PackedStep:
        """The step's inputs, attention context and commit plan, staged. `pad`: dummy members and
        keys; `fwd_staging`: where the forward's inputs go (a CUDA graph's own buffer)."""
        main = self.staging.begin()
        fwd = main if fwd_staging is None else fwd_staging.begin()
        reqs = [r for r, _ in batch]
        host_tokens, offsets, in_pool = _canvases(reqs)
        host_slots = self.pool.host_slots if self.pool is not None else _host_slots
        real = StepMeta.of(batch, offsets, host_slots)
        m = real if pad is None else pad_meta(real, pad)
        pos = ragged(m.q_start, m.n_q)
        ids = host_tokens[np.minimum(np.repeat(m.offset, m.n_q) + pos, len(host_tokens) - 1)]
        p = PackedStep(real, m, fwd.put(ids), fwd.put(pos), int(m.length.max()) - 1,
                       StepContext(m, self.policy, self.pool, self.backend, self.key_budget, fwd, self.dtype,
                                   None if pad is None else pad.keys, self.kernel, self.in_place_keys, self.key_chunk))
        p.plan = _plan_commit(real, [r.decoding for r in reqs], host_tokens, self.model_config.mask_token_id, main,
                              in_pool)
        fwd.flush()
        if fwd is not main:
            main.flush()
        return p

    def forward(self, p: PackedStep) -> torch.Tensor:
        """The forward of a prepared step (what CUDA graphs capture); reads only staged tensors."""
        p.ctx.finalize()
        rotation = self.model.rope.at(p.positions, self.dtype, top=p.top)
        return self.model.hidden_states(p.ids, p.positions, p.ctx, rope=rotation)

    @torch.no_grad()
    def run(self, batch: list[tuple[Request, Phase]]) -> StepStats:
        reqs = [r for r, _ in batch]
        budget = self.config.max_num_batched_tokens
        if self.long_possible and any(r.length > budget and p is not Phase.REUSE for r, p in batch):
            m, c, res, queries, keys = self._run_long(batch)
            n_ref, padded, graph = sum(p is not Phase.REUSE for _, p in batch), len(batch), False
        else:
            step = self.graphs.run(batch) if self.graphs is not None and self.graphs.takes(batch) else None
            if step is not None:
                p, hidden, graph = step
            else:
                p, graph = self.prepare(batch), False
                hidden = self.forward(p)
            m, c = p.meta, p.plan
            res = self._decode(reqs, hidden, c)
            spec = self.policy.spec(m)
            queries, n_ref, padded = int(m.cu_q[-1]), int(m.refresh.sum()), len(p.padded_meta.n_q)
            keys = int(spec.cached.sum() + spec.fresh.sum())
        conf = res.conf
        for i, r in enumerate(reqs):
            if r.params.remasking == "random":
                conf = conf.clone() if conf is res.conf else conf
                a, n = int(c.seg_start[i]), int(c.counts[i])
                conf[a : a + n] = random_confidence(n, r.gens.remask).to(conf)
        monolithic = self.config.max_num_logits is None
        decisions = _choose(conf, res.x0, res.entropy, c, (m.n_q if monolithic else c.counts).tolist())
        return StepStats(queries, res.rows_materialized, res.max_rows_at_once, n_ref, len(batch) - n_ref,
                         decisions, key_tokens=keys, padded_requests=padded, graph=graph,
                         cache=dict(Counter(r.cache or self.config.cache for r in reqs)))

    def _decode(self, reqs: list[Request], hidden: torch.Tensor, c: CommitPlan, rows: torch.Tensor | None = None):
        """The candidates' proposals under the logit budget (`rows`: their hidden rows)."""
        segments = [RowSegment(int(c.seg_start[i]), int(c.counts[i]), r.params.temperature, r.gens.gumbel)
                    for i, r in enumerate(reqs) if r.params.temperature > 0]
        return self.decode_rows(self.model.lm_head, hidden, c.rows if rows is None else rows, segments,
                                self.config.max_num_logits, self.model_config.mask_token_id, entropy=c.entropy)

    def _run_long(self, batch: list[tuple[Request, Phase]]) -> tuple:
        """A step with Refreshes longer than the token budget: each chunked and decoded at once,
        then the others packed; -> (StepMeta, CommitPlan, DecodeResult, query tokens, keys attended)."""
        budget = self.config.max_num_batched_tokens
        reqs = [r for r, _ in batch]
        host_tokens, offsets, in_pool = _canvases(reqs)
        host_slots = self.pool.host_slots if self.pool is not None else _host_slots
        long = [i for i, (r, p) in enumerate(batch) if p is not Phase.REUSE and r.length > budget]
        m = StepMeta.of([(r, Phase.REUSE if i in long else p) for i, (r, p) in enumerate(batch)], offsets, host_slots)
        c = _plan_commit(m, [r.decoding for r in reqs], host_tokens, self.model_config.mask_token_id,
                         self.long_staging.begin(), in_pool)
        self.long_staging.flush()
        storage = self.pool.storage if self.pool is not None else None
        parts: dict[int, DecodeResult] = {}
        decodes: list[DecodeResult] = []
        for i in long:
            r, p = batch[i]
            hidden = chunking.refresh_rows(self.model, r, p, storage, self.config, self.refresh_chunk, self.backend)
            a, n = int(c.seg_start[i]), int(c.counts[i])
            one = _member_plan(c, i)
            parts[i] = self._decode([r], hidden, one, c.rows[a : a + n] - int(m.cu_q[i]))
            decodes.append(parts[i])
            del hidden
        short = [i for i in range(len(batch)) if i not in parts]
        queries = keys = sum(reqs[i].length for i in long)
        if short:
            ps = self.prepare([batch[i] for i in short])
            res = self._decode([reqs[i] for i in short], self.forward(ps),
                               dataclasses.replace(ps.plan, entropy=c.entropy))
            decodes.append(res)
            queries += int(ps.meta.cu_q[-1])
            spec = self.policy.spec(ps.meta)
            keys += int(spec.cached.sum() + spec.fresh.sum())
            for j, i in enumerate(short):
                a, n = int(ps.plan.seg_start[j]), int(ps.plan.counts[j])
                parts[i] = _rows_of(res, a, n)
        joined = _joined([parts[i] for i in range(len(batch))], sum(d.rows_materialized for d in decodes),
                         max(d.max_rows_at_once for d in decodes))
        return m, c, joined, queries, keys


@dataclass
class CommitPlan:
    """Which hidden rows are candidates (the still-masked positions of each current block) and
    where each lands in the step's [B, W] table of candidates (W: the longest block)."""

    rows: torch.Tensor            # [R] hidden rows of the candidates, request then position order
    counts: np.ndarray            # [B] candidates per request
    seg_start: np.ndarray         # [B] each request's first candidate in `rows`
    width: int
    flat: torch.Tensor            # [R] each candidate's cell of the [B, W] table
    rel: torch.Tensor             # [B, W] table cell -> canvas position
    counts_t: torch.Tensor        # [B] `counts` on the device
    k: torch.Tensor               # [B] the fixed schedule's count this step
    kinds: torch.Tensor | None    # [B] decoding policy codes (engine.decoding); None: all `fixed`
    values: torch.Tensor | None   # [B] their values, float64 bits
    entropy: bool                 # a request decodes by entropy: the decode computes it
    row: torch.Tensor             # [B*W] the request of each table cell
    canvas_start: torch.Tensor | None  # [B] where each canvas starts in the canvas pool's tokens


def _plan_commit(m: StepMeta, policies: list, host_tokens: np.ndarray, mask_id: int, staging: Staging,
                 in_pool: bool) -> CommitPlan:
    W = int(m.block_len.max())
    idx, valid = padded(m.offset + m.block_start, m.block_len, W)
    cand = (host_tokens[idx] == mask_id) & valid
    rel = idx - m.offset[:, None]
    rows = (rel - m.q_start[:, None] + m.cu_q[:-1, None])[cand]
    counts = cand.sum(1)
    fixed = all(p.fixed for p in policies)
    kinds, values = (None, None) if fixed else policy_columns(policies)
    B = len(counts)
    return CommitPlan(staging.put(rows), counts, np.cumsum(counts) - counts, W, staging.put(np.flatnonzero(cand)),
                      staging.put(rel), staging.put(counts), staging.put(m.k), None if fixed else staging.put(kinds),
                      None if fixed else staging.put(values), any(p.kind == "entropy" for p in policies),
                      staging.put(np.repeat(np.arange(B), W)), staging.put(m.offset) if in_pool else None)


@in_region(DECODE)
def _choose(conf: torch.Tensor, x0: torch.Tensor, entropy: torch.Tensor | None, c: CommitPlan,
            logits_rows: list[int]) -> StepDecisions:
    """Each request's candidates sorted by confidence (ties: lower position first), then its
    policy's prefix taken (`engine.decoding.commit_mask`); `taken` marks the cells that commit."""
    B, W = len(c.counts), c.width

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
    return StepDecisions(c.row, positions.view(-1), tokens.view(-1), s_conf.view(-1), logits_rows,
                         canvas_index=None if c.canvas_start is None else (c.canvas_start[:, None] + positions).view(-1),
                         taken=take.view(-1))


@dataclass
class PackedStep:
    meta: StepMeta                # the real members' scalars (offsets, phases, query ranges, slots)
    padded_meta: StepMeta         # what the forward runs: `meta`, or it plus dummy members
    ids: torch.Tensor             # [N] packed input ids
    positions: torch.Tensor       # [N] their canvas positions
    top: int                      # a bound on the largest position (RoPE table rows)
    ctx: StepContext
    plan: CommitPlan | None = None


def _host_slots(table: torch.Tensor) -> np.ndarray:
    return table.cpu().numpy()


def _canvases(reqs: list[Request]) -> tuple[np.ndarray, np.ndarray, bool]:
    """The host tokens holding every canvas, each canvas's offset, and whether that is the
    engine's canvas pool rather than a concatenation."""
    pool = getattr(reqs[0], "canvas_pool", None)
    if pool is not None and all(getattr(r, "canvas_pool", None) is pool for r in reqs):
        return pool.host, np.fromiter((r.canvas_offset for r in reqs), dtype=np.int64, count=len(reqs)), True
    lens = np.fromiter((r.length for r in reqs), dtype=np.int64, count=len(reqs))
    return np.concatenate([r.host_canvas for r in reqs]), np.cumsum(lens) - lens, False


def _member_plan(c: CommitPlan, i: int) -> CommitPlan:
    """The part of a commit plan `_decode` reads, for member i alone (its candidates from 0)."""
    return dataclasses.replace(c, seg_start=np.zeros(1, dtype=np.int64), counts=c.counts[i : i + 1])


def _rows_of(res: DecodeResult, a: int, n: int) -> DecodeResult:
    ent = None if res.entropy is None else res.entropy[a : a + n]
    return DecodeResult(res.x0[a : a + n], res.conf[a : a + n], res.rows_materialized, res.max_rows_at_once, ent)


def _joined(parts: list[DecodeResult], rows: int, at_once: int) -> DecodeResult:
    """Per-member proposals in batch order as one result (`rows` materialized, `at_once` at most)."""
    ent = None if parts[0].entropy is None else torch.cat([p.entropy for p in parts])
    return DecodeResult(torch.cat([p.x0 for p in parts]), torch.cat([p.conf for p in parts]), rows, at_once, ent)
