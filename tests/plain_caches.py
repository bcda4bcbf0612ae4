"""The cache emulations the plain baselines of both families share (tests/test_baselines.py on LLaDA,
tests/dream_plain.py on Dream): attention functions for `model.hidden_states` that freeze or mask
keys (Fast-dLLM, Sparse-dLLM), and dLLM-Cache's hook as an explicit per-layer loop."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.models import dense_attention, rms_norm


def frozen_keys():
    """Fast-dLLM's cache by full recomputation: (record, window). `record` (the block's full forward)
    keeps every layer's K/V; `window(s, hi)` attends with them, rows [s, hi) fresh (dual: the
    block; prefix: the block and everything after it)."""
    frozen: dict = {}

    def record(i, q, k, v):
        frozen[i] = (k.clone(), v.clone())
        return dense_attention(i, q, k, v)

    def window(s: int, hi: int):
        def cached(i, q, k, v):
            k2, v2 = frozen[i][0].clone(), frozen[i][1].clone()
            k2[s:hi], v2[s:hi] = k[s:hi], v[s:hi]
            return dense_attention(i, q, k2, v2)
        return cached

    return record, window


def kept_keys(model, L: int, s: int, e: int, keep_ratio: float, kernel: int | None):
    """Sparse-dLLM's cache by masking: (select, masked) for a canvas of L and the block [s, e).
    `select` (the block's step 1) keeps per layer the top int(n · keep_ratio) context tokens by
    q̄·k averaged over the query heads (keys repeated to them), max-pooled by `kernel`, one set for
    every KV head; `masked` (steps >= 2) lets every query see those keys (frozen) and the block's."""
    rep = model.config.n_heads // model.config.kv_heads
    ctx = torch.tensor([j for j in range(L) if not s <= j < e])
    kept: dict = {}

    def select(li, q, kk, vv):
        imp = torch.einsum("hd,lhd->hl", q[s:e].mean(0), kk[ctx].repeat_interleave(rep, 1)).mean(0)
        r = (kernel or 1) // 2
        pooled = torch.stack([imp[max(0, j - r): j + r + 1].max() for j in range(len(ctx))])
        allow = torch.zeros(L, dtype=torch.bool)
        allow[ctx[torch.topk(pooled, int(len(ctx) * keep_ratio)).indices]] = True
        allow[s:e] = True
        kept[li] = (kk.clone(), vv.clone(), allow)
        return dense_attention(li, q, kk, vv)

    def masked(li, q, kk, vv):
        k0, v0, allow = kept[li]
        k2, v2 = k0.clone(), v0.clone()
        k2[s:e], v2[s:e] = kk[s:e], vv[s:e]
        k2, v2 = k2.repeat_interleave(rep, 1), v2.repeat_interleave(rep, 1)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k2.transpose(0, 1), v2.transpose(0, 1),
                                           attn_mask=allow[None, None, :])
        return o.transpose(0, 1)

    return select, masked


def dllm_cache_logits(model, P: int, pi: int, gi: int, ratio: float):
    """dLLM-Cache's hook as a logits function of the canvas, called once per forward: a per-layer
    loop over explicit full-length caches {k, v, attn, mlp}; forward t recomputes only the rows the
    refresh rule (layer 0 always) and V-verify choose, then reads everything from the cache. Rows
    are the family's (shifted on Dream)."""
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
            if t == 1:                      # every layer refreshes everything at t = 1
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
        shift = model.config.shift
        return torch.cat([logits[:shift], logits[: L - shift]]) if shift else logits
    return fn
