"""The unmasking rules: LLaDA's (transfer schedule, float64 Gumbel-max sampling, remasking;
docs/CONTRACTS.md) and Dream's (time grid, filtered draws, `alg` scores; docs/DREAM_SAMPLER.md)."""
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
    u = torch.rand(shape, dtype=torch.float64, generator=gen, device="cpu" if gen is None else gen.device).to(device)
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


def entropy_of(logits: torch.Tensor) -> torch.Tensor:
    """The predictive entropy −Σ p log p of every row of clean logits (at least float32)."""
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def random_confidence(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, dtype=torch.float64, generator=gen, device=gen.device)


def timesteps(steps: int, eps: float) -> torch.Tensor:
    """Dream's float32 time grid linspace(1, eps, steps + 1), computed on the CPU."""
    return torch.linspace(1, eps, steps + 1, dtype=torch.float32)


def transfer_fraction(ts: torch.Tensor, i: int) -> torch.Tensor:
    """1 - s/t of step i in float32 (the last step: 1, every remaining mask goes)."""
    if i == ts.numel() - 2:
        return torch.tensor(1.0, dtype=torch.float32)
    return 1 - ts[i + 1] / ts[i]


def transfer_count(n_masked: int, ts: torch.Tensor, i: int) -> int:
    """Tokens committed at step i by the confidence algs: int(n * (1 - s/t)) in float32, all at the end."""
    if i == ts.numel() - 2:
        return n_masked
    return int(torch.tensor(n_masked, dtype=torch.float32) * transfer_fraction(ts, i))


def dream_schedule(n_masked: int, steps: int, eps: float) -> list[int]:
    """The time grid's per-step counts over `n_masked` masks (they sum to n_masked)."""
    ts, left, out = timesteps(steps, eps), n_masked, []
    for i in range(steps):
        out.append(transfer_count(left, ts, i))
        left -= out[-1]
    return out


def origin_moves(n_masked: int, ts: torch.Tensor, i: int, gen: torch.Generator) -> torch.Tensor:
    """`origin` at step i: position j moves iff u_j < 1 - s/t, float64 u_j from `gen` -> bool [n] on the CPU."""
    u = torch.rand(n_masked, dtype=torch.float64, generator=gen, device=gen.device)
    return (u < float(transfer_fraction(ts, i))).cpu()


def filter_logits(logits: torch.Tensor, top_p: float | None, top_k: int | None) -> torch.Tensor:
    """Dream's nucleus then top-k filter: removed entries become the dtype's minimum."""
    low = torch.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = torch.zeros_like(cum, dtype=torch.bool)
        drop[..., 1:] = cum[..., :-1] > top_p          # keep up to and including the crossing token
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), low)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[..., -1:]
        logits = logits.masked_fill(logits < kth, low)
    return logits


def token_probs(logits: torch.Tensor, p) -> torch.Tensor:
    """softmax(filter(logits / T)) in the logits' dtype (`p`: temperature, top_p, top_k; T = 0: no division)."""
    if p.temperature > 0:
        logits = logits / p.temperature
    return torch.softmax(filter_logits(logits, p.top_p, p.top_k), dim=-1)


def propose(probs: torch.Tensor, temperature: float, gen: torch.Generator, mask_id: int) -> torch.Tensor:
    """x0 per row, never the mask id: argmax at T = 0, else the exponential race argmax p / (-log U), U from `gen`."""
    if temperature == 0 or probs.shape[0] == 0:
        return proposal_argmax(probs, mask_id)
    return proposal_argmax(probs.to(torch.float64) / gumbel_noise(probs.shape, 1.0, gen, probs.device), mask_id)


def alg_confidence(probs: torch.Tensor, x0: torch.Tensor, alg: str) -> torch.Tensor:
    """maskgit_plus and origin: p(x0); topk_margin: top1 - top2; entropy: Σ p log(p + 1e-10)."""
    if alg in ("maskgit_plus", "origin"):
        return probs.gather(-1, x0[:, None])[:, 0]
    if alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        return top2[:, 0] - top2[:, 1]
    if alg == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    raise ValueError(f"no confidence for alg {alg!r}")


def dream_rows(logits: torch.Tensor, p, gen: torch.Generator | None, mask_id: int, entropy: bool = False) -> tuple:
    """Dream's proposals for rows of clean logits -> (x0, its alg's score, the entropy or None), >= float32."""
    dt = torch.promote_types(logits.dtype, torch.float32)
    probs = token_probs(logits, p)
    x0 = propose(probs, p.temperature, gen, mask_id)
    ent = -torch.special.xlogy(probs, probs).sum(-1, dtype=dt) if entropy else None
    return x0, alg_confidence(probs, x0, p.remasking).to(dt), ent


def gumbel_topk_keys(conf: torch.Tensor, alg_temp: float, gen: torch.Generator) -> torch.Tensor:
    """conf / alg_temp - log(-log U): the top k are k draws without replacement from softmax(conf / alg_temp)."""
    u = torch.rand(conf.shape, dtype=torch.float64, generator=gen, device=gen.device).to(conf.device)
    return conf.to(torch.float64) / alg_temp - torch.log(-torch.log(u))


def rescored(conf: torch.Tensor, a: int, n: int, p, k: int, gens: RequestGenerators) -> torch.Tensor | None:
    """What conf[a : a + n] is ranked by instead (None: unchanged): `random`'s uniforms, or alg_temp's keys."""
    if p.remasking == "random":
        return random_confidence(n, gens.remask).to(conf)
    if p.alg_temp and k > 0:
        return gumbel_topk_keys(conf[a : a + n], p.alg_temp, gens.remask).to(conf)
    return None
