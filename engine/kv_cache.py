"""The KV pool: a capacity in token slots (sized by the profiler) and per-request reservations.

A request's whole KV need is reserved at admission — dense: its canvas length; sparse: the
retained ⌊r·L_ctx⌋ tokens per head — so a running request can never run out. Storage is a
per-request tensor in [layers, 2 (K, V), H_kv, tokens, head_dim], the layout attention reads.
"""
from __future__ import annotations

import torch

from engine.models.llada import LLaDAConfig


def bytes_per_token(cfg: LLaDAConfig, dtype: torch.dtype) -> int:
    """K and V of one token in every layer."""
    return cfg.n_layers * 2 * cfg.kv_heads * cfg.head_dim * torch.empty(0, dtype=dtype).element_size()


def retained_tokens(context_len: int, retention: float) -> int:
    """⌊r·L_ctx⌋, as Sparse-dLLM (`int(L_ctx * keep_ratio)`) and dLLM-Serve round: rounding up
    would hold one more token per head than they do at the same retention."""
    if context_len <= 0:
        return 0
    return min(context_len, int(context_len * retention))


def kv_need(cache: str, length: int, block_length: int, retention: float) -> int:
    """Token slots a request needs for its whole life under a cache policy."""
    if cache == "dual":
        return length
    if cache == "sparse":
        return retained_tokens(length - block_length, retention)
    return 0


class KVPool:
    def __init__(self, capacity_tokens: int | None, cfg: LLaDAConfig, dtype: torch.dtype, device):
        self.capacity = capacity_tokens            # None = unbounded
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.bytes_per_token = bytes_per_token(cfg, dtype)
        self.used = 0
        self.peak_used = 0

    @property
    def capacity_bytes(self) -> int | None:
        return None if self.capacity is None else self.capacity * self.bytes_per_token

    def can_ever_fit(self, n: int) -> bool:
        return self.capacity is None or n <= self.capacity

    def can_reserve(self, n: int) -> bool:
        return self.capacity is None or self.used + n <= self.capacity

    def reserve(self, n: int) -> torch.Tensor | None:
        """Reserve n slots and allocate their storage."""
        if not self.can_reserve(n):
            raise RuntimeError("KV pool over-committed: the scheduler must check can_reserve first")
        self.used += n
        self.peak_used = max(self.peak_used, self.used)
        if n == 0:
            return None
        c = self.cfg
        return torch.empty(c.n_layers, 2, c.kv_heads, n, c.head_dim, dtype=self.dtype, device=self.device)

    def release(self, n: int) -> None:
        self.used -= n
        assert self.used >= 0
