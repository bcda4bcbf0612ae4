"""The oracle for Dream: its sampler `diffusion_generate` (Dream-org/Dream-v0-Instruct-7B
generation_utils.py, `_sample`; copies: NVlabs/Fast-dLLM dream/model/generation_utils.py) in plain code.

One sequence, a full forward per step, no blocks; reasons and the RNG contract: docs/DREAM_SAMPLER.md.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.sampling import DREAM_ALGS as ALGS  # noqa: F401
from engine.sampling import SamplingParams
from engine.unmask import (  # noqa: F401  (Dream's rule lives in the engine; re-exported here)
    RequestGenerators,
    alg_confidence,
    dream_schedule,
    gumbel_topk_keys,
    propose,
    timesteps,
    token_probs,
    transfer_fraction,
)

LogitsFn = Callable[[torch.Tensor], torch.Tensor]   # canvas [L] -> [L, V], row p predicts token p
# The arguments of Dream's `diffusion_generate` (upstream defaults) are the engine's params
DreamSampling = SamplingParams.dream


def choose_positions(conf: torch.Tensor, k: int, alg_temp: float | None, gen: torch.Generator) -> torch.Tensor:
    """The k rows to commit: top-k of conf (ties by row order, as the engine's ranking) or alg_temp's Gumbel top-k."""
    if k <= 0:
        return conf.new_zeros(0, dtype=torch.long)
    keys = conf if not alg_temp else gumbel_topk_keys(conf, alg_temp, gen)
    return torch.sort(keys, descending=True, stable=True).indices[:k]


def dense_logits(model) -> LogitsFn:
    """The seam's model as a logits function: forward(ids [1, L])[0] (the shift already applied)."""
    return lambda x: model(x[None])[0]


@torch.no_grad()
def reference_generate(logits_fn: LogitsFn, prompt_ids: list[int], params: SamplingParams,
                       mask_id: int) -> tuple[list[int], int]:
    """Returns (generated token ids, number of forward evaluations = steps). `params`: Dream's
    (`SamplingParams.dream(...)`: one block, the time grid, an alg, fixed decoding)."""
    if not prompt_ids or mask_id in prompt_ids:
        raise ValueError("prompt must be non-empty and must not contain the mask token")
    if not (params.dream_rule and params.schedule == "timegrid" and params.num_blocks == 1
            and params.decoding.fixed and params.cfg_scale == 0):
        raise ValueError("reference_dream runs Dream's sampler only: use SamplingParams.dream(...)")
    P = len(prompt_ids)
    x = torch.tensor(list(prompt_ids) + [mask_id] * params.gen_length)
    gens = RequestGenerators(params.seed)
    ts = timesteps(params.steps, params.eps)
    for i in range(params.steps):
        logits = logits_fn(x)
        x = x.to(logits.device)
        masked = torch.nonzero(x == mask_id).squeeze(-1)
        rows = logits[masked]
        if params.remasking == "origin":
            # Each masked position moves with probability 1 - s/t: one float64 uniform per masked
            # position from the remask stream, then tokens drawn only for the moving rows.
            u = torch.rand(masked.numel(), dtype=torch.float64, generator=gens.remask, device=gens.remask.device)
            move = (u < float(transfer_fraction(ts, i))).to(x.device)
            x0 = propose(token_probs(rows[move], params), params.temperature, gens.gumbel, mask_id)
            x[masked[move]] = x0
            continue
        probs = token_probs(rows, params)
        x0 = propose(probs, params.temperature, gens.gumbel, mask_id)
        conf = alg_confidence(probs, x0, params.remasking)
        chosen = choose_positions(conf, int(masked.numel() * transfer_fraction(ts, i)), params.alg_temp, gens.remask)
        x[masked[chosen]] = x0[chosen]
    return x[P:].tolist(), params.steps
