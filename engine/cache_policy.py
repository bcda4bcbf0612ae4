"""What each KV cache policy stores, selects and reads, per request and phase.

`StepContext` asks the policy of the engine (`POLICIES[config.cache]`) for every scheduled
request's key spec — how many of its keys come from its cache slots and how many are this
step's fresh K/V — and for what it stores; it then reads and writes the cache of all requests
of a layer with one indexed op each. The sparse policy's selection runs in the layer, on that step's
own queries and keys, for all selecting requests at once (`SparseCache.select`).

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
from engine.ragged import padded
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

    def plan_select(self, members: list[tuple[Request, int]]):
        return None


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

    def plan_select(self, members: list[tuple[Request, int]]) -> SelectPlan | None:
        """Index tensors of one step's Refresh-select, for the requests (with the packed row of
        their canvas start) that keep anything."""
        members = [(r, a) for r, a in members if r.slots is not None]
        if not members:
            return None
        dev = members[0][0].slots.device
        reqs = [r for r, _ in members]
        bl = [r.params.block_length for r in reqs]
        lc = [r.context_len for r in reqs]
        blmax, lcmax = max(bl), max(lc)
        q_index, _ = padded([a + r.block_range[0] for r, a in members], bl, blmax, dev)
        j = torch.arange(lcmax, device=dev)
        start = torch.tensor([r.block_range[0] for r in reqs], device=dev)[:, None]
        pos = j + torch.tensor(bl, device=dev)[:, None] * (j >= start)         # skip the block
        valid = j < torch.tensor(lc, device=dev)[:, None]
        ctx_index = torch.tensor([a for _, a in members], device=dev)[:, None] + pos * valid
        keep = [r.kv_tokens for r in reqs]
        keep_valid = torch.arange(max(keep), device=dev) < torch.tensor(keep, device=dev)[:, None]
        q_len = None if len(set(bl)) == 1 else torch.tensor(bl, device=dev)
        return SelectPlan(len(reqs), q_index.view(-1), blmax, q_len, ctx_index.view(-1), lcmax, lc, keep,
                          keep_valid, torch.cat([r.slots for r in reqs]))

    def select(self, plan: SelectPlan, pool: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """One layer's Refresh-select for every planned request: score the context with the
        block's queries of this step, keep ⌈r·L_ctx⌉ tokens per KV head, pack them into the
        requests' slots (`pool`: the layer's [2, slots, H_kv, D] storage)."""
        c, G = self.config, plan.G
        hkv, d = k.shape[1:]
        qb = q[plan.q_index].view(G, plan.blmax, *q.shape[1:])
        kc = k[plan.ctx_index].view(G, plan.lcmax, hkv, d).transpose(1, 2)        # [G, Hkv, Lc, D]
        vc = v[plan.ctx_index].view(G, plan.lcmax, hkv, d).transpose(1, 2)
        idx = sparse.select_many(qb, kc, plan.ctx_len, plan.keep, c.selection, c.pool_window, c.score_query,
                                 plan.q_len)                                         # [G, Hkv, kmax]
        pool[0, plan.slots] = sparse.pack(kc, idx).transpose(1, 2)[plan.keep_valid]
        pool[1, plan.slots] = sparse.pack(vc, idx).transpose(1, 2)[plan.keep_valid]


@dataclass
class SelectPlan:
    G: int
    q_index: torch.Tensor        # [G*blmax] packed rows of each member's block queries (padded)
    blmax: int
    q_len: torch.Tensor | None   # block lengths when they differ
    ctx_index: torch.Tensor      # [G*lcmax] packed rows of each member's context (padded)
    lcmax: int
    ctx_len: list[int]
    keep: list[int]              # retained tokens (= slots) per member
    keep_valid: torch.Tensor     # [G, max keep]
    slots: torch.Tensor          # the members' slot tables, concatenated


POLICIES: dict[str, type[CachePolicy]] = {"none": NoCache, "dual": DualCache, "sparse": SparseCache}
