"""StepContext: the attention callable of one packed engine step (nano-vllm's context object,
without the global). Built once per step, called once per layer.

Per layer it does a fixed number of tensor ops whatever the batch size: one indexed write
stores the fresh K/V of every request that stores (dual cache), then each phase group —
Refresh sequences (keys = their own canvas) and Reuse sequences (keys = cache slots + fresh
block) — is one padded attention call (`padded_attention`; flash-attn varlen on CUDA) whose
keys are gathered from the pool by the requests' slot tables in one indexed read. A group is
split into chunks only when its padded keys would exceed `key_budget` rows, which bounds the
transient memory (the profiler measures a full chunk). The sparse Refresh-select of all
selecting requests is one batched scoring per layer (`SparseCache.select`).

Every index tensor is built once per step on the host from the step's `StepMeta` columns
(numpy, `engine.ragged`), so building the context costs a fixed number of torch calls too.
The step's RoPE rows are gathered once (`rotation`) and handed to every layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.attention import flash_varlen, key_bias, padded_attention
from engine.cache_policy import CachePolicy, KeySpec
from engine.kv_cache import KVPool
from engine.ragged import padded, ragged, to_device
from engine.step_meta import StepMeta


@dataclass
class _Chunk:
    G: int
    Lq: int
    q_index: torch.Tensor              # [G*Lq] packed query rows (padded), or [ΣLq] for flash
    cache_index: torch.Tensor | None   # [2*G*kmax] pool rows: K slots, then V slots
    kmax: int
    fresh_index: torch.Tensor | None   # [G*fmax] packed rows of fresh K/V
    fmax: int
    bias: torch.Tensor | None = None   # padded path: additive SDPA mask of the padding keys
    members: np.ndarray | None = None  # the step's members in this chunk, in order
    dst: torch.Tensor | None = None    # several chunks: the output row of each real query row ([G, Lq] if none is padding)
    q_valid: torch.Tensor | None = None  # padded path, ragged Lq: [G, Lq] True = a real query row
    cu_q: list[int] | None = None      # flash: packed query and key offsets
    cu_k: list[int] | None = None
    packed: PackedKeys | None = None   # flash: where each key of the packed K/V comes from


@dataclass
class PackedKeys:
    """The varlen key layout of a group (flash-attn): member i's keys are rows
    [cu_k[i], cu_k[i+1]) of one packed K (and V), its cached keys first, then its fresh ones.
    Every key is copied once, from the pool or from the step's K/V, straight to its row."""

    total: int
    cache_src: torch.Tensor | None     # pool rows (K slots, then the same slots' V rows)
    cache_dst: torch.Tensor | None
    fresh_src: torch.Tensor | None     # packed rows of the step's fresh K/V
    fresh_dst: torch.Tensor | None


def packed_keys(slot_base: np.ndarray, slots: np.ndarray, n_slots: int, cached: np.ndarray, starts: np.ndarray,
                fresh: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Index math of `PackedKeys` (host arrays): member i reads `cached[i]` slots from its table
    at `slot_base[i]` in `slots`, then `fresh[i]` fresh rows from `starts[i]`; `n_slots`: the
    pool's slot count (V rows follow K rows). -> (cu_k, cache_src, cache_dst, fresh_src, fresh_dst)."""
    cu_k = np.zeros(len(cached) + 1, dtype=np.int64)
    np.cumsum(cached + fresh, out=cu_k[1:])
    src = slots[ragged(slot_base, cached)]
    return (cu_k, np.concatenate([src, src + n_slots]), ragged(cu_k[:-1], cached), ragged(starts, fresh),
            ragged(cu_k[:-1] + cached, fresh))


class StepContext:
    def __init__(self, meta: StepMeta, policy: CachePolicy, pool: KVPool | None, rotation, backend: str,
                 key_budget: int, device, dtype: torch.dtype):
        self.meta, self.policy, self.pool, self.backend = meta, policy, pool, backend
        self.rotation, self.device, self.dtype = rotation, device, dtype
        spec = policy.spec(meta)
        self._plan_stores(spec)
        self.select_plan = policy.plan_select(meta, device)
        self.chunks: list[_Chunk] = []
        key_lens = spec.cached + spec.fresh
        for refresh in (True, False):
            members = np.flatnonzero(meta.refresh == refresh)
            for chunk in _split(members, key_lens[members], key_budget):
                self.chunks.append(self._chunk(chunk, spec))
        if len(self.chunks) > 1:                      # only then do rows need placing (`__call__`)
            for ch in self.chunks:
                dst = to_device(ragged(meta.cu_q[ch.members], meta.n_q[ch.members]), device)
                ch.dst = dst if ch.q_valid is not None or ch.packed is not None else dst.view(ch.G, ch.Lq)

    def _plan_stores(self, spec: KeySpec) -> None:
        m = self.meta
        st = np.flatnonzero(spec.store_from >= 0)
        self.store_slots = self.store_src = None
        if st.size:
            idx = ragged(m.slot_base[st] + spec.store_from[st], m.n_q[st])
            self.store_slots = to_device(m.slots[idx], self.device)
            self.store_src = to_device(ragged(m.cu_q[st], m.n_q[st]), self.device)

    def _chunk(self, chunk: np.ndarray, spec: KeySpec) -> _Chunk:
        m, dev = self.meta, self.device
        G = len(chunk)
        lq, kc, kf, starts = m.n_q[chunk], spec.cached[chunk], spec.fresh[chunk], m.cu_q[chunk]
        Lq, kmax, fmax = int(lq.max()), int(kc.max()), int(kf.max())
        cache_index = fresh_index = None
        valid = []
        if kmax:
            idx, ok = padded(m.slot_base[chunk], kc, kmax)
            slots = m.slots[np.minimum(idx, len(m.slots) - 1).reshape(-1)]
            cache_index = to_device(np.concatenate([slots, slots + self.pool.storage.shape[2]]), dev)
            valid.append(ok)
        if fmax:
            idx, ok = padded(starts, kf, fmax)
            fresh_index = to_device(idx.reshape(-1), dev)
            valid.append(ok)
        full = (kc == kmax).all() and (kf == fmax).all()
        key_mask = None if full else (valid[0] if len(valid) == 1 else np.concatenate(valid, 1))
        if self.backend == "flash_attn":
            n_slots = self.pool.storage.shape[2] if self.pool is not None else 0
            cu_k, c_src, c_dst, f_src, f_dst = packed_keys(m.slot_base[chunk], m.slots, n_slots, kc, starts, kf)
            t = lambda a: to_device(a, dev) if a.size else None  # noqa: E731
            return _Chunk(G, Lq, to_device(ragged(starts, lq), dev), None, kmax, None, fmax, members=chunk,
                          cu_q=[0, *np.cumsum(lq).tolist()], cu_k=cu_k.tolist(),
                          packed=PackedKeys(int(cu_k[-1]), t(c_src), t(c_dst), t(f_src), t(f_dst)))
        q_index, q_ok = padded(starts, lq, Lq)
        bias = None if key_mask is None else key_bias(to_device(key_mask, dev), self.dtype)
        q_valid = None if (lq == Lq).all() else to_device(q_ok, dev)
        return _Chunk(G, Lq, to_device(q_index.reshape(-1), dev), cache_index, kmax, fresh_index, fmax, bias,
                      members=chunk, q_valid=q_valid)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pool = self.pool.storage[layer] if self.pool is not None and self.pool.storage.numel() else None  # [2, S, Hkv, D]
        if self.store_slots is not None:
            pool[0, self.store_slots] = k[self.store_src]
            pool[1, self.store_slots] = v[self.store_src]
        if self.select_plan is not None:
            self.policy.select(self.select_plan, pool, q, k, v)
        if len(self.chunks) == 1:                     # every member, in packed order
            ch = self.chunks[0]
            o = self._attend(ch, q, k, v, pool)
            return o[ch.q_valid] if ch.q_valid is not None else o.reshape(q.shape)
        # Each chunk writes its real rows straight to their packed positions: no concatenation
        # of the groups' outputs and no reorder afterwards.
        out = q.new_empty(q.shape)
        for ch in self.chunks:
            o = self._attend(ch, q, k, v, pool)
            out[ch.dst] = o if ch.q_valid is None else o[ch.q_valid]
        return out

    def _attend(self, ch: _Chunk, q, k, v, pool) -> torch.Tensor:
        hkv, d = k.shape[1:]
        if ch.packed is not None:                     # flash-attn varlen: keys packed in place
            p = ch.packed
            K, V = k.new_empty(p.total, hkv, d), v.new_empty(p.total, hkv, d)
            if p.cache_src is not None:
                kc, vc = pool.view(-1, hkv, d)[p.cache_src].view(2, -1, hkv, d).unbind(0)
                K[p.cache_dst], V[p.cache_dst] = kc, vc
            if p.fresh_src is not None:
                K[p.fresh_dst], V[p.fresh_dst] = k[p.fresh_src], v[p.fresh_src]
            return flash_varlen(q[ch.q_index], ch.cu_q, K, V, ch.cu_k)
        ks, vs = [], []
        if ch.cache_index is not None:                # K and V of every member in one indexed read
            kc, vc = pool.view(-1, hkv, d)[ch.cache_index].view(2, ch.G, ch.kmax, hkv, d).unbind(0)
            ks.append(kc)
            vs.append(vc)
        if ch.fresh_index is not None:
            ks.append(k[ch.fresh_index].view(ch.G, ch.fmax, hkv, d))
            vs.append(v[ch.fresh_index].view(ch.G, ch.fmax, hkv, d))
        K = ks[0] if len(ks) == 1 else torch.cat(ks, 1)
        V = vs[0] if len(vs) == 1 else torch.cat(vs, 1)
        qg = q[ch.q_index].view(ch.G, ch.Lq, *q.shape[1:])
        return padded_attention(qg, K, V, ch.bias)          # [G, Lq, Hq, D]


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
