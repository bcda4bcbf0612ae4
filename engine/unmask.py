"""The unmasking rules of LLaDA (docs/CONTRACTS.md) and Dream (docs/DREAM_SAMPLER.md): schedules, proposals, scores."""
import torch


def transfer_schedule(n_masked: int, steps: int) -> list[int]:
    return [n_masked // steps + (i < n_masked % steps) for i in range(steps)]


class RequestGenerators:
    def __init__(self, seed: int, device: torch.device | str = "cpu"):
        dev = torch.device(device) if torch.device(device).type == "cuda" else torch.device("cpu")
        self.gumbel = torch.Generator(device=dev).manual_seed(int(seed))
        self.remask = torch.Generator(device=dev).manual_seed(int(seed) ^ 0x5DEECE66D)


def proposal_argmax(scores: torch.Tensor, mask_id: int) -> torch.Tensor:
    col = scores[..., mask_id].clone()
    scores[..., mask_id] = -torch.inf
    x0 = scores.argmax(-1)
    scores[..., mask_id] = col
    return x0


def gumbel_argmax(logits: torch.Tensor, temperature: float, gen: torch.Generator | None, mask_id: int) -> torch.Tensor:
    """Proposal: argmax of exp(l) / (-log U)^T, U ~ U(0,1) in float64 (LLaDA's add_gumbel_noise)."""
    noise = None if temperature == 0 else gumbel_noise(logits.shape, temperature, gen, logits.device)
    return proposal_argmax(logits if noise is None else gumbel_scores(logits, noise), mask_id)


def gumbel_noise(shape, temperature: float, gen: torch.Generator | None, device) -> torch.Tensor:
    u = torch.rand(shape, dtype=torch.float64, generator=gen, device="cpu" if gen is None else gen.device)
    u = u.to(device).log_().neg_()
    return u if temperature == 1 else u.pow_(temperature)


def gumbel_scores(logits: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    return logits.to(torch.float64, copy=True).exp_().div_(noise)


def confidence_at(logits: torch.Tensor, x0: torch.Tensor, dtype=None, inplace=False) -> torch.Tensor:
    """softmax(logits)[x0] as 1 / Σ exp(l − l[x0]) (in place when `inplace`), summed in `dtype`."""
    dt = dtype or torch.promote_types(logits.dtype, torch.float32)
    sel = logits.gather(-1, x0[:, None])
    shifted = logits.sub_(sel) if inplace else logits - sel
    return shifted.exp_().sum(-1, dtype=dt).reciprocal_()


def random_confidence(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(n, dtype=torch.float64, generator=gen, device=gen.device)


def timesteps(steps: int, eps: float) -> torch.Tensor:
    return torch.linspace(1, eps, steps + 1, dtype=torch.float32)


def transfer_fraction(ts: torch.Tensor, i: int) -> torch.Tensor:
    return torch.tensor(1.0, dtype=torch.float32) if i == ts.numel() - 2 else 1 - ts[i + 1] / ts[i]


def dream_schedule(n_masked: int, steps: int, eps: float) -> list[int]:
    """The time grid's per-step counts over `n_masked` masks: int(left * (1 - s/t)) in float32 each."""
    ts, left, out = timesteps(steps, eps), n_masked, []
    for i in range(steps):
        out.append(int(left * transfer_fraction(ts, i)))
        left -= out[-1]
    return out


def origin_moves(n_masked: int, ts: torch.Tensor, i: int, gen: torch.Generator) -> torch.Tensor:
    """`origin` at step i: position j moves iff u_j < 1 - s/t -> bool [n] on the CPU."""
    return (random_confidence(n_masked, gen) < float(transfer_fraction(ts, i))).cpu()


def token_probs(logits: torch.Tensor, p) -> torch.Tensor:
    """softmax(top_k(top_p(logits / T))) in the logits' dtype (T = 0: no division); filtered: the dtype's min."""
    logits = logits / p.temperature if p.temperature > 0 else logits
    low = torch.finfo(logits.dtype).min
    if p.top_p is not None and p.top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = torch.cat((torch.zeros_like(cum[..., :1], dtype=torch.bool), cum[..., :-1] > p.top_p), -1)
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), low)
    if p.top_k is not None:
        kth = torch.topk(logits, min(p.top_k, logits.size(-1))).values[..., -1:]
        logits = logits.masked_fill(logits < kth, low)
    return torch.softmax(logits, dim=-1)


def propose(probs: torch.Tensor, temperature: float, gen: torch.Generator, mask_id: int) -> torch.Tensor:
    """x0 per row, never the mask id: argmax at T = 0, else the exponential race argmax p / (-log U)."""
    if temperature == 0 or probs.shape[0] == 0:
        return proposal_argmax(probs, mask_id)
    return proposal_argmax(probs.to(torch.float64) / gumbel_noise(probs.shape, 1.0, gen, probs.device), mask_id)


def alg_confidence(probs: torch.Tensor, x0: torch.Tensor, alg: str) -> torch.Tensor:
    if alg in ("maskgit_plus", "origin"):
        return probs.gather(-1, x0[:, None])[:, 0]
    if alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        return top2[:, 0] - top2[:, 1]
    return (probs * torch.log(probs + 1e-10)).sum(-1)


def dream_rows(logits: torch.Tensor, p, gen: torch.Generator | None, mask_id: int, entropy: bool = False) -> tuple:
    """Dream's proposals for rows of clean logits -> (x0, its alg's score, the entropy or None), >= float32."""
    dt = torch.promote_types(logits.dtype, torch.float32)
    probs = token_probs(logits, p)
    x0 = propose(probs, p.temperature, gen, mask_id)
    ent = -torch.special.xlogy(probs, probs).sum(-1, dtype=dt) if entropy else None
    return x0, alg_confidence(probs, x0, p.remasking).to(dt), ent


def gumbel_topk_keys(conf: torch.Tensor, alg_temp: float, gen: torch.Generator) -> torch.Tensor:
    """conf / alg_temp - log(-log U): the top k are k draws without replacement from softmax(conf / alg_temp)."""
    return conf.to(torch.float64) / alg_temp - random_confidence(len(conf), gen).to(conf.device).log_().neg_().log_()


def rescored(conf: torch.Tensor, a: int, n: int, p, k: int, gens: RequestGenerators) -> torch.Tensor | None:
    """What conf[a : a + n] is ranked by instead (None: unchanged): `random`'s uniforms, or alg_temp's keys."""
    if p.remasking == "random":
        return random_confidence(n, gens.remask).to(conf)
    if p.alg_temp and k > 0:
        return gumbel_topk_keys(conf[a : a + n], p.alg_temp, gens.remask).to(conf)
    return None
