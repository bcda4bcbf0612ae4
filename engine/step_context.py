"""A step's attention: each member's keys by its cache mode (`CachePolicy`) and the per-layer callable
(`StepContext`), planned on the host from `StepMeta` (docs/ENGINE.md, docs/MECHANISMS.md)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine import sparse
from engine.attention import PACKED, attention_over_key_chunks, key_bias, key_piece, padded_attention
from engine.config import EngineConfig
from engine.kv_cache import CODES, KVPool
from engine.ragged import offsets, padded, ragged
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


@dataclass
class _Chunk:
    G: int
    Lq: int                            # padded: query rows per member; packed: the longest
    members: np.ndarray                # the step's members in this chunk, in order
    q_index: torch.Tensor | None       # packed query rows ([G*Lq] padded, [ΣLq] packed); None: q as it is
    kmax: int                          # padded: keys per member; packed: a bound on a member's keys
    kv_index: torch.Tensor | None = None     # keys from the pool: its rows, K slots then the same slots' V rows
    fresh_index: torch.Tensor | None = None  # else keys from the step's own K/V: their packed rows (None: k)
    in_place: bool = False             # packed: the keys are the pool layer itself (`_in_place`)
    long_keys: bool = False            # one member's pool keys past `key_chunk`: attended in key chunks
    key_mask: torch.Tensor | None = None   # padded: [G, kmax] 1 = a real key (None: all are)
    q_rows: tuple | None = None            # padded, ragged Lq: (member, row) of each real output row
    dst: torch.Tensor | None = None        # the output row of each real query row (None: in order)
    cu_q: torch.Tensor | None = None       # packed: query / key offsets (staged int64)
    cu_k: torch.Tensor | None = None
    bias: torch.Tensor | None = None       # set by finalize: the additive SDPA mask of padding keys
    cu_q32: torch.Tensor | None = None     # set by finalize: cu_seqlens as the kernels take them
    cu_k32: torch.Tensor | None = None


class StepContext:
    """`static_keys`: a CUDA graph bucket's keys per member (padded) or per group (packed), 0: read in place;
    `in_place=False` gathers every group's keys; `key_chunk`: gathered key rows per call."""

    def __init__(self, meta: StepMeta, policy: CachePolicy, pool: KVPool | None, backend: str, key_budget: int,
                 staging: Staging, dtype: torch.dtype, static_keys: int | None = None, kernel=None,
                 in_place: bool = True, key_chunk: int | None = None):
        self.meta, self.policy, self.pool, self.kernel, self.dtype = meta, policy, pool, kernel, dtype
        self.static_keys, self.key_budget, self.key_chunk = static_keys, key_budget, key_chunk or key_budget
        self.packed = backend in PACKED
        self.n_slots = pool.storage.shape[2] if pool is not None else 0
        self.in_place = in_place and self.packed and pool is not None and kernel.reads_in_place(
            pool.cfg.n_heads, pool.cfg.kv_heads)
        spec, m = policy.spec(meta), meta
        st = np.flatnonzero(spec.store_from >= 0)
        self.store_slots = self.store_src = None
        if st.size:                   # every query row but the query-only `lead` rows (docs/ENGINE.md)
            n = m.n_q[st] - m.lead[st]
            self.store_slots = staging.put(m.slots[ragged(m.slot_base[st] + spec.store_from[st], n)])
            src = ragged(m.cu_q[st] + m.lead[st], n)
            self.store_src = None if _identity(src, int(m.cu_q[-1])) else staging.put(src)
        self.select_plan = policy.plan_select(meta, staging)
        self.chunks: list[_Chunk] = []
        for refresh in (True, False):
            members = np.flatnonzero(meta.refresh == refresh)
            if not members.size:
                continue
            if self.packed:
                self.chunks += self._packed_chunks(members, spec, staging)
            else:
                key_lens = (spec.cached + spec.fresh)[members]
                parts = [members] if static_keys is not None else split_by_keys(members, key_lens, self.key_chunk)
                self.chunks += [self._chunk(part, spec, staging) for part in parts]
        if len(self.chunks) > 1 or (self.chunks and self.chunks[0].in_place and self.chunks[0].q_index is not None):
            for ch in self.chunks:
                dst = ragged(meta.cu_q[ch.members], meta.n_q[ch.members])
                square = not self.packed and ch.q_rows is None    # [G, Lq] output, no reshape
                ch.dst = staging.put(dst.reshape(ch.G, ch.Lq) if square else dst)

    def _packed_chunks(self, members: np.ndarray, spec: KeySpec, staging: Staging) -> list[_Chunk]:
        """A phase group under a packed kernel: members whose slot table is one range read in place, the rest
        gathered into one call, each with pool keys past `key_chunk` alone."""
        m, kc, out = self.meta, spec.cached[members], []
        if self.in_place and kc.all() and not self.static_keys:
            first = m.slots[m.slot_base[members]]
            dummy = first == self.pool.scratch
            whole = _contiguous(m.slots, m.slot_base[members], kc) | dummy
            if self.static_keys == 0 and not whole.all():
                raise AssertionError("a graph's in-place step needs every slot table in one piece")
            if whole.any():
                out.append(self._in_place(members[whole], np.where(dummy, 0, kc)[whole], first[whole], staging))
            members = members[~whole]
        elif self.static_keys == 0:
            raise AssertionError("a graph's in-place step (static keys 0) on a group not read in place")
        long = spec.cached[members] > (self.key_chunk if not self.static_keys else np.iinfo(np.int64).max)
        parts = [members[~long]] if not long.all() else []
        return out + [self._chunk(p, spec, staging) for p in parts + [members[i : i + 1] for i in np.flatnonzero(long)]]

    def _in_place(self, members: np.ndarray, keys: np.ndarray, first: np.ndarray, staging: Staging) -> _Chunk:
        """Reuse members read in place by range start (keyless last): a query-less segment up to each range, then it."""
        m = self.meta
        order = np.argsort(np.where(keys > 0, first, np.iinfo(np.int64).max), kind="stable")
        members, keys, first = members[order], keys[order], first[order]
        start = np.where(keys > 0, first, np.max(first + keys, where=keys > 0, initial=0))
        gaps = start - np.concatenate([[0], np.maximum.accumulate(start + keys)[:-1]])
        assert (gaps >= 0).all(), "slot ranges of two requests overlap"
        lq = m.n_q[members]
        seg_q = np.stack([np.zeros_like(lq), lq], 1).reshape(-1)
        seg_k = np.stack([gaps, keys], 1).reshape(-1)
        q_idx = ragged(m.cu_q[members], lq)
        static = self.static_keys is not None         # a graph: the order is staged even when it is the identity
        kmax = self.n_slots if static else max(1, int(seg_k.max()))
        return _Chunk(len(members), int(lq.max()), members,
                      None if not static and _identity(q_idx, int(m.cu_q[-1])) else staging.put(q_idx), kmax,
                      in_place=True, cu_q=staging.put(offsets(seg_q)), cu_k=staging.put(offsets(seg_k)))

    def _chunk(self, chunk: np.ndarray, spec: KeySpec, staging: Staging) -> _Chunk:
        m = self.meta
        G, n_total = len(chunk), int(m.cu_q[-1])
        lq, kc, kf, starts = m.n_q[chunk], spec.cached[chunk], spec.fresh[chunk], m.cu_q[chunk]
        if kc.any() and kf.any():
            raise AssertionError("a cache policy must take one group's keys from one source (pool or fresh)")
        from_pool = bool(kc.any())
        keys = kc if from_pool else kf
        base = m.slot_base[chunk] if from_pool else starts
        Lq = int(lq.max())
        if self.packed:
            q_idx = ragged(starts, lq)
            idx = ragged(base, keys)
            kmax = int(keys.max())
            if self.static_keys:                      # padded to a static total with the last real key
                idx = np.concatenate([idx, np.full(self.static_keys - idx.size, idx[-1] if idx.size else 0)])
                kmax = self.key_budget
            ch = _Chunk(G, Lq, chunk, None if _identity(q_idx, n_total) else staging.put(q_idx), kmax,
                        cu_q=staging.put(offsets(lq)), cu_k=staging.put(offsets(keys)))
        else:
            kmax = self.static_keys or int(keys.max())
            idx, ok = padded(base, keys, kmax)
            q_idx, q_ok = padded(starts, lq, Lq)
            flat_q = q_idx.reshape(-1)                # ragged Lq repeats rows, so it is never the identity
            ch = _Chunk(G, Lq, chunk, None if _identity(flat_q, n_total) else staging.put(flat_q), kmax,
                        key_mask=staging.put(ok) if self.static_keys or not (keys == kmax).all() else None,
                        q_rows=None if (lq == Lq).all() else tuple(map(staging.put, np.nonzero(q_ok))))
        if from_pool:
            slots = m.slots[np.minimum(idx, len(m.slots) - 1).reshape(-1)]
            ch.long_keys = G == 1 and not self.static_keys and kmax > self.key_chunk
            ch.kv_index = staging.put(slots if ch.long_keys else np.concatenate([slots, slots + self.n_slots]))
        else:                                         # keys at the query rows: no second gather of them
            ch.fresh_index = ch.q_index if np.array_equal(idx, q_idx) else staging.put(idx.reshape(-1))
        return ch

    def finalize(self) -> None:
        """The tensors derived on the device from staged ones: the first thing of the forward."""
        for ch in self.chunks:
            if ch.key_mask is not None:
                ch.bias = key_bias(ch.key_mask.bool(), self.dtype)
            if ch.cu_q is not None:
                ch.cu_q32, ch.cu_k32 = ch.cu_q.to(torch.int32), ch.cu_k.to(torch.int32)

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
        """The chunk's query rows in its member order, attended."""
        hkv, d = k.shape[1:]
        qq = q if ch.q_index is None else q[ch.q_index]
        if ch.in_place:
            return self.kernel(qq, pool[0], pool[1], ch.cu_q32, ch.cu_k32, ch.Lq, ch.kmax)
        if ch.long_keys:            # the pool's K and V a piece at a time, gathered heads first: [Hkv, n, D]
            n = key_piece(self.key_chunk, ch.Lq, self.pool.cfg.n_heads, hkv, d, pool.dtype)
            kt, vt = pool[0].transpose(0, 1), pool[1].transpose(0, 1)
            pieces = ((kt[:, ch.kv_index[a : a + n]], vt[:, ch.kv_index[a : a + n]]) for a in range(0, ch.kmax, n))
            o = attention_over_key_chunks(qq.reshape(-1, *q.shape[1:]), pieces)
            return o if self.packed else o.view(1, *o.shape)
        if ch.kv_index is not None:
            K, V = pool.view(-1, hkv, d)[ch.kv_index].view(2, -1, hkv, d).unbind(0)
        else:
            K, V = (k, v) if ch.fresh_index is None else (k[ch.fresh_index], v[ch.fresh_index])
        if self.packed:
            return self.kernel(qq, K, V, ch.cu_q32, ch.cu_k32, ch.Lq, ch.kmax)
        o = padded_attention(qq.view(ch.G, ch.Lq, *q.shape[1:]), K.view(ch.G, ch.kmax, hkv, d),
                             V.view(ch.G, ch.kmax, hkv, d), ch.bias)
        return o if ch.q_rows is None else o[ch.q_rows]


def _identity(idx: np.ndarray, n: int) -> bool:
    return idx.size == n and bool((idx == np.arange(n)).all())


def _contiguous(slots: np.ndarray, base: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Per member: whether its first n slot-table entries are consecutive ascending slots."""
    breaks = np.concatenate([[0], np.cumsum(np.diff(slots) != 1)])
    return breaks[base + n - 1] == breaks[base]


def split_by_keys(members: np.ndarray, key_lens: np.ndarray, budget: int) -> list[np.ndarray]:
    """Consecutive members, each chunk's padded key rows (count x longest) within the budget."""
    if not members.size:
        return []
    if len(members) * int(key_lens.max()) <= budget:
        return [members]
    chunks: list[np.ndarray] = []
    first, longest = 0, 0
    for i, n in enumerate(key_lens.tolist()):
        if i > first and (i - first + 1) * max(longest, n) > budget:
            chunks.append(members[first:i])
            first, longest = i, 0
        longest = max(longest, n)
    chunks.append(members[first:])
    return chunks
