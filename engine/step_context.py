"""A step's attention planned on the host: keys by cache mode (`CachePolicy`), the per-layer call (`StepContext`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine import sparse
from engine.attention import PACKED, attention_over_key_chunks, key_bias, key_piece, padded_attention
from engine.config import EngineConfig
from engine.kv_cache import CODES, KVPool
from engine.request import Phase
from engine.step import CODES as PHASES
from engine.step import Staging, StepMeta, offsets, padded, ragged


@dataclass
class SelectPlan:
    q_index: torch.Tensor
    q_len: torch.Tensor | None
    ctx_index: torch.Tensor
    ctx_len: torch.Tensor | None
    groups: list            # one top-k each: (context length, tokens kept, members or None = all)
    kmax: int
    keep_rows: tuple        # (member, rank) of every kept token of the [G, kmax] packing
    slots: torch.Tensor


class CachePolicy:
    """`config.cache` over a step's members (`auto`: each member's own mode, `StepMeta.cache`; docs/ENGINE.md)."""

    def __init__(self, config: EngineConfig, head_mean=None):
        self.config, self.head_mean, self.selects = config, head_mean, config.cache in ("sparse", "auto")

    def spec(self, m: StepMeta) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per member: keys read from its first slots, keys that are its first queries' K/V, the slot its K/V past
        `lead` go to (-1: none). dual: Reuse reads all L slots; sparse: [retained ; block] (docs/ENGINE.md)."""
        mode = m.cache if self.config.cache == "auto" else np.full_like(m.n_q, CODES[self.config.cache])
        dual, reuse = mode == CODES["dual"], ~m.refresh
        dual_reuse, sparse_reuse = reuse & dual, reuse & (mode == CODES["sparse"])
        stores = dual & (m.phase == PHASES[Phase.REFRESH_STORE])
        return (np.select([dual_reuse, sparse_reuse], [m.length, m.kv], 0),
                np.where(dual_reuse | sparse_reuse, 0, m.n_q),
                np.select([dual_reuse, sparse_reuse, stores], [m.block_start, m.kv - m.block_len, 0], -1))

    def plan_select(self, m: StepMeta, staging: Staging) -> SelectPlan | None:
        g = np.flatnonzero((m.phase == PHASES[Phase.REFRESH_SELECT]) & (m.kv > m.block_len))
        if not self.selects or not g.size:
            return None
        bl, start, a = m.block_len[g], m.block_start[g], m.cu_q[g]
        lc, keep = m.length[g] - bl, m.kv[g] - bl
        j = np.arange(int(lc.max()))
        ctx_index = a[:, None] + (j + bl[:, None] * (j >= start[:, None])) * (j < lc[:, None])  # canvas less block
        shapes, group = np.unique(np.stack([lc, keep], 1), axis=0, return_inverse=True)
        groups = [(c, n, None if len(shapes) == 1 else staging.put(np.flatnonzero(group.reshape(-1) == i)))
                  for i, (c, n) in enumerate(shapes.tolist())]
        kmax = int(keep.max())
        return SelectPlan(staging.put(padded(a + start, bl, int(bl.max()))[0]),
                          None if (bl == bl.max()).all() else staging.put(bl), staging.put(ctx_index),
                          None if (lc == lc.max()).all() else staging.put(lc), groups, kmax,
                          tuple(map(staging.put, np.nonzero(np.arange(kmax) < keep[:, None]))),
                          staging.put(m.slots[ragged(m.slot_base[g], keep)]))

    def select(self, plan: SelectPlan, pool: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        c = self.config
        kc, vc = k[plan.ctx_index].transpose(1, 2), v[plan.ctx_index].transpose(1, 2)
        idx = sparse.select_many(q[plan.q_index], kc, plan.groups, plan.kmax, c.selection, c.pool_window,
                                 c.score_query, plan.q_len, plan.ctx_len, self.head_mean)
        pool[0, plan.slots] = sparse.pack(kc, idx).transpose(1, 2)[plan.keep_rows]
        pool[1, plan.slots] = sparse.pack(vc, idx).transpose(1, 2)[plan.keep_rows]


@dataclass
class _Chunk:
    """One attention call: padded (per member Lq queries, kmax keys) or packed (Lq, kmax: bounds)."""
    members: np.ndarray
    Lq: int
    kmax: int
    q_index: torch.Tensor | None
    keys: str = "fresh"                     # the step's own K/V, or the pool's: "pool", "long" (pieces), "in_place"
    k_index: torch.Tensor | None = None     # fresh: rows of k (None: all); pool: K slots, then V slots; long: K slots
    layout: torch.Tensor | None = None      # padded: key mask (None: all real); packed: [2, segments + 1] offsets
    ready: torch.Tensor | None = None       # by `finalize`: the mask as an SDPA bias, the offsets as int32
    q_rows: tuple | None = None             # padded, ragged Lq: (member, row) of each real output row
    dst: torch.Tensor | None = None


class StepContext:
    """`static_keys`: a CUDA graph bucket's keys per member (padded) or per group (packed), 0: read in place."""

    def __init__(self, meta: StepMeta, policy: CachePolicy, pool: KVPool | None, backend: str, key_budget: int,
                 staging: Staging, dtype: torch.dtype, static_keys: int | None = None, kernel=None,
                 in_place: bool = True, key_chunk: int | None = None):
        self.meta, self.policy, self.pool, self.kernel, self.dtype = meta, policy, pool, kernel, dtype
        self.static_keys, self.key_budget, self.key_chunk = static_keys, key_budget, key_chunk or key_budget
        self.packed = backend in PACKED
        self.n_slots = pool.storage.shape[2] if pool is not None else 0
        self.in_place = in_place and self.packed and pool is not None and kernel.reads_in_place(
            pool.cfg.n_heads, pool.cfg.kv_heads)
        self.cached, self.fresh, store_from = policy.spec(meta)
        st = np.flatnonzero(store_from >= 0)
        self.store_slots = self.store_src = None
        if st.size:
            n = meta.n_q[st] - meta.lead[st]
            self.store_slots = staging.put(meta.slots[ragged(meta.slot_base[st] + store_from[st], n)])
            self.store_src = self._rows(ragged(meta.cu_q[st] + meta.lead[st], n), staging)
        self.select_plan = policy.plan_select(meta, staging)
        self.chunks: list[_Chunk] = []
        for refresh in (True, False):
            members = np.flatnonzero(meta.refresh == refresh)
            if self.packed and members.size:
                members = self._read_in_place(members, staging)
            self.chunks += [self._chunk(part, staging) for part in self._split(members)]
        if len(self.chunks) > 1 or (self.packed and self.chunks and self.chunks[0].q_index is not None):
            for ch in self.chunks:
                dst = ragged(meta.cu_q[ch.members], meta.n_q[ch.members])
                ch.dst = staging.put(dst.reshape(-1, ch.Lq) if not self.packed and ch.q_rows is None else dst)

    def _read_in_place(self, members: np.ndarray, staging: Staging) -> np.ndarray:
        """A call over the pool layer for members whose slot table is one range, in range order -> the others."""
        m, static, kc = self.meta, self.static_keys, self.cached[members]
        if not (self.in_place and kc.all() and not static):
            assert static != 0, "a graph's in-place step (static keys 0) on a group not read in place"
            return members
        first, base = m.slots[m.slot_base[members]], m.slot_base[members]
        keys = np.where(first == self.pool.scratch, 0, kc)
        runs = np.concatenate([[0], np.cumsum(np.diff(m.slots) != 1)])
        whole = (runs[base + kc - 1] == runs[base]) | (keys == 0)
        assert static is None or whole.all(), "a graph's in-place step needs every slot table in one piece"
        if not whole.any():
            return members
        order = np.argsort(np.where(keys > 0, first, np.iinfo(np.int64).max)[whole], kind="stable")
        mem, keys, first = members[whole][order], keys[whole][order], first[whole][order]
        start = np.where(keys > 0, first, np.max(first + keys, where=keys > 0, initial=0))
        cu_k = np.concatenate([[0], np.stack([start, start + keys], 1).reshape(-1)])
        assert (np.diff(cu_k) >= 0).all(), "slot ranges of two requests overlap"
        lq = m.n_q[mem]
        q_idx = ragged(m.cu_q[mem], lq)
        kmax = self.n_slots if static is not None else max(1, int(np.diff(cu_k).max()))
        self.chunks.append(_Chunk(mem, int(lq.max()), kmax,            # a graph stages even an identity order
                                  staging.put(q_idx) if static is not None else self._rows(q_idx, staging),
                                  "in_place", layout=staging.put(np.stack([np.repeat(offsets(lq), 2)[:-1], cu_k]))))
        return members[~whole]

    def _split(self, members: np.ndarray) -> list[np.ndarray]:
        if self.static_keys is not None:
            return [members] if members.size else []
        if not self.packed:
            return split_by_keys(members, (self.cached + self.fresh)[members], self.key_chunk)
        long = self.cached[members] > self.key_chunk     # alone: their keys are read a piece at a time
        return ([members[~long]] if not long.all() else []) + [members[i : i + 1] for i in np.flatnonzero(long)]

    def _chunk(self, members: np.ndarray, staging: Staging) -> _Chunk:
        m, static = self.meta, self.static_keys
        lq, kc, kf = m.n_q[members], self.cached[members], self.fresh[members]
        assert not (kc.any() and kf.any()), "a cache policy takes one group's keys from one source (pool or fresh)"
        from_pool = bool(kc.any())
        keys, base = (kc, m.slot_base[members]) if from_pool else (kf, m.cu_q[members])
        Lq = int(lq.max())
        if self.packed:
            q_idx, idx = ragged(m.cu_q[members], lq), ragged(base, keys)
            kmax = self.key_budget if static else int(keys.max())
            if static:                                # padded to a static total with the last real key
                idx = np.concatenate([idx, np.full(static - idx.size, idx[-1] if idx.size else 0)])
            ch = _Chunk(members, Lq, kmax, self._rows(q_idx, staging),
                        layout=staging.put(np.stack([offsets(lq), offsets(keys)])))
        else:
            kmax = static or int(keys.max())
            idx, ok = padded(base, keys, kmax)
            q_idx, q_ok = padded(m.cu_q[members], lq, Lq)
            q_idx = q_idx.reshape(-1)
            ch = _Chunk(members, Lq, kmax, self._rows(q_idx, staging),
                        layout=staging.put(ok) if static or not (keys == kmax).all() else None,
                        q_rows=None if (lq == Lq).all() else tuple(map(staging.put, np.nonzero(q_ok))))
        idx = idx.reshape(-1)
        if from_pool:
            slots = m.slots[np.minimum(idx, len(m.slots) - 1)]
            ch.keys = "long" if len(members) == 1 and not static and kmax > self.key_chunk else "pool"
            ch.k_index = staging.put(slots if ch.keys == "long" else np.concatenate([slots, slots + self.n_slots]))
        else:                                         # keys at the query rows: no second gather of them
            ch.k_index = ch.q_index if np.array_equal(idx, q_idx) else staging.put(idx)
        return ch

    def _rows(self, idx: np.ndarray, staging: Staging) -> torch.Tensor | None:
        """Rows of the step's q, k, v staged (None: all of them in order)."""
        n = int(self.meta.cu_q[-1])
        return None if idx.size == n and (idx == np.arange(n)).all() else staging.put(idx)

    def finalize(self) -> None:
        for ch in self.chunks:
            if ch.layout is not None:
                ch.ready = ch.layout.to(torch.int32) if self.packed else key_bias(ch.layout.bool(), self.dtype)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pool = self.pool.storage[layer] if self.pool is not None and self.pool.storage.numel() else None
        if self.store_slots is not None:
            pool[0, self.store_slots] = k if self.store_src is None else k[self.store_src]
            pool[1, self.store_slots] = v if self.store_src is None else v[self.store_src]
        if self.select_plan is not None:
            self.policy.select(self.select_plan, pool, q, k, v)
        if len(self.chunks) == 1 and self.chunks[0].dst is None:
            return self._attend(self.chunks[0], q, k, v, pool).reshape(q.shape)
        out = q.new_empty(q.shape)
        for ch in self.chunks:
            out[ch.dst] = self._attend(ch, q, k, v, pool)
        return out

    def _attend(self, ch: _Chunk, q, k, v, pool) -> torch.Tensor:
        hkv, d = k.shape[1:]
        qq = q if ch.q_index is None else q[ch.q_index]
        if ch.keys == "long":       # the pool's K and V a piece at a time, gathered heads first: [Hkv, n, D]
            n = key_piece(self.key_chunk, ch.Lq, self.pool.cfg.n_heads, hkv, d, pool.dtype)
            kt, vt = pool[0].transpose(0, 1), pool[1].transpose(0, 1)
            pieces = ((kt[:, ch.k_index[a : a + n]], vt[:, ch.k_index[a : a + n]]) for a in range(0, ch.kmax, n))
            o = attention_over_key_chunks(qq.reshape(-1, *q.shape[1:]), pieces)
            return o if self.packed else o.view(1, *o.shape)
        if ch.keys == "in_place":
            K, V = pool[0], pool[1]
        elif ch.keys == "pool":
            K, V = pool.view(-1, hkv, d)[ch.k_index].view(2, -1, hkv, d).unbind(0)
        else:
            K, V = (k, v) if ch.k_index is None else (k[ch.k_index], v[ch.k_index])
        if self.packed:
            return self.kernel(qq, K, V, ch.ready[0], ch.ready[1], ch.Lq, ch.kmax)
        o = padded_attention(qq.view(-1, ch.Lq, *q.shape[1:]), K.view(-1, ch.kmax, hkv, d),
                             V.view(-1, ch.kmax, hkv, d), ch.ready)
        return o if ch.q_rows is None else o[ch.q_rows]


def split_by_keys(members: np.ndarray, key_lens: np.ndarray, budget: int) -> list[np.ndarray]:
    """Consecutive members, each chunk's padded key rows (count x longest) within the budget."""
    if members.size and len(members) * int(key_lens.max()) <= budget:
        return [members]                          # the usual step: one call, no per-member loop
    chunks, first, longest = [], 0, 0
    for i, n in enumerate(key_lens.tolist()):
        if i > first and (i - first + 1) * max(longest, n) > budget:
            chunks.append(members[first:i])
            first, longest = i, 0
        longest = max(longest, n)
    return (chunks + [members[first:]]) if members.size else []
