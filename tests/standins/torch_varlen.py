"""A stand-in for torch's `torch.nn.attention.varlen.varlen_attn` (FlashAttention varlen kernels,
CUDA-only in torch): its contracts asserted, computed with SDPA one segment at a time, so the
engine's varlen path runs in CI on a CPU. Tests put `varlen_attn` (torch >= 2.12's signature:
enable_gqa, seqused_k, block_table) or `varlen_attn_2_11` (torch 2.11's: neither) in place of
torch's. Contracts (torch's docstring and the FlashAttention kernel's checks): q [Tq, Hq, D], k/v
[Tk, Hkv, D] (or [pages, page_size, Hkv, D] with a block_table), fp16/bf16, last dimension
contiguous, D a multiple of 8 up to 256; cu_seq_q/cu_seq_k int32 [N + 1] on q's device, from 0,
non-decreasing; max_q/max_k Python ints bounding every segment; Hq == Hkv unless enable_gqa; a
block_table int32 [N, max_pages] needs seqused_k int32 [N] and pages of a multiple of 256 tokens.
A segment without queries costs nothing, one without keys gives zeros (the kernel's semantics)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

DTYPES = {torch.float16, torch.bfloat16}   # the exactness tests add torch.float64
calls: list[dict] = []                     # what each call was given (tests inspect it)


def _check_cu(cu: torch.Tensor, q: torch.Tensor, name: str) -> list[int]:
    assert torch.is_tensor(cu), f"{name} must be a tensor"
    assert cu.dtype == torch.int32, f"{name} must be int32, got {cu.dtype}"
    assert cu.device == q.device, f"{name} must be on q's device"
    assert cu.dim() == 1 and cu.numel() >= 2 and cu.is_contiguous(), f"{name} must be a 1-D contiguous [N + 1]"
    v = cu.tolist()
    assert v[0] == 0 and all(b >= a for a, b in zip(v, v[1:])), f"{name} must start at 0 and not decrease"
    return v


def _attend(q, cq, key_ranges, scale, gqa: bool) -> torch.Tensor:
    out = torch.zeros_like(q)                  # no keys: zeros, as the kernel writes
    for (a, b), (kk, vv) in zip(zip(cq, cq[1:]), key_ranges):
        if b > a and kk.shape[0]:
            o = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1),
                                               scale=scale, enable_gqa=gqa)
            out[a:b] = o.transpose(0, 1)
    return out


def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    paged = block_table is not None
    for name, t in (("query", query), ("key", key), ("value", value)):
        assert t.dtype in DTYPES, f"varlen_attn supports fp16 and bf16 only ({name}: {t.dtype})"
        assert t.stride(-1) == 1, f"{name} must have a contiguous last dimension"
    assert query.dim() == 3 and key.dim() == value.dim() == (4 if paged else 3), "shapes: [T, H, D] (paged: 4-D)"
    assert query.dtype == key.dtype == value.dtype and key.shape == value.shape, "q, k, v: one dtype; k, v: one shape"
    hq, hkv, d = query.shape[1], key.shape[-2], query.shape[2]
    assert key.shape[-1] == d and d % 8 == 0 and d <= 256, "head_dim: equal, a multiple of 8, at most 256"
    assert (hq % hkv == 0) if enable_gqa else hq == hkv, "Hq != Hkv needs enable_gqa=True"
    assert enable_gqa in (True, False) and tuple(window_size) == (-1, -1), "bidirectional attention only"
    assert isinstance(max_q, int) and isinstance(max_k, int), "max_q / max_k must be Python ints"
    assert return_aux is None and num_splits is None
    cq, ck = _check_cu(cu_seq_q, query, "cu_seq_q"), _check_cu(cu_seq_k, query, "cu_seq_k")
    n = len(cq) - 1
    assert len(ck) == n + 1 and cq[-1] == query.shape[0], "cu_seq_q covers q; cu_seq_k describes the same batch"
    lq = [b - a for a, b in zip(cq, cq[1:])]
    assert max(lq) <= max_q, "max_q smaller than a segment"
    if paged:
        assert seqused_k is not None, "block_table needs seqused_k"
        assert block_table.dtype == torch.int32 and block_table.dim() == 2 and block_table.shape[0] == n
        assert block_table.stride(-1) == 1 and block_table.device == query.device
        assert seqused_k.dtype == torch.int32 and seqused_k.shape == (n,) and seqused_k.is_contiguous()
        page = key.shape[1]
        assert page % 256 == 0, "paged KV: page size must be a multiple of 256"
        used = seqused_k.tolist()
        assert max(used) <= max_k and max(used) <= block_table.shape[1] * page
        ranges = [(key[block_table[i]].flatten(0, 1)[: used[i]], value[block_table[i]].flatten(0, 1)[: used[i]])
                  for i in range(n)]
    else:
        assert ck[-1] <= key.shape[0], "cu_seq_k beyond the keys"
        assert seqused_k is None or (seqused_k.dtype == torch.int32 and seqused_k.shape == (n,))
        lk = [b - a for a, b in zip(ck, ck[1:])]
        assert max(lk) <= max_k, "max_k smaller than a segment"
        used = lk if seqused_k is None else [min(a, b) for a, b in zip(lk, seqused_k.tolist())]
        ranges = [(key[c : c + u], value[c : c + u]) for c, u in zip(ck, used)]
    calls.append(dict(dtype=query.dtype, segments=n, lq=lq, lk=[len(r[0]) for r in ranges],
                      key_rows=key.shape[0], gqa=enable_gqa, paged=paged))
    return _attend(query, cq, ranges, scale, enable_gqa)


def varlen_attn_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1)):
    """torch 2.11's signature: no enable_gqa (so Hq must equal Hkv), no seqused_k, no block_table."""
    return varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux=return_aux, scale=scale,
                       window_size=window_size)


varlen_attn.RUNS_ON_CPU = varlen_attn_2_11.RUNS_ON_CPU = True
