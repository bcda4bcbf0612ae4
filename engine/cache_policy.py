"""What each KV cache policy stores, selects and reads, as columns over a `StepMeta` (docs/MECHANISMS.md)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine import sparse
from engine.config import EngineConfig
from engine.kv_cache import CODES
from engine.ragged import padded, ragged
from engine.request import Phase
from engine.staging import Staging
from engine.step import StepMeta


@dataclass
class KeySpec:
    cached: np.ndarray      # keys read from the request's slots (its first `cached` table entries)
    fresh: np.ndarray       # keys that are this step's own fresh K/V rows (its first `fresh` queries)
    store_from: np.ndarray  # slot-table index where this step's fresh K/V (lead rows aside) go (-1: none)


class CachePolicy:
    def __init__(self, config: EngineConfig, head_mean=None):
        self.config = config
        self.head_mean = head_mean      # uniform selection on a tensor-parallel rank (engine.sparse)

    def spec(self, m: StepMeta) -> KeySpec:
        return KeySpec(np.zeros_like(m.n_q), m.n_q, np.full_like(m.n_q, -1))

    def plan_select(self, m: StepMeta, staging: Staging):
        return None

    def reuse_keys(self, req) -> int:
        """Keys a request's Reuse step attends to (all read from its cache slots)."""
        return req.length


class NoCache(CachePolicy):
    """Exact LLaDA: keys = the request's own fresh canvas K/V, nothing cached."""


class DualCache(CachePolicy):
    """Fast-dLLM's dual cache: the block-start Refresh stores every K/V; a Reuse step overwrites
    the block's slots in place and attends over all L."""

    def spec(self, m):
        reuse = ~m.refresh
        return KeySpec(np.where(reuse, m.length, 0), np.where(reuse, 0, m.n_q),
                       np.where(reuse, m.block_start, np.where(m.has(Phase.REFRESH_STORE), 0, -1)))


class SparseCache(CachePolicy):
    """dLLM-Serve's sparse KV: the Refresh at `delay_step` packs the retained context K/V into the
    first slots; a Reuse step writes the block's after them and attends over [retained ; block]."""

    def reuse_keys(self, req) -> int:
        return req.kv_tokens

    def spec(self, m):
        reuse = ~m.refresh
        return KeySpec(np.where(reuse, m.kv, 0), np.where(reuse, 0, m.n_q),
                       np.where(reuse, m.kv - m.block_len, -1))

    def plan_select(self, m: StepMeta, staging: Staging) -> SelectPlan | None:
        """Index tensors of one step's Refresh-select, for the members that keep anything."""
        g = np.flatnonzero(m.has(Phase.REFRESH_SELECT) & (m.kv > m.block_len))
        if not g.size:
            return None
        bl, start, a = m.block_len[g], m.block_start[g], m.cu_q[g]
        lc = m.length[g] - bl
        blmax, lcmax = int(bl.max()), int(lc.max())
        q_index, _ = padded(a + start, bl, blmax)
        j = np.arange(lcmax)
        pos = j + bl[:, None] * (j >= start[:, None])
        ctx_index = a[:, None] + pos * (j < lc[:, None])
        keep = m.kv[g] - bl
        kmax = int(keep.max())
        keep_rows = np.nonzero(np.arange(kmax) < keep[:, None])              # (member, rank) kept
        shapes: dict[tuple[int, int], list[int]] = {}
        for i, key in enumerate(zip(lc.tolist(), keep.tolist())):
            shapes.setdefault(key, []).append(i)
        groups = [(c, n, None if len(shapes) == 1 else staging.put(np.asarray(mem))) for (c, n), mem in shapes.items()]
        return SelectPlan(len(g), staging.put(q_index.reshape(-1)), blmax,
                          None if (bl == blmax).all() else staging.put(bl),
                          staging.put(ctx_index.reshape(-1)), lcmax,
                          None if (lc == lcmax).all() else staging.put(lc), groups, kmax,
                          tuple(map(staging.put, keep_rows)), staging.put(m.slots[ragged(m.slot_base[g], keep)]))

    def select(self, plan: SelectPlan, pool: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """One layer's Refresh-select: keep ⌊r·L_ctx⌋ context tokens per KV head, packed into the first slots."""
        c, G = self.config, plan.G
        hkv, d = k.shape[1:]
        qb = q[plan.q_index].view(G, plan.blmax, *q.shape[1:])
        kc = k[plan.ctx_index].view(G, plan.lcmax, hkv, d).transpose(1, 2)
        vc = v[plan.ctx_index].view(G, plan.lcmax, hkv, d).transpose(1, 2)
        idx = sparse.select_many(qb, kc, plan.groups, plan.kmax, c.selection, c.pool_window, c.score_query,
                                 plan.q_len, plan.ctx_len, self.head_mean)
        pool[0, plan.slots] = sparse.pack(kc, idx).transpose(1, 2)[plan.keep_rows]
        pool[1, plan.slots] = sparse.pack(vc, idx).transpose(1, 2)[plan.keep_rows]


@dataclass
class SelectPlan:
    G: int
    q_index: torch.Tensor        # [G*blmax] packed rows of each member's block queries (padded)
    blmax: int
    q_len: torch.Tensor | None   # block lengths when they differ
    ctx_index: torch.Tensor      # [G*lcmax] packed rows of each member's context (padded)
    lcmax: int
    ctx_len: torch.Tensor | None  # context lengths when they differ
    groups: list                 # (context length, tokens kept, members or None = all): one top-k each
    kmax: int
    keep_rows: tuple             # (member, rank) of every kept token of the [G, kmax] packing
    slots: torch.Tensor          # the members' slot tables, concatenated


class AutoCache(SparseCache):
    """Dual, sparse and none members in one step (`cache=auto`), each by its own policy's spec."""

    def spec(self, m):
        specs = {CODES["dual"]: DualCache.spec(self, m), CODES["sparse"]: SparseCache.spec(self, m),
                 CODES["none"]: CachePolicy.spec(self, m)}
        members = [m.cache == code for code in specs]
        return KeySpec(*(np.select(members, [getattr(s, f) for s in specs.values()])
                         for f in ("cached", "fresh", "store_from")))


POLICIES: dict[str, type[CachePolicy]] = {"none": NoCache, "dual": DualCache, "sparse": SparseCache,
                                          "auto": AutoCache}
