"""Varlen, non-causal attention over a packed batch of sequences with different query and key
lengths (Refresh: keys = own queries; Reuse: keys = cache + fresh block).

Backends: `flash_attn` (flash_attn_varlen_func, CUDA only, optional import) and `sdpa` (a loop
of torch SDPA calls, one per sequence: robust on CPU, exact, memory O(max Lq·Lk)).
Keys and values come per sequence in [H_kv, L_k, D] layout, the layout caches are stored in.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F


def flash_attn_available() -> bool:
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def resolve_backend(name: str, device: torch.device) -> str:
    if name == "auto":
        return "flash_attn" if device.type == "cuda" and flash_attn_available() else "sdpa"
    if name == "flash_attn" and not (device.type == "cuda" and flash_attn_available()):
        raise ValueError("attention backend flash_attn needs CUDA and the flash-attn package (pip install '.[gpu]')")
    return name


def varlen_attention(
    q: torch.Tensor,
    cu_q: list[int],
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    backend: str = "sdpa",
) -> torch.Tensor:
    """q [Nq, Hq, D] packed; segment i is q[cu_q[i]:cu_q[i+1]] and attends over keys[i] /
    values[i] ([Hkv, Lk_i, D]). Returns [Nq, Hq, D]."""
    if backend == "flash_attn":
        return _flash(q, cu_q, keys, values)
    out = torch.empty_like(q)
    for i, (k, v) in enumerate(zip(keys, values)):
        out[cu_q[i] : cu_q[i + 1]] = attend_one(q[cu_q[i] : cu_q[i + 1]], k, v)
    return out


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence with SDPA: q [Lq, Hq, D], k/v [Hkv, Lk, D] -> [Lq, Hq, D]."""
    # A contiguous [H, Lq, D] query is several times faster in CPU SDPA than a strided view.
    o = F.scaled_dot_product_attention(q.transpose(0, 1).contiguous(), k, v, enable_gqa=q.shape[1] != k.shape[0])
    return o.transpose(0, 1)


def _flash(q, cu_q, keys, values):
    from flash_attn import flash_attn_varlen_func  # optional dependency, CUDA only

    k = torch.cat([t.transpose(0, 1) for t in keys])
    v = torch.cat([t.transpose(0, 1) for t in values])
    lk = [t.shape[1] for t in keys]
    cu_k = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device=q.device)
    cq = torch.tensor(cu_q, dtype=torch.int32, device=q.device)
    max_q = max(cu_q[i + 1] - cu_q[i] for i in range(len(cu_q) - 1))
    return flash_attn_varlen_func(q, k, v, cq, cu_k, max_q, max(lk), causal=False)
