"""Plain one-sequence versions of each baseline's upstream Dream code for tests/test_baselines_dream.py:
a block sampler with the block-edge rule whose caches are emulated by full recomputation through
`model.hidden_states` with an attention function that freezes or masks keys (Fast-dLLM, Sparse-dLLM),
and dLLM-Cache's Dream hook as a logits function for Dream's sampler oracle; a tiny Dream in code."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from baselines.reference_dream import (
    DreamSampling,
    alg_confidence,
    choose_positions,
    propose,
    timesteps,
    token_probs,
    transfer_count,
)
from engine.models import build_model, config_from_dict, dense_attention, rms_norm
from engine.sampling import EPS, SamplingParams
from engine.unmask import RequestGenerators

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
        k = transfer_count(cand.numel(), timesteps(self.sp.steps_per_block, self.dp.eps), i)
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
        frozen = {}

        def record(i, q, k, v, frozen=frozen):
            frozen[i] = (k.clone(), v.clone())
            return dense_attention(i, q, k, v)

        s_.first(s_.forward(record), s)
        hi = e if cache == "dual" else s_.L

        def cached(i, q, k, v, frozen=frozen, s=s, hi=hi):
            k2, v2 = frozen[i][0].clone(), frozen[i][1].clone()
            k2[s:hi], v2[s:hi] = k[s:hi], v[s:hi]
            return dense_attention(i, q, k2, v2)

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
    rep = model.config.n_heads // model.config.kv_heads
    for s, e in s_.blocks():
        ctx = torch.tensor([j for j in range(s_.L) if not s <= j < e])
        kept = {}
        for i in range(sp.steps_per_block):
            if i == 0:
                s_.first(s_.forward(), s)
                continue
            if i == 1:
                def select(li, q, kk, vv, s=s, e=e, ctx=ctx, kept=kept):
                    imp = torch.einsum("hd,lhd->hl", q[s:e].mean(0), kk[ctx].repeat_interleave(rep, 1)).mean(0)
                    r = (kernel or 1) // 2
                    pooled = torch.stack([imp[max(0, j - r): j + r + 1].max() for j in range(len(ctx))])
                    allow = torch.zeros(s_.L, dtype=torch.bool)
                    allow[ctx[torch.topk(pooled, int(len(ctx) * keep_ratio)).indices]] = True
                    allow[s:e] = True
                    kept[li] = (kk.clone(), vv.clone(), allow)
                    return dense_attention(li, q, kk, vv)
                logits = s_.forward(select)
            else:
                def masked(li, q, kk, vv, s=s, e=e, kept=kept):
                    k0, v0, allow = kept[li]
                    k2, v2 = k0.clone(), v0.clone()
                    k2[s:e], v2[s:e] = kk[s:e], vv[s:e]
                    k2, v2 = k2.repeat_interleave(rep, 1), v2.repeat_interleave(rep, 1)
                    o = F.scaled_dot_product_attention(q.transpose(0, 1), k2.transpose(0, 1), v2.transpose(0, 1),
                                                       attn_mask=allow[None, None, :])
                    return o.transpose(0, 1)
                logits = s_.forward(masked)
            s_.grid(logits, s, e, i, sp.remasking)
    return s_.out()


def dllm_cache_logits(model, P, pi, gi, ratio):
    """dLLM-Cache's Dream hook as a logits function for Dream's sampler: a per-layer loop over
    explicit full-length caches {k, v, attn, mlp}; forward t recomputes only the rows the refresh
    rule (layer 0 always) and V-verify choose, then reads everything from the cache; shifted rows."""
    caches = [dict() for _ in model.blocks]
    state = dict(t=0)

    def fn(x):
        state["t"] += 1
        t, L = state["t"], x.numel()
        gen, allrows = torch.arange(P, L), torch.arange(L)
        h = model.embed(x)
        for li, blk in enumerate(model.blocks):
            c = caches[li]
            rp, rg = (t - 1) % pi == 0 or li == 0, (t - 1) % gi == 0 or li == 0
            nrm = rms_norm(h, blk.attn_norm.weight, blk.eps)
            if rp and rg:
                rq = rk = rv = rm = allrows
            elif rg:
                rq = rk = rv = rm = gen
            else:
                rq = rk = rv = rm = torch.arange(P) if rp else torch.arange(0)
                if 0 < ratio <= 1:
                    sim = F.cosine_similarity(blk.v_proj(nrm[gen]), c["v"][gen].reshape(len(gen), -1), dim=-1)
                    idx = P + torch.topk(sim, int(len(gen) * ratio), largest=False).indices
                    rq = rk = rm = torch.cat([rq, idx])
                    rv = torch.cat([rv, gen])
            if t == 1:
                kv = torch.zeros(L, blk.n_kv, blk.head_dim, dtype=h.dtype)
                c.update(k=kv, v=kv.clone(), attn=torch.zeros_like(h), mlp=torch.zeros_like(h))
            if len(rq):
                def proj(lin, rows, H, nrm=nrm, D=blk.head_dim):
                    return lin(nrm[rows]).view(len(rows), H, D)
                c["k"][rk] = model.rope(proj(blk.k_proj, rk, blk.n_kv), rk)
                c["v"][rv] = proj(blk.v_proj, rv, blk.n_kv)
                q = model.rope(proj(blk.q_proj, rq, blk.n_heads), rq)
                c["attn"][rq] = blk.attn_out(dense_attention(li, q, c["k"], c["v"]).reshape(len(rq), -1))
            h = h + c["attn"]
            if len(rm):
                c["mlp"][rm] = blk.mlp(h[rm])
            h = h + c["mlp"]
        logits = model.lm_head(model.final_norm(h))
        return torch.cat([logits[:1], logits[:-1]])
    return fn
