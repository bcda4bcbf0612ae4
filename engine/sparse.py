"""Sparse KV token selection, head-centric (dLLM-Serve) or uniform (Sparse-dLLM) (docs/MECHANISMS.md)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def select_many(q_block, k_ctx, groups: list, kmax: int, selection: str, window: int, query: str = "mean",
                q_len: torch.Tensor | None = None, ctx_len: torch.Tensor | None = None, head_mean=None) -> torch.Tensor:
    """q_block [G, Lb, Hq, D], k_ctx [G, Hkv, Lc, D] -> kept indices [G, Hkv, kmax], one top-k per group."""
    G, lb, hq, d = q_block.shape
    hkv, lc = k_ctx.shape[1], k_ctx.shape[2]
    pad = None if q_len is None else torch.arange(lb, device=q_block.device)[None] >= q_len[:, None]
    if query == "mean":
        q_mean = (q_block.mean(1) if pad is None
                  else q_block.masked_fill(pad[:, :, None, None], 0).sum(1) / q_len[:, None, None].to(q_block.dtype))
        s = torch.einsum("nhgd,nhld->nhgl", q_mean.view(G, hkv, -1, d), k_ctx)
    else:
        s = torch.einsum("nbhgd,nhld->nhgbl", q_block.view(G, lb, hkv, -1, d), k_ctx)
        if pad is not None:
            s = s.masked_fill(pad[:, None, None, :, None], -torch.inf)
        s = s.flatten(2, 3)
    if selection == "head":
        s = s.amax(2) / math.sqrt(d)                           # max over the query group (GQA)
    else:
        s = s.amax(2, keepdim=True) if query == "max" else s
        s = (s.mean((1, 2)) if head_mean is None else head_mean(s))[:, None]
    if ctx_len is not None:
        s = s.masked_fill((torch.arange(lc, device=s.device)[None] >= ctx_len[:, None])[:, None], -torch.inf)
    if window > 1:                              # -inf padding at the end never wins a window
        s = F.max_pool1d(s.reshape(-1, 1, lc), window, stride=1, padding=window // 2).view(s.shape)
    out = torch.zeros(G, hkv, kmax, dtype=torch.long, device=s.device)
    for c, n, members in groups:
        rows = slice(None) if members is None else members
        out[rows, :, :n] = torch.topk(s[rows, :, :c], n, dim=-1).indices.sort(-1).values
    return out


def pack(t_ctx: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t_ctx [..., Hkv, Lc, D] gathered per head at idx [..., Hkv, k] -> dense [..., Hkv, k, D]."""
    return t_ctx.gather(-2, idx[..., None].expand(*idx.shape, t_ctx.shape[-1]))
