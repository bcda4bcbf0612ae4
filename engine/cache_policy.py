"""What each KV cache policy stores, selects and reads, per request and phase.

`StepContext` asks the policy of the engine (`POLICIES[config.cache]`) for every scheduled
request's key spec — how many of its keys come from its cache slots and how many are this
step's fresh K/V — and for what it stores; it then reads and writes the cache of all requests
of a layer with one indexed op each. The sparse policy's selection runs per request, in the
layer, on that step's own queries and keys (`SparseCache.select`).

* none (exact LLaDA): keys = the request's own fresh canvas K/V, nothing cached.
* dual (Fast-dLLM): the block-start Refresh stores every position's K/V; a Reuse step overwrites
  the block's slots with its fresh K/V in place and attends over all L cached slots.
* sparse (dLLM-Serve): the Refresh at `delay_step` selects and packs the retained context K/V
  into the request's slots; a Reuse step attends over [retained ; fresh block].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine import sparse
from engine.config import EngineConfig
from engine.request import Phase, Request


@dataclass
class KeySpec:
    cached: int          # keys read from the request's slots (its first `cached` table entries)
    fresh: int           # keys that are this step's own fresh K/V rows (its first `fresh` queries)
    store_from: int      # slot-table index where this step's fresh K/V are stored (-1: none)


class CachePolicy:
    def __init__(self, config: EngineConfig):
        self.config = config

    def spec(self, req: Request, phase: Phase, n_query: int) -> KeySpec:
        return KeySpec(0, n_query, -1)

    def selects(self, phase: Phase) -> bool:
        return False


class NoCache(CachePolicy):
    pass


class DualCache(CachePolicy):
    def spec(self, req, phase, n_query):
        if phase is Phase.REUSE:         # block K/V overwrite their slots, then all L are read
            return KeySpec(req.length, 0, req.block_range[0])
        return KeySpec(0, n_query, 0 if phase is Phase.REFRESH_STORE else -1)


class SparseCache(CachePolicy):
    def spec(self, req, phase, n_query):
        if phase is Phase.REUSE:
            return KeySpec(req.kv_tokens, n_query, -1)
        return KeySpec(0, n_query, -1)

    def selects(self, phase):
        return phase is Phase.REFRESH_SELECT

    def select(self, req: Request, pool: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """One request's Refresh-select in one layer: q/k/v are its canvas rows; `pool` is the
        layer's [2, slots, H_kv, D] storage. Keeps ⌈r·L_ctx⌉ context tokens per KV head."""
        if req.slots is None:
            return
        c = self.config
        s, e = req.block_range
        ctx = sparse.context_index(req.length, s, e, k.device)
        k_ctx, v_ctx = k[ctx].transpose(0, 1), v[ctx].transpose(0, 1)          # [Hkv, Lc, D]
        idx = sparse.select(q[s:e], k_ctx, req.kv_tokens, c.selection, c.pool_window, c.score_query)
        pool[0, req.slots] = sparse.pack(k_ctx, idx).transpose(0, 1)
        pool[1, req.slots] = sparse.pack(v_ctx, idx).transpose(0, 1)


POLICIES: dict[str, type[CachePolicy]] = {"none": NoCache, "dual": DualCache, "sparse": SparseCache}
