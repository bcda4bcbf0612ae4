"""The oracle: LLaDA's `generate` (ML-GSAI/LLaDA generate.py) in plain, slow, readable code.

One sequence at a time, every step a full forward over prompt + generation (NFE = steps), full
[L, V] logits. The engine's exact mode (cache=none) must reproduce these tokens exactly.
Like every decoder here it never proposes the mask id (engine.unmask.proposal_argmax).
"""
from __future__ import annotations

import torch

from engine.models import DenseLM
from engine.sampling import SamplingParams
from engine.unmask import (
    RequestGenerators,
    confidence_at,
    gumbel_argmax,
    random_confidence,
    transfer_schedule,
)


@torch.no_grad()
def full_logits(model: DenseLM, x: torch.Tensor) -> torch.Tensor:
    return model(x[None])[0]


@torch.no_grad()
def reference_generate(model: DenseLM, prompt_ids: list[int], params: SamplingParams) -> tuple[list[int], int]:
    """Returns (generated token ids, number of forward evaluations)."""
    cfg = model.config
    mask_id = cfg.mask_token_id
    if not prompt_ids or mask_id in prompt_ids:
        raise ValueError("prompt must be non-empty and must not contain the mask token")
    P = len(prompt_ids)
    x = torch.tensor(list(prompt_ids) + [mask_id] * params.gen_length, device=model.device)
    prompt_positions = torch.arange(x.numel(), device=x.device) < P
    gens = RequestGenerators(params.seed)
    nfe = 0
    for b in range(params.num_blocks):
        start, end = P + b * params.block_length, P + (b + 1) * params.block_length
        schedule = transfer_schedule(int((x[start:end] == mask_id).sum()), params.steps_per_block)
        for k in schedule:
            logits = full_logits(model, x)
            if params.cfg_scale > 0:
                # Classifier-free guidance: the unconditional pass sees the prompt masked out.
                uncond = full_logits(model, torch.where(prompt_positions, mask_id, x))
                logits = uncond + (params.cfg_scale + 1) * (logits - uncond)
                nfe += 1
            nfe += 1
            # Candidates: still-masked positions left of the block end (= of the current block).
            cand = torch.nonzero(x[:end] == mask_id).squeeze(-1)
            cand_logits = logits[cand]
            x0 = gumbel_argmax(cand_logits, params.temperature, gens.gumbel, mask_id)
            if params.remasking == "low_confidence":
                conf = confidence_at(cand_logits, x0, dtype=cand_logits.dtype)
            else:
                conf = random_confidence(cand.numel(), gens.remask)
            chosen = torch.topk(conf, k).indices
            x[cand[chosen]] = x0[chosen]
    return x[P:].tolist(), nfe
