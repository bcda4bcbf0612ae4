"""The kit every baseline policy builds on: a padded [B, T] per-layer forward over the model's
block submodules (`project`, `attend`, `residual`, `full_forward`) and the token decision
(`decide`) with each upstream's dtype choices as arguments.

Token decision vs upstream: the confidence softmax runs over the whole logits tensor the
upstream sampler runs it over (so the activation peak is upstream's), but Gumbel noise and
random-remasking draws come from the request's own generators, for its candidate rows only
(the randomness contract of `engine.unmask`). Upstream draws one [B, L, V] noise tensor per
forward from the global RNG: same distribution, different stream, and a smaller T > 0
activation peak here. The top-k runs over the candidates instead of a whole row with -inf
elsewhere: same choice. The proposal x0 is never the mask id (`engine.unmask.proposal_argmax`,
a deliberate deviation from upstream that only random-weight models can notice). Confidence is
upstream's softmax-then-gather (`baselines.reference_llada` uses the equivalent exp(l - logsumexp),
which can differ in the last bit; tokens match in the tests).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from baselines.static_batch import Batch
from engine.attention import sdpa
from engine.models import DenseBlock, DenseLM
from engine.regions import DECODE, LM_HEAD, region
from engine.request import Request
from engine.unmask import gumbel_argmax, proposal_argmax, random_confidence


def project(block: DenseBlock, h: torch.Tensor, pos: torch.Tensor, rope):
    """h [B, T, d], pos [B, T] -> RoPE'd q [B, T, Hq, D], RoPE'd k and v [B, T, Hkv, D]."""
    B, T, _ = h.shape
    q, k, v = block.qkv(h.reshape(B * T, -1), pos.reshape(-1), rope)
    return q.view(B, T, *q.shape[1:]), k.view(B, T, *k.shape[1:]), v.view(B, T, *v.shape[1:])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Bidirectional attention of q [B, Tq, Hq, D] over k, v [B, Tk, Hkv, D] -> [B, Tq, Hq*D].
    key_mask [B, Tk] (True = real key) hides padding; None = no mask, upstream's path."""
    m = None if key_mask is None else key_mask[:, None, None, :]
    o = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), m)
    return o.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)


def residual(block: DenseBlock, h, q, k, v, key_mask) -> torch.Tensor:
    """The rest of a llama block once q/k/v are known: attention delta, then MLP delta."""
    h = h + block.attn_out(attend(q, k, v, key_mask))
    return h + block.mlp(h)


@region(LM_HEAD)
def logits_of(model: DenseLM, h: torch.Tensor) -> torch.Tensor:
    """Logits of the rows h [B, T, d] computed, with the family's shift over exactly those rows, as
    each upstream applies Dream's cat([l[:, :1], l[:, :-1]]) to whatever its forward returned: row j
    from hidden j - shift, row 0 from its own (in a window starting at block_start that row is
    wrong, and every Dream baseline commits block_start before it reads a window: docs/DREAM_BASELINES.md)."""
    logits = model.lm_head(model.final_norm(h))
    s = model.config.shift
    return torch.cat([logits[:, :s], logits[:, : logits.shape[1] - s]], dim=1) if s else logits


def full_forward(model: DenseLM, x: torch.Tensor, pos: torch.Tensor, key_mask, on_layer=None) -> torch.Tensor:
    """Plain forward of the padded canvas [B, L] -> logits [B, L, V], row p predicting token p (the
    shift applied; a left-padded row's first real row is never read). `on_layer(i, q, k, v)` sees
    each layer's RoPE'd projections: that is where the caching policies store or select K/V."""
    h = model.embed(x)
    rope = model.rope.at(pos.reshape(-1), h.dtype)        # every layer rotates at the same positions
    for i, blk in enumerate(model.blocks):
        q, k, v = project(blk, h, pos, rope)
        if on_layer is not None:
            on_layer(i, q, k, v)
        h = residual(blk, h, q, k, v, key_mask)
    return logits_of(model, h)


def sample_exp(logits: torch.Tensor, temperature: float, gen: torch.Generator, mask_id: int) -> torch.Tensor:
    """dLLM-Cache's add_gumbel_noise + argmax: exp(l) even at T = 0 (argmax of inf ties picks the
    first), noise drawn and applied in the logits dtype; the mask id is never proposed."""
    if temperature == 0:
        return proposal_argmax(logits.exp(), mask_id)
    u = torch.rand(logits.shape, dtype=logits.dtype, generator=gen).to(logits.device)
    return proposal_argmax(logits.exp() / (-torch.log(u)) ** temperature, mask_id)


def _x0(req: Request, logits: torch.Tensor, exp_argmax: bool) -> torch.Tensor:
    if exp_argmax:
        return sample_exp(logits, req.params.temperature, req.gens.gumbel, req.mask_id)
    return gumbel_argmax(logits, req.params.temperature, req.gens.gumbel, req.mask_id)   # float64 noise


def _factor_count(sorted_conf: list[float], factor: float) -> int:
    """Fast-dLLM's factor rule (llada/generate.py, get_transfer_index_dynamic) on one row's
    confidences in descending order: walk the ranks while the i-th (from 0) reaches
    1 - factor / (i + 2), the first always; stop at the first that does not. Upstream then adds
    one when it stopped at the first or the last rank, so a failing last rank is still taken."""
    n = len(sorted_conf)
    top = n - 1
    for i in range(n):
        if i > 0 and sorted_conf[i] < 1 - factor / (i + 2):
            top = i
            break
    return top + 1 if top in (0, n - 1) else top


@region(DECODE)
def decide(batch: Batch, logits: torch.Tensor, q_start: int, conf_dtype: torch.dtype, ks: list[int] | None,
           threshold: float | None = None, exp_argmax: bool = False, factor: float | None = None) -> None:
    """Commit tokens of every row's current block. `logits` [B, Tq, V] cover canvas columns
    [q_start, q_start + Tq). Candidates: each row's still-masked block positions, position order.
    ks: tokens per row (the linear schedule), or threshold / factor: Fast-dLLM's parallel rules."""
    mask_id = batch.reqs[0].mask_id
    s, e = batch.block_range
    probs = None
    if any(r.params.remasking == "low_confidence" for r in batch.reqs):
        probs = F.softmax(logits.to(conf_dtype), dim=-1)          # whole tensor, as upstream
    for i, req in enumerate(batch.reqs):
        cand = torch.nonzero(batch.x[i, s:e] == mask_id).squeeze(-1) + s
        n = cand.numel()
        if n == 0:
            continue
        rows = cand - q_start
        x0 = _x0(req, logits[i, rows], exp_argmax)
        if req.params.remasking == "low_confidence":
            conf = probs[i, rows].gather(-1, x0[:, None]).squeeze(-1)
        else:
            conf = random_confidence(n, req.gens.remask)
        if factor is not None:
            chosen = torch.topk(conf, _factor_count(torch.sort(conf, descending=True).values.tolist(), factor)).indices
        elif threshold is None:
            chosen = torch.topk(conf, ks[i]).indices
        else:
            # Best one always; every further one only if its confidence reaches the threshold.
            order = torch.topk(conf, n).indices
            ok = conf[order] >= threshold
            ok[0] = True
            chosen = order[ok]
        batch.x[i, cand[chosen]] = x0[chosen].to(batch.x.dtype)
