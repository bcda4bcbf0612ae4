"""A stand-in for the `flash_attn` package: `flash_attn_varlen_func` with flash-attn 2's
contracts asserted, computed with SDPA one packed sequence at a time. It lets the engine's
flash path run in CI on a CPU (tests put this folder first on sys.path)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

RUNS_ON_CPU = True
calls: list[dict] = []          # what each call was given (tests inspect it)


def _check_cu(cu: torch.Tensor, q: torch.Tensor, name: str) -> list[int]:
    assert torch.is_tensor(cu), f"{name} must be a tensor"
    assert cu.dtype == torch.int32, f"{name} must be int32, got {cu.dtype}"
    assert cu.device == q.device, f"{name} must be on q's device"
    assert cu.dim() == 1 and cu.numel() >= 2 and cu.is_contiguous(), f"{name} must be a 1-D contiguous [B + 1]"
    v = cu.tolist()
    assert v[0] == 0 and all(b >= a for a, b in zip(v, v[1:])), f"{name} must start at 0 and not decrease"
    return v


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, **kwargs):
    for name, t in (("q", q), ("k", k), ("v", v)):
        assert t.dtype in (torch.float16, torch.bfloat16), f"FlashAttention only supports fp16 and bf16 ({name})"
        assert t.is_contiguous(), f"{name} must be contiguous"
        assert t.dim() == 3, f"{name} must be [tokens, heads, head_dim]"
    assert q.dtype == k.dtype == v.dtype, "q, k, v must share a dtype"
    assert k.shape == v.shape and q.shape[2] == k.shape[2], "k/v shapes must match, head dims must agree"
    assert q.shape[1] % k.shape[1] == 0, "query heads must be a multiple of KV heads"
    assert q.shape[2] % 8 == 0 and q.shape[2] <= 256, "head_dim must be a multiple of 8, at most 256"
    assert isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int), "max_seqlen must be Python ints"
    cq, ck = _check_cu(cu_seqlens_q, q, "cu_seqlens_q"), _check_cu(cu_seqlens_k, q, "cu_seqlens_k")
    assert len(cq) == len(ck), "cu_seqlens_q and cu_seqlens_k must describe the same batch"
    assert cq[-1] == q.shape[0] and ck[-1] <= k.shape[0], "cu_seqlens must cover the packed tensors"
    lq = [b - a for a, b in zip(cq, cq[1:])]
    lk = [b - a for a, b in zip(ck, ck[1:])]
    assert max(lq) <= max_seqlen_q and max(lk) <= max_seqlen_k, "max_seqlen smaller than a sequence"
    assert dropout_p == 0.0 and not causal
    calls.append(dict(dtype=q.dtype, batch=len(lq), lq=lq, lk=lk))
    out = torch.zeros_like(q)                       # a sequence without keys: zeros, as the kernel writes
    gqa = q.shape[1] != k.shape[1]
    for a, b, c, d in zip(cq, cq[1:], ck, ck[1:]):
        if b > a and d > c:
            o = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[c:d].transpose(0, 1),
                                               v[c:d].transpose(0, 1), scale=softmax_scale, enable_gqa=gqa)
            out[a:b] = o.transpose(0, 1)
    return out
