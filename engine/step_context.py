"""StepContext: the attention callable of one packed engine step (nano-vllm's context object,
without the global). Built once per step on the host, called once per layer.

Per layer it does a fixed number of tensor ops whatever the batch size: one indexed write
stores the fresh K/V of every request that stores (dual and sparse caches), then each phase
group — Refresh sequences (keys = their own canvas) and Reuse sequences (keys = cache slots) —
is one attention call whose keys are gathered with one indexed read straight into the layout
the kernel takes. With flash-attn that is one varlen call per group over packed keys. The
padded CPU path (`padded_attention`, one SDPA call per group) splits a group into chunks only
when its padded keys would exceed `key_budget` rows, which bounds the transient memory (the
profiler measures a full chunk); flash-attn needs no padding and is never split. The sparse
Refresh-select of all selecting requests is one batched scoring per layer.

Nothing in the forward reads the device back: every index tensor, cu_seqlens included, is
built on the host from the step's `StepMeta` columns (numpy, `engine.ragged`) and staged with
the step's one host-to-device copy (`engine.staging`); rows are chosen with integer indices,
never boolean masks; what derives from staged data on the device (the padding bias, int32
cu_seqlens) is computed by `finalize`, the first thing of the forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import flash_varlen, key_bias, padded_attention
from engine.cache_policy import CachePolicy, KeySpec
from engine.kv_cache import KVPool
from engine.ragged import padded, ragged
from engine.staging import Staging
from engine.step_meta import StepMeta


@dataclass
class _Chunk:
    G: int
    Lq: int                            # padded: query rows per member; flash: the longest
    members: np.ndarray                # the step's members in this chunk, in order
    q_index: torch.Tensor | None       # packed query rows ([G*Lq] padded, [ΣLq] flash); None: q as it is
    kv_index: torch.Tensor | None      # keys from the pool: its rows, K slots then the same slots' V rows
    fresh_index: torch.Tensor | None   # keys from the step's own K/V: their packed rows
    kmax: int                          # padded: keys per member; flash: the longest
    keys_are_queries: bool = False     # the keys are the step's K/V at the query rows (a Refresh)
    key_mask: torch.Tensor | None = None   # padded: [G, kmax] 1 = a real key (None: all are)
    q_rows: tuple | None = None            # padded, ragged Lq: (member, row) of each real output row
    dst: torch.Tensor | None = None        # several chunks: the output row of each real query row
    cu_q: torch.Tensor | None = None       # flash: packed query / key offsets (staged int64)
    cu_k: torch.Tensor | None = None
    bias: torch.Tensor | None = None       # set by finalize: the additive SDPA mask of padding keys
    cu_q32: torch.Tensor | None = None     # set by finalize: cu_seqlens as flash-attn takes them
    cu_k32: torch.Tensor | None = None


class StepContext:
    """`static_keys`: pad every member's keys to this many (padded path, always with a key mask)
    or the group's packed keys to this many in all (flash), so a step's tensor shapes depend
    only on its bucket (`engine.graphs`)."""

    def __init__(self, meta: StepMeta, policy: CachePolicy, pool: KVPool | None, backend: str, key_budget: int,
                 staging: Staging, dtype: torch.dtype, static_keys: int | None = None):
        self.meta, self.policy, self.pool, self.backend, self.dtype = meta, policy, pool, backend, dtype
        self.static_keys, self.key_budget = static_keys, key_budget
        self.n_slots = pool.storage.shape[2] if pool is not None else 0
        spec = policy.spec(meta)
        self._plan_stores(spec, staging)
        self.select_plan = policy.plan_select(meta, staging)
        self.chunks: list[_Chunk] = []
        key_lens = spec.cached + spec.fresh
        for refresh in (True, False):
            members = np.flatnonzero(meta.refresh == refresh)
            parts = [members] if backend == "flash_attn" or static_keys else _split(members, key_lens[members],
                                                                                     key_budget)
            for chunk in parts:
                if chunk.size:
                    self.chunks.append(self._chunk(chunk, spec, staging))
        if len(self.chunks) > 1:                      # only then do rows need placing (`__call__`)
            for ch in self.chunks:
                dst = ragged(meta.cu_q[ch.members], meta.n_q[ch.members])
                square = backend != "flash_attn" and ch.q_rows is None    # [G, Lq] output, no reshape
                ch.dst = staging.put(dst.reshape(ch.G, ch.Lq) if square else dst)

    def _plan_stores(self, spec: KeySpec, staging: Staging) -> None:
        m = self.meta
        st = np.flatnonzero(spec.store_from >= 0)
        self.store_slots = self.store_src = None
        if st.size:
            self.store_slots = staging.put(m.slots[ragged(m.slot_base[st] + spec.store_from[st], m.n_q[st])])
            src = ragged(m.cu_q[st], m.n_q[st])
            self.store_src = None if _identity(src, int(m.cu_q[-1])) else staging.put(src)

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
        if self.backend == "flash_attn":
            q_idx = ragged(starts, lq)
            idx = ragged(base, keys)
            kmax = int(keys.max())
            if self.static_keys:                      # the packed keys padded to a static total with
                # the last real key (never read: cu_k says where each member ends); max_seqlen_k
                # must be static too, and any bound on a member's keys is valid for flash-attn
                idx = np.concatenate([idx, np.full(self.static_keys - idx.size, idx[-1] if idx.size else 0)])
                kmax = self.key_budget
            ch = _Chunk(G, Lq, chunk, None if _identity(q_idx, n_total) else staging.put(q_idx), None, None, kmax,
                        cu_q=staging.put(_offsets(lq)), cu_k=staging.put(_offsets(keys)))
        else:
            kmax = self.static_keys or int(keys.max())
            idx, ok = padded(base, keys, kmax)
            q_idx, q_ok = padded(starts, lq, Lq)
            ragged_q = not (lq == Lq).all()
            flat_q = q_idx.reshape(-1)
            ch = _Chunk(G, Lq, chunk, None if (not ragged_q and _identity(flat_q, n_total)) else staging.put(flat_q),
                        None, None, kmax,
                        key_mask=staging.put(ok) if self.static_keys or not (keys == kmax).all() else None,
                        q_rows=tuple(map(staging.put, np.nonzero(q_ok))) if ragged_q else None)
        if from_pool:
            slots = m.slots[np.minimum(idx, len(m.slots) - 1).reshape(-1)]
            ch.kv_index = staging.put(np.concatenate([slots, slots + self.n_slots]))
        elif np.array_equal(idx, q_idx):              # no second gather of the same rows
            ch.keys_are_queries = True
        else:
            ch.fresh_index = staging.put(idx.reshape(-1))
        return ch

    def finalize(self) -> None:
        """The tensors derived on the device from staged ones: the first thing of the forward."""
        for ch in self.chunks:
            if ch.key_mask is not None:
                ch.bias = key_bias(ch.key_mask.bool(), self.dtype)
            if ch.cu_q is not None:
                ch.cu_q32, ch.cu_k32 = ch.cu_q.to(torch.int32), ch.cu_k.to(torch.int32)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pool = self.pool.storage[layer] if self.pool is not None and self.pool.storage.numel() else None  # [2, S, Hkv, D]
        if self.store_slots is not None:
            pool[0, self.store_slots] = k if self.store_src is None else k[self.store_src]
            pool[1, self.store_slots] = v if self.store_src is None else v[self.store_src]
        if self.select_plan is not None:
            self.policy.select(self.select_plan, pool, q, k, v)
        if len(self.chunks) == 1:                     # every member, in packed order
            return self._attend(self.chunks[0], q, k, v, pool).reshape(q.shape)
        # Each chunk writes its real rows straight to their packed positions: no concatenation
        # of the groups' outputs and no reorder afterwards.
        out = q.new_empty(q.shape)
        for ch in self.chunks:
            out[ch.dst] = self._attend(ch, q, k, v, pool)
        return out

    def _attend(self, ch: _Chunk, q, k, v, pool) -> torch.Tensor:
        """The chunk's query rows in packed order, attended: [ΣLq, Hq, D] ([G, Lq, Hq, D] when
        the padded path has no padded query rows)."""
        hkv, d = k.shape[1:]
        qq = q if ch.q_index is None else q[ch.q_index]
        if ch.kv_index is not None:                   # K and V of every member in one indexed read
            K, V = pool.view(-1, hkv, d)[ch.kv_index].view(2, -1, hkv, d).unbind(0)
        elif ch.keys_are_queries:
            K, V = (k, v) if ch.q_index is None else (k[ch.q_index], v[ch.q_index])
        else:
            K, V = k[ch.fresh_index], v[ch.fresh_index]
        if self.backend == "flash_attn":
            return flash_varlen(qq, ch.cu_q32, K, V, ch.cu_k32, ch.Lq, ch.kmax)
        o = padded_attention(qq.view(ch.G, ch.Lq, *q.shape[1:]), K.view(ch.G, ch.kmax, hkv, d),
                             V.view(ch.G, ch.kmax, hkv, d), ch.bias)
        return o if ch.q_rows is None else o[ch.q_rows]


def _identity(idx: np.ndarray, n: int) -> bool:
    return idx.size == n and bool((idx == np.arange(n)).all())


def _offsets(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def _split(members: np.ndarray, key_lens: np.ndarray, budget: int) -> list[np.ndarray]:
    """Consecutive members, each chunk's padded key rows (count x longest) within the budget."""
    if not members.size:
        return []
    if len(members) * int(key_lens.max()) <= budget:       # the common case: one chunk
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
