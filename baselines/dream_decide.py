"""Dream's token decisions on a static batch, shared by every baseline on a Dream model: the
request's sampler arguments (`dream_sampling`), the block-edge commit of the block-wise systems
(`commit_first`), one step of Dream's time grid (`commit_step`) and Fast-dLLM's Dream threshold
rule (`commit_threshold`). Each row follows baselines.reference_dream with its request's own
random streams; the upstream rules are in docs/DREAM_BASELINES.md.
"""
from __future__ import annotations

import torch

from baselines.reference_dream import (
    alg_confidence,
    choose_positions,
    propose,
    timesteps,
    token_probs,
    transfer_fraction,
)
from baselines.static_batch import Batch
from engine.regions import DECODE, region
from engine.sampling import SamplingParams


def dream_rules(model) -> bool:
    """A shifted model (the hidden at p - 1 predicts p: Dream) is decoded by its systems' Dream code."""
    return model is not None and model.config.shift > 0


def dream_sampling(params: SamplingParams, default_alg: str) -> SamplingParams:
    """The request's Dream sampler arguments (`SamplingParams.dream`): its own when it asks for one of
    Dream's algs, else upstream's defaults with `default_alg`, the alg the system's upstream Dream
    evaluation passes. ValueError if invalid."""
    base = dict(gen_length=params.gen_length, steps=params.steps, temperature=params.temperature, seed=params.seed)
    if params.dream_rule:
        return SamplingParams.dream(**base, alg=params.remasking, eps=params.eps, alg_temp=params.alg_temp,
                                    top_p=params.top_p, top_k=params.top_k)
    return SamplingParams.dream(**base, alg=default_alg)


def _masked(batch: Batch, r: int, lo: int, hi: int) -> torch.Tensor:
    return torch.nonzero(batch.x[r, lo:hi] == batch.reqs[r].mask_id).squeeze(-1) + lo


@region(DECODE)
def commit_first(batch: Batch, logits: torch.Tensor, q_start: int, dps: list[SamplingParams]) -> None:
    """The block-edge rule: at the block's full-canvas forward commit only block_start, from its
    correctly shifted row (the hidden at block_start - 1), whatever the alg or threshold."""
    s = batch.block_range[0]
    for r, req in enumerate(batch.reqs):
        if batch.x[r, s] != req.mask_id:
            continue
        probs = token_probs(logits[r, s - q_start][None], dps[r])
        batch.x[r, s] = propose(probs, dps[r].temperature, req.gens.gumbel, req.mask_id)[0]


@region(DECODE)
def commit_step(batch: Batch, logits: torch.Tensor, q_start: int, lo: int, hi: int, i: int, steps: int,
                dps: list[SamplingParams], alg: str | None = None) -> None:
    """Step i of Dream's time grid linspace(1, eps, steps + 1) over each row's masked positions in
    [lo, hi) (logits [B, Tq, V] cover columns [q_start, q_start + Tq)), by `alg` or the request's."""
    for r, req in enumerate(batch.reqs):
        dp, mask_id = dps[r], req.mask_id
        cand = _masked(batch, r, lo, hi)
        rows = logits[r, cand - q_start]
        ts = timesteps(steps, dp.eps)
        rule = alg or dp.remasking
        if rule == "origin":
            # each masked position moves with probability 1 - s/t (reference_dream's draws)
            u = torch.rand(cand.numel(), dtype=torch.float64, generator=req.gens.remask, device=req.gens.remask.device)
            move = (u < float(transfer_fraction(ts, i))).to(cand.device)
            batch.x[r, cand[move]] = propose(token_probs(rows[move], dp), dp.temperature, req.gens.gumbel, mask_id)
            continue
        if cand.numel() == 0:
            continue
        probs = token_probs(rows, dp)
        x0 = propose(probs, dp.temperature, req.gens.gumbel, mask_id)
        conf = alg_confidence(probs, x0, rule)
        chosen = choose_positions(conf, int(cand.numel() * transfer_fraction(ts, i)), dp.alg_temp, req.gens.remask)
        batch.x[r, cand[chosen]] = x0[chosen]


@region(DECODE)
def commit_threshold(batch: Batch, logits: torch.Tensor, q_start: int, threshold: float,
                     dps: list[SamplingParams]) -> None:
    """Fast-dLLM's Dream `confidence_threshold`: over the block's masked positions, confidence p(x0)
    of the filtered distribution; the most confident always, each other one iff >= threshold."""
    s, e = batch.block_range
    for r, req in enumerate(batch.reqs):
        cand = _masked(batch, r, s, e)
        if cand.numel() == 0:
            continue
        probs = token_probs(logits[r, cand - q_start], dps[r])
        x0 = propose(probs, dps[r].temperature, req.gens.gumbel, req.mask_id)
        conf = alg_confidence(probs, x0, "maskgit_plus")
        order = torch.topk(conf, cand.numel()).indices
        ok = conf[order] >= threshold
        ok[0] = True
        batch.x[r, cand[order[ok]]] = x0[order[ok]]
