"""The oracle for Dream: its sampler `diffusion_generate` (Dream-org/Dream-v0-Instruct-7B
generation_utils.py, `_sample`; copies: NVlabs/Fast-dLLM dream/model/generation_utils.py) in plain code.

One sequence, a full forward per step, no blocks; reasons and the RNG contract: docs/DREAM_SAMPLER.md.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.unmask import RequestGenerators, gumbel_noise, proposal_argmax, select_transfer

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
LogitsFn = Callable[[torch.Tensor], torch.Tensor]   # canvas [L] -> [L, V], row p predicts token p


@dataclass(frozen=True)
class DreamSampling:
    """The arguments of Dream's `diffusion_generate` (upstream defaults where it has them)."""
    gen_length: int = 128
    steps: int = 128
    eps: float = 1e-3
    alg: str = "origin"
    alg_temp: float | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("gen_length", "steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must be in (0, 1), got {self.eps!r}")
        if self.alg not in ALGS:
            raise ValueError(f"alg must be one of {ALGS}, got {self.alg!r}")
        if self.alg_temp is not None and self.alg_temp < 0:
            raise ValueError(f"alg_temp must be >= 0, got {self.alg_temp!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be a positive integer, got {self.top_k!r}")


def timesteps(steps: int, eps: float) -> torch.Tensor:
    """Upstream's float32 time grid linspace(1, eps, steps + 1), computed on the CPU."""
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


def dream_schedule(gen_length: int, steps: int, eps: float) -> list[int]:
    """The per-step counts of the confidence algs over a fresh canvas (they sum to gen_length)."""
    ts, left, out = timesteps(steps, eps), gen_length, []
    for i in range(steps):
        k = transfer_count(left, ts, i)
        out.append(k)
        left -= k
    return out


def filter_logits(logits: torch.Tensor, top_p: float | None, top_k: int | None) -> torch.Tensor:
    """Upstream's nucleus then top-k filter: removed entries become the dtype's minimum."""
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


def token_probs(logits: torch.Tensor, p: DreamSampling) -> torch.Tensor:
    """softmax(filter(logits / T)) in the logits' dtype; T = 0 divides by nothing."""
    if p.temperature > 0:
        logits = logits / p.temperature
    return torch.softmax(filter_logits(logits, p.top_p, p.top_k), dim=-1)


def propose(probs: torch.Tensor, temperature: float, gen: torch.Generator, mask_id: int) -> torch.Tensor:
    """x0 per row, never the mask id: argmax at T = 0, else a draw from `probs` by the exponential race
    argmax p / E, E = -log U with float64 U from `gen` (one [rows, V] draw)."""
    if temperature == 0 or probs.shape[0] == 0:
        return proposal_argmax(probs, mask_id)
    noise = gumbel_noise(probs.shape, 1.0, gen, probs.device)
    return proposal_argmax(probs.to(torch.float64) / noise, mask_id)


def confidence(probs: torch.Tensor, x0: torch.Tensor, alg: str) -> torch.Tensor:
    """maskgit_plus: p(x0); topk_margin: top1 - top2; entropy: sum p log(p + 1e-10) (minus the entropy)."""
    if alg == "maskgit_plus":
        return probs.gather(-1, x0[:, None])[:, 0]
    if alg == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        return top2[:, 0] - top2[:, 1]
    if alg == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    raise ValueError(f"no confidence for alg {alg!r}")


def choose_positions(conf: torch.Tensor, k: int, alg_temp: float | None, gen: torch.Generator) -> torch.Tensor:
    """Indices of the k rows to commit: top-k of conf, or (alg_temp > 0) k draws without replacement
    from softmax(conf / alg_temp) as the Gumbel top-k of conf / alg_temp (float64 U from `gen`)."""
    if not alg_temp or k <= 0:
        return select_transfer(conf, k)
    u = torch.rand(conf.shape, dtype=torch.float64, generator=gen, device=gen.device).to(conf.device)
    keys = conf.to(torch.float64) / alg_temp - torch.log(-torch.log(u))
    return torch.topk(keys, k).indices


def dense_logits(model) -> LogitsFn:
    """The seam's model as a logits function: forward(ids [1, L])[0] (the shift already applied)."""
    return lambda x: model(x[None])[0]


@torch.no_grad()
def reference_generate(logits_fn: LogitsFn, prompt_ids: list[int], params: DreamSampling,
                       mask_id: int) -> tuple[list[int], int]:
    """Returns (generated token ids, number of forward evaluations = steps)."""
    if not prompt_ids or mask_id in prompt_ids:
        raise ValueError("prompt must be non-empty and must not contain the mask token")
    P = len(prompt_ids)
    x = torch.tensor(list(prompt_ids) + [mask_id] * params.gen_length)
    gens = RequestGenerators(params.seed)
    ts = timesteps(params.steps, params.eps)
    for i in range(params.steps):
        logits = logits_fn(x)
        x = x.to(logits.device)
        masked = torch.nonzero(x == mask_id).squeeze(-1)
        rows = logits[masked]
        if params.alg == "origin":
            # Each masked position moves with probability 1 - s/t: one float64 uniform per masked
            # position from the remask stream, then tokens drawn only for the moving rows.
            u = torch.rand(masked.numel(), dtype=torch.float64, generator=gens.remask, device=gens.remask.device)
            move = (u < float(transfer_fraction(ts, i))).to(x.device)
            x0 = propose(token_probs(rows[move], params), params.temperature, gens.gumbel, mask_id)
            x[masked[move]] = x0
            continue
        probs = token_probs(rows, params)
        x0 = propose(probs, params.temperature, gens.gumbel, mask_id)
        conf = confidence(probs, x0, params.alg)
        chosen = choose_positions(conf, transfer_count(masked.numel(), ts, i), params.alg_temp, gens.remask)
        x[masked[chosen]] = x0[chosen]
    return x[P:].tolist(), params.steps
