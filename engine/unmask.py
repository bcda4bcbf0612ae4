"""LLaDA's unmasking rule: the linear per-block transfer schedule, Gumbel-max sampling at
temperature T with float64 noise, low-confidence / random remasking.

Randomness contract (the engine, the reference sampler and the baselines): each request owns two
generators seeded from `SamplingParams.seed`; every step it draws Gumbel noise (only at T > 0)
for its candidate rows — the still-masked positions of its current block, in order — and, for
random remasking, one uniform per candidate row. LLaDA draws noise for the whole [L, V] canvas,
but only candidate rows can be committed, so no distribution changes. Consecutive CPU draws
equal one large draw, so splitting rows across logit chunks changes no token. On CUDA the
generators live on the device (no [rows x V] host copy), whose draws depend on their split:
sampled tokens there are reproducible for a fixed chunking. Greedy and CPU float64 unaffected.
"""
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
    """argmax over the last dim with the mask id's column excluded: the proposal x0 of every
    decoder here (engine, reference, baselines). Deviation from LLaDA's generate.py, whose argmax
    runs over the whole vocabulary: a random-weight model can propose the mask id there, the
    "committed" position stays masked and upstream re-offers it in later blocks while block-wise
    decoders never look back, so their tokens diverge. Trained checkpoints never propose it (SFT
    never has it as a target), so real weights decode as upstream. Only the argmax changes:
    confidence stays the full-softmax probability of x0.

    `scores` is written in place (one column set to -inf, then restored bit for bit), so there is
    no [R, V] copy; it must be a writable tensor nobody reads concurrently."""
    col = scores[..., mask_id].clone()
    scores[..., mask_id] = -torch.inf
    x0 = scores.argmax(-1)
    scores[..., mask_id] = col
    return x0


def gumbel_argmax(logits: torch.Tensor, temperature: float, gen: torch.Generator | None, mask_id: int) -> torch.Tensor:
    """Proposal: argmax of exp(l) / (-log U)^T with U ~ U(0,1) in float64 (LLaDA's
    add_gumbel_noise), the mask id excluded (`proposal_argmax`)."""
    if temperature == 0:
        return proposal_argmax(logits, mask_id)
    return proposal_argmax(gumbel_scores(logits, gumbel_noise(logits.shape, temperature, gen, logits.device)), mask_id)


def gumbel_noise(shape, temperature: float, gen: torch.Generator | None, device) -> torch.Tensor:
    """(−log U)^T, U ~ U(0,1) in float64, `shape` drawn from the request's generator. A
    vocabulary-parallel rank draws a whole row's noise and keeps its columns
    (`engine.parallel.vocab_decode`): the same draws as one device's."""
    # In place where possible: at LLaDA's vocabulary these are the largest transients of a step.
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
    """softmax(logits)[x0] from the *clean* logits, as 1 / Σ exp(l − l[x0]) (the log-sum-exp
    shifted by the proposal's own logit): no [R, V] probability tensor. The shifted logits and
    their exp stay in the logits' dtype (in the logits themselves when `inplace`: the caller's
    chunk is consumed) and the sum accumulates in `dtype`, None = at least float32. So a bf16
    chunk is read three times and written twice in bf16, never copied to float32 (a bf16
    softmax's own output would tie too often; bf16 terms summed in float32 do not), and float32 /
    float64 logits give exactly the values a copy in their dtype gave."""
    dt = dtype or torch.promote_types(logits.dtype, torch.float32)
    sel = logits.gather(-1, x0[:, None])
    shifted = logits.sub_(sel) if inplace else logits - sel
    return shifted.exp_().sum(-1, dtype=dt).reciprocal_()


def entropy_of(logits: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The predictive entropy −Σ p log p of every row of clean logits (at least float32), for
    the entropy-bounded decoding policy (engine.decoding)."""
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
