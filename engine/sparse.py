"""Token selection for the sparse KV cache, and dense packing of what is kept.

Head-centric (dLLM-Serve): each KV head keeps its own top-k context tokens. Uniform
(Sparse-dLLM): scores are averaged over heads and all heads keep one shared set.
Scores come from the current block's queries (their mean, so one dot product per head and
token), smoothed by a max-pool along positions so neighbours of important tokens survive.
Kept rows are sorted by position: attention is order-free (non-causal, K carries RoPE), so
this only makes r = 1 identical across selection modes and keeps memory access sequential.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def context_index(length: int, start: int, end: int, device) -> torch.Tensor:
    """Positions outside the current block [start, end): the eviction candidates."""
    return torch.cat([torch.arange(0, start, device=device), torch.arange(end, length, device=device)])


def score_context(q_block: torch.Tensor, k_ctx: torch.Tensor, selection: str, query: str = "mean") -> torch.Tensor:
    """q_block [Lb, Hq, D], k_ctx [Hkv, Lc, D] -> scores [Hkv, Lc] (head) or [1, Lc] (uniform).

    query="mean": the block queries' mean (the upstream code) — one dot product per head and
    token, but a block that is mostly EOS padding then scores for what the padding looks at
    (docs/ACCURACY.md). query="max": the best score any block query gives the token."""
    hkv, _, d = k_ctx.shape
    if query == "mean":
        q_mean = q_block.mean(0).view(hkv, -1, d)                  # [Hkv, G, D]
        s = torch.einsum("hgd,hld->hgl", q_mean, k_ctx)            # [Hkv, G, Lc]
    else:
        q = q_block.view(q_block.shape[0], hkv, -1, d)              # [Lb, Hkv, G, D]
        s = torch.einsum("bhgd,hld->hgbl", q, k_ctx).flatten(1, 2)  # [Hkv, G*Lb, Lc]
    if selection == "head":
        return s.amax(1) / math.sqrt(d)                        # max over the query group (GQA)
    if query == "max":
        s = s.amax(1, keepdim=True)                            # each KV head's best query first
    return s.mean((0, 1))[None]                                # Sparse-dLLM: raw dot, mean over heads


def max_pool(scores: torch.Tensor, window: int) -> torch.Tensor:
    if window <= 1:
        return scores
    return F.max_pool1d(scores[:, None], window, stride=1, padding=window // 2)[:, 0]


def select(q_block, k_ctx, n_keep: int, selection: str, window: int, query: str = "mean") -> torch.Tensor:
    """Indices into the context axis, [Hkv, n_keep], sorted by position within each head."""
    s = max_pool(score_context(q_block, k_ctx, selection, query), window)
    idx = torch.topk(s, n_keep, dim=-1).indices.sort(-1).values
    return idx.expand(k_ctx.shape[0], -1)


def pack(t_ctx: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t_ctx [Hkv, Lc, D] gathered per head at idx [Hkv, k] -> dense [Hkv, k, D]."""
    return t_ctx.gather(1, idx[..., None].expand(-1, -1, t_ctx.shape[-1]))
