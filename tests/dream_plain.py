"""Plain one-sequence versions of each baseline's upstream Dream code for tests/test_baselines_dream.py:
a block sampler with the block-edge rule whose caches are emulated by full recomputation through
`model.hidden_states` with an attention function that freezes or masks keys (Fast-dLLM, Sparse-dLLM),
and dLLM-Cache's Dream hook as a logits function for Dream's sampler oracle (those three emulations:
tests/plain_caches.py, shared with LLaDA's plain versions); a tiny Dream in code."""
from __future__ import annotations

import torch

from baselines.reference_dream import (
    DreamSampling,
    alg_confidence,
    choose_positions,
    propose,
    timesteps,
    token_probs,
    transfer_fraction,
)
from engine.models import build_model, config_from_dict, dense_attention
from engine.sampling import EPS, SamplingParams
from engine.unmask import RequestGenerators
from tests.plain_caches import frozen_keys, kept_keys

DREAM = {"model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 48, "num_attention_heads": 6,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 80, "vocab_size": 97,
         "rope_theta": 1e6, "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "mask_token_id": 96,
         "eos_token_id": 95, "pad_token_id": 95, "bos_token_id": 94, "tie_word_embeddings": False}
MASK = 96


def DreamParams(alg: str = "entropy", eps: float = EPS, **kw) -> SamplingParams:  # noqa: N802
    """A request with Dream's sampler arguments: one of its algs on its time grid (per block)."""
    return SamplingParams(remasking=alg, schedule="timegrid", eps=eps, **kw)


def tiny_dream(layers: int, seed: int = 0):
    torch.manual_seed(seed)
    m = build_model(config_from_dict({**DREAM, "num_hidden_layers": layers})).to(torch.float64)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)          # biases too; large weights: decisions are sensitive
    return m.eval()


def sampling(sp: DreamParams) -> DreamSampling:
    return DreamSampling(gen_length=sp.gen_length, steps=sp.steps, eps=sp.eps, alg=sp.remasking, alg_temp=sp.alg_temp,
                         temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, seed=sp.seed)


# ---------------------------------------------------------------- plain block sampler (one sequence)
class Plain:
    """Canvas, full recomputation with an attention function, Dream's whole-canvas shift, commits."""

    def __init__(self, model, p, sp: DreamParams):
        self.m, self.sp, self.dp, self.P = model, sp, sampling(sp), len(p)
        self.x = torch.tensor(p + [MASK] * sp.gen_length)
        self.L = self.x.numel()
        self.gens = RequestGenerators(sp.seed)
        self.nfe = 0

    def forward(self, attn=dense_attention):
        self.nfe += 1
        logits = self.m.lm_head(self.m.hidden_states(self.x, torch.arange(self.L), attn))
        return torch.cat([logits[:1], logits[:-1]])       # row p from the hidden at p - 1

    def first(self, logits, s):
        """The block-edge rule: block_start alone, from its full-canvas row."""
        self.x[s] = propose(token_probs(logits[s][None], self.dp), self.dp.temperature, self.gens.gumbel, MASK)[0]

    def grid(self, logits, s, e, i, alg):
        cand = torch.tensor([j for j in range(s, e) if self.x[j] == MASK], dtype=torch.long)
        if cand.numel() == 0:
            return
        probs = token_probs(logits[cand], self.dp)
        x0 = propose(probs, self.dp.temperature, self.gens.gumbel, MASK)
        k = int(cand.numel() * transfer_fraction(timesteps(self.sp.steps_per_block, self.dp.eps), i))
        chosen = choose_positions(alg_confidence(probs, x0, alg), k, self.dp.alg_temp, self.gens.remask)
        self.x[cand[chosen]] = x0[chosen]

    def threshold(self, logits, s, e, thr):
        cand = [j for j in range(s, e) if self.x[j] == MASK]
        probs = token_probs(logits[cand], self.dp)
        x0 = propose(probs, self.dp.temperature, self.gens.gumbel, MASK)
        conf = probs.gather(-1, x0[:, None])[:, 0]
        for rank, j in enumerate(torch.argsort(conf, descending=True, stable=True).tolist()):
            if rank == 0 or conf[j] >= thr:
                self.x[cand[j]] = x0[j]

    def blocks(self):
        for b in range(self.sp.num_blocks):
            s = self.P + b * self.sp.block_length
            yield s, s + self.sp.block_length

    def masked(self, s, e):
        return bool((self.x[s:e] == MASK).any())

    def out(self):
        return self.x[self.P:].tolist(), self.nfe


def plain_fast(model, p, sp, cache="dual", threshold=None, no_cache=False):
    """Fast-dLLM's Dream _sample (generation_utils_block.py): a full forward freezes every key and
    commits block_start; then windows (dual: the block fresh; prefix: the block and all after it)
    while the block has a mask: Dream's grid from i = 1 with negative entropy (at most S - 1), or
    the threshold rule. `no_cache`: every forward fresh (the same sampler without a cache)."""
    s_ = Plain(model, p, sp)
    S = sp.steps_per_block
    for s, e in s_.blocks():
        record, window = frozen_keys()
        s_.first(s_.forward(record), s)
        cached = window(s, e if cache == "dual" else s_.L)
        i = 1
        while s_.masked(s, e) and (threshold is not None or i < S):
            logits = s_.forward(dense_attention if no_cache else cached)
            if threshold is None:
                s_.grid(logits, s, e, i, "entropy")
            else:
                s_.threshold(logits, s, e, threshold)
            i += 1
    return s_.out()


def plain_sparse(model, p, sp, keep_ratio, kernel):
    """Sparse-dLLM's Dream _sample: S forwards per block; i = 0 full, block_start only; i = 1 full,
    each layer keeps the top int(n * keep_ratio) context tokens (mean over all query heads of
    q̄·k, max-pooled) for every KV head; i >= 2 the block attends to kept + itself. Request's alg."""
    s_ = Plain(model, p, sp)
    for s, e in s_.blocks():
        select, masked = kept_keys(model, s_.L, s, e, keep_ratio, kernel)
        for i in range(sp.steps_per_block):
            if i == 0:
                s_.first(s_.forward(), s)
            else:
                s_.grid(s_.forward(select if i == 1 else masked), s, e, i, sp.remasking)
    return s_.out()
