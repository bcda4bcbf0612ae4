"""ModelRunner: packs the scheduled requests into one varlen batch, runs the model, decodes the
committable rows under the logit budget and hands them to the unmasking rule.

Per request and phase, the query set is the whole canvas (Refresh*) or the current block
(Reuse). The per-step `StepContext` is what the model's attention calls: it knows, per
sequence, which keys to attend over and what to store (nano-vllm's context object, without
the global).
"""
from __future__ import annotations

import torch

from engine import sparse
from engine.attention import attend_one, varlen_attention
from engine.config import EngineConfig
from engine.logits import RowSegment, decode_rows
from engine.models.llada import LLaDAModelLM
from engine.request import Phase, Request
from engine.step import StepDecisions, StepStats
from engine.unmask import random_confidence, select_transfer


class StepContext:
    """Attention for one packed step: per sequence, which keys to use and what to cache."""

    def __init__(self, batch: list[tuple[Request, Phase]], cu_q: list[int], config: EngineConfig, backend: str):
        self.batch, self.cu_q, self.config, self.backend = batch, cu_q, config, backend

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # SDPA attends sequence by sequence, so a Reuse step's concatenated keys exist for one
        # request at a time; the packed flash-attn call needs them all at once (the profiler
        # accounts for that).
        streaming = self.backend == "sdpa"
        out = torch.empty_like(q) if streaming else None
        keys, values = [], []
        for i, (req, phase) in enumerate(self.batch):
            a, b = self.cu_q[i], self.cu_q[i + 1]
            ks, vs = k[a:b].transpose(0, 1), v[a:b].transpose(0, 1)       # [Hkv, Lq, D]
            if phase is Phase.REUSE:
                ks, vs = self._reuse_keys(req, layer, ks, vs)
            elif phase is Phase.REFRESH_STORE:
                req.kv[layer, 0].copy_(ks)
                req.kv[layer, 1].copy_(vs)
            elif phase is Phase.REFRESH_SELECT:
                self._select(req, layer, q[a:b], ks, vs)
            if streaming:
                out[a:b] = attend_one(q[a:b], ks, vs)
            else:
                keys.append(ks)
                values.append(vs)
        return out if streaming else varlen_attention(q, self.cu_q, keys, values, self.backend)

    def _reuse_keys(self, req: Request, layer: int, kb: torch.Tensor, vb: torch.Tensor):
        s, e = req.block_range
        if self.config.cache == "dual":
            # Fast-dLLM dual cache: fresh block K/V overwrite the cached ones in place; the
            # prefix and suffix stay as they were at the block's Refresh.
            req.kv[layer, 0, :, s:e] = kb
            req.kv[layer, 1, :, s:e] = vb
            return req.kv[layer, 0], req.kv[layer, 1]
        if req.kv is None:                                              # no context at all
            return kb, vb
        return torch.cat([req.kv[layer, 0], kb], dim=1), torch.cat([req.kv[layer, 1], vb], dim=1)

    def _select(self, req: Request, layer: int, q: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor) -> None:
        if req.kv is None:
            return
        s, e = req.block_range
        ctx = sparse.context_index(req.length, s, e, ks.device)
        k_ctx, v_ctx = ks[:, ctx], vs[:, ctx]
        idx = sparse.select(q[s:e], k_ctx, req.kv.shape[3], self.config.selection, self.config.pool_window,
                            self.config.score_query)
        req.kv[layer, 0] = sparse.pack(k_ctx, idx)
        req.kv[layer, 1] = sparse.pack(v_ctx, idx)


class ModelRunner:
    def __init__(self, model: LLaDAModelLM, config: EngineConfig, backend: str):
        self.model, self.config, self.backend = model, config, backend
        self.model_config, self.dtype, self.device = model.config, model.dtype, model.device

    @torch.no_grad()
    def run(self, batch: list[tuple[Request, Phase]]) -> StepStats:
        device = self.model.device
        ids, pos, cu_q = [], [], [0]
        for req, phase in batch:
            if phase.is_refresh:
                ids.append(req.canvas)
                pos.append(torch.arange(req.length, device=device))
            else:
                s, e = req.block_range
                ids.append(req.canvas[s:e])
                pos.append(torch.arange(s, e, device=device))
            cu_q.append(cu_q[-1] + ids[-1].numel())
        ctx = StepContext(batch, cu_q, self.config, self.backend)
        hidden = self.model.hidden_states(torch.cat(ids), torch.cat(pos), ctx)

        # Rows that can be committed: masked positions of each request's current block.
        rows, segments, cands = [], [], []
        for i, (req, phase) in enumerate(batch):
            cand = req.candidates()
            offset = cu_q[i] - (0 if phase.is_refresh else req.block_range[0])
            segments.append(RowSegment(sum(r.numel() for r in rows), cand.numel(), req.params.temperature, req.gens.gumbel))
            rows.append(cand + offset)
            cands.append(cand)
        row_index = torch.cat(rows)
        res = decode_rows(self.model.lm_head, hidden, row_index, segments, self.config.max_num_logits,
                          self.model.config.mask_token_id)

        monolithic = self.config.max_num_logits is None
        rows_of, pos_of, tok_of, conf_of, charged = [], [], [], [], []
        for i, ((req, _), seg, cand) in enumerate(zip(batch, segments, cands)):
            x0 = res.x0[seg.start : seg.start + seg.count]
            if req.params.remasking == "random":
                conf = random_confidence(seg.count, req.gens.remask)
            else:
                conf = res.conf[seg.start : seg.start + seg.count]
            chosen = select_transfer(conf, req.schedule[req.step_in_block])
            rows_of.append(torch.full((chosen.numel(),), i, dtype=torch.long))
            pos_of.append(cand[chosen])
            tok_of.append(x0[chosen])
            conf_of.append(conf[chosen])
            charged.append((cu_q[i + 1] - cu_q[i]) if monolithic else seg.count)
        n_ref = sum(1 for _, p in batch if p.is_refresh)
        decisions = StepDecisions(torch.cat(rows_of), torch.cat(pos_of), torch.cat(tok_of), torch.cat(conf_of), charged)
        return StepStats(cu_q[-1], res.rows_materialized, res.max_rows_at_once, n_ref, len(batch) - n_ref, decisions)
