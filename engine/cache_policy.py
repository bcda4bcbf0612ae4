"""What each KV cache mode stores, selects and reads, as columns over a `StepMeta` (docs/MECHANISMS.md)."""
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


class CachePolicy:
    """`config.cache` over a step's members (`auto`: each member's own mode, `StepMeta.cache`; docs/ENGINE.md)."""

    def __init__(self, config: EngineConfig, head_mean=None):
        self.config = config
        self.head_mean = head_mean      # uniform selection on a tensor-parallel rank (engine.sparse)
        self.selects = config.cache in ("sparse", "auto")

    def spec(self, m: StepMeta) -> KeySpec:
        """none: the fresh canvas; dual: Reuse reads all L slots, the block's overwritten in place; sparse:
        Reuse reads [retained ; block], the block's slots after the retained ones."""
        mode = m.cache if self.config.cache == "auto" else np.full_like(m.n_q, CODES[self.config.cache])
        dual, reuse = mode == CODES["dual"], ~m.refresh
        dual_reuse, sparse_reuse = reuse & dual, reuse & (mode == CODES["sparse"])
        stores = dual & m.has(Phase.REFRESH_STORE)
        return KeySpec(np.select([dual_reuse, sparse_reuse], [m.length, m.kv], 0),
                       np.where(dual_reuse | sparse_reuse, 0, m.n_q),
                       np.select([dual_reuse, sparse_reuse, stores], [m.block_start, m.kv - m.block_len, 0], -1))

    def reuse_keys(self, req) -> int:
        """Keys a request's Reuse step attends to (all read from its cache slots)."""
        return req.kv_tokens if self.selects else req.length

    def plan_select(self, m: StepMeta, staging: Staging) -> SelectPlan | None:
        """Index tensors of one step's Refresh-select, for the members that keep anything."""
        g = np.flatnonzero(m.has(Phase.REFRESH_SELECT) & (m.kv > m.block_len))
        if not self.selects or not g.size:
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
