"""Sparse KV token selection, head-centric (dLLM-Serve) or uniform (Sparse-dLLM) (docs/MECHANISMS.md)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def score_context(q_block: torch.Tensor, k_ctx: torch.Tensor, selection: str, query: str = "mean",
                  q_len: torch.Tensor | None = None, head_mean=None) -> torch.Tensor:
    """q_block [G, Lb, Hq, D], k_ctx [G, Hkv, Lc, D] -> scores [G, Hkv or 1, Lc] (docs/ACCURACY.md)."""
    G, lb, hq, d = q_block.shape
    hkv = k_ctx.shape[1]
    pad = None if q_len is None else torch.arange(lb, device=q_block.device)[None] >= q_len[:, None]
    if query == "mean":
        if pad is None:
            q_mean = q_block.mean(1)
        else:
            q_mean = q_block.masked_fill(pad[:, :, None, None], 0).sum(1) / q_len[:, None, None].to(q_block.dtype)
        s = torch.einsum("nhgd,nhld->nhgl", q_mean.view(G, hkv, -1, d), k_ctx)       # [G, Hkv, g, Lc]
    else:
        q = q_block.view(G, lb, hkv, -1, d)
        s = torch.einsum("nbhgd,nhld->nhgbl", q, k_ctx)                               # [G, Hkv, g, Lb, Lc]
        if pad is not None:
            s = s.masked_fill(pad[:, None, None, :, None], -torch.inf)
        s = s.flatten(2, 3)                                                           # [G, Hkv, g*Lb, Lc]
    if selection == "head":
        return s.amax(2) / math.sqrt(d)                        # max over the query group (GQA)
    if query == "max":
        s = s.amax(2, keepdim=True)                            # each KV head's best query first
    return (s.mean((1, 2)) if head_mean is None else head_mean(s))[:, None]


def select_many(q_block, k_ctx, groups: list, kmax: int, selection: str, window: int, query: str = "mean",
                q_len: torch.Tensor | None = None, ctx_len: torch.Tensor | None = None, head_mean=None) -> torch.Tensor:
    """Kept context indices of G members padded to one shape -> [G, Hkv, kmax] (`groups`: one top-k each)."""
    s = score_context(q_block, k_ctx, selection, query, q_len, head_mean)
    G, hkv, lc = s.shape[0], k_ctx.shape[1], s.shape[-1]
    if ctx_len is not None:
        pad = torch.arange(lc, device=s.device)[None] >= ctx_len[:, None]
        s = s.masked_fill(pad[:, None], -torch.inf)
    if window > 1:                              # -inf padding at the end never wins a window
        s = F.max_pool1d(s.reshape(-1, 1, lc), window, stride=1, padding=window // 2).view(s.shape)
    if len(groups) == 1 and groups[0][2] is None:
        c, n, _ = groups[0]
        return torch.topk(s[..., :c], n, dim=-1).indices.sort(-1).values.expand(G, hkv, n)
    out = torch.zeros(G, hkv, kmax, dtype=torch.long, device=s.device)
    for c, n, m in groups:
        out[m, :, :n] = torch.topk(s[m, :, :c], n, dim=-1).indices.sort(-1).values.expand(m.numel(), hkv, n)
    return out


def pack(t_ctx: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t_ctx [..., Hkv, Lc, D] gathered per head at idx [..., Hkv, k] -> dense [..., Hkv, k, D]."""
    return t_ctx.gather(-2, idx[..., None].expand(*idx.shape, t_ctx.shape[-1]))
