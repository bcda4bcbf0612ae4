"""LLaDA's unmasking rule: transfer schedule, float64 Gumbel-max sampling, remasking (docs/CONTRACTS.md)."""
from __future__ import annotations

import torch


def transfer_schedule(n_masked: int, steps: int) -> list[int]:
    """Tokens to commit at each of `steps` steps: n // steps each, the first n % steps get +1."""
    base, rem = divmod(n_masked, steps)
    return [base + (1 if i < rem else 0) for i in range(steps)]


class RequestGenerators:
    """The two per-request random streams."""

    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        dev = torch.device(device)
        dev = dev if dev.type == "cuda" else torch.device("cpu")
        self.gumbel = torch.Generator(device=dev).manual_seed(int(seed))
        self.remask = torch.Generator(device=dev).manual_seed(int(seed) ^ 0x5DEECE66D)


def proposal_argmax(scores: torch.Tensor, mask_id: int) -> torch.Tensor:
    """argmax over the last dim without the mask id's column (written in place, then restored)."""
    col = scores[..., mask_id].clone()
    scores[..., mask_id] = -torch.inf
    x0 = scores.argmax(-1)
    scores[..., mask_id] = col
    return x0


def gumbel_argmax(logits: torch.Tensor, temperature: float, gen: torch.Generator | None, mask_id: int) -> torch.Tensor:
    """Proposal: argmax of exp(l) / (-log U)^T, U ~ U(0,1) in float64 (LLaDA's add_gumbel_noise)."""
    if temperature == 0:
        return proposal_argmax(logits, mask_id)
    return proposal_argmax(gumbel_scores(logits, gumbel_noise(logits.shape, temperature, gen, logits.device)), mask_id)


def gumbel_noise(shape, temperature: float, gen: torch.Generator | None, device) -> torch.Tensor:
    """(−log U)^T, U ~ U(0,1) in float64 from the request's generator."""
    u = torch.rand(shape, dtype=torch.float64, generator=gen, device=_gen_device(gen)).to(device)
    u.log_().neg_()
    if temperature != 1:
        u.pow_(temperature)
    return u


def gumbel_scores(logits: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """exp(l) / noise in float64, in a new tensor (logits are left as they are)."""
    noisy = logits.to(torch.float64)
    noisy = noisy.exp_() if noisy.data_ptr() != logits.data_ptr() else noisy.exp()
    return noisy.div_(noise)


def confidence_at(logits: torch.Tensor, x0: torch.Tensor, dtype: torch.dtype | None = None,
                  inplace: bool = False) -> torch.Tensor:
    """softmax(logits)[x0] as 1 / Σ exp(l − l[x0]) (in place when `inplace`), summed in `dtype`."""
    dt = dtype or torch.promote_types(logits.dtype, torch.float32)
    sel = logits.gather(-1, x0[:, None])
    shifted = logits.sub_(sel) if inplace else logits - sel
    return shifted.exp_().sum(-1, dtype=dt).reciprocal_()


def entropy_of(logits: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The predictive entropy −Σ p log p of every row of clean logits (at least float32)."""
    lf = logits.to(dtype or torch.promote_types(logits.dtype, torch.float32))
    logp = torch.log_softmax(lf, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def random_confidence(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, dtype=torch.float64, generator=gen, device=_gen_device(gen))


def _gen_device(gen: torch.Generator | None) -> torch.device:
    return torch.device("cpu") if gen is None else gen.device


def select_transfer(conf: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (into the candidate rows) of the k most confident; k may be 0."""
    if k <= 0:
        return conf.new_zeros(0, dtype=torch.long)
    return torch.topk(conf, k).indices
