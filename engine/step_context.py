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

The step's RoPE rows are gathered once (`rotation`) and handed to every layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import flash_varlen, key_bias, padded_attention
from engine.cache_policy import CachePolicy, KeySpec
from engine.kv_cache import KVPool
from engine.ragged import excl_cumsum, padded, ragged
from engine.request import Phase, Request


@dataclass
class _Chunk:
    G: int
    Lq: int
    q_index: torch.Tensor              # [G*Lq] packed query rows (padded), or [ΣLq] for flash
    cache_index: torch.Tensor | None   # [G*kmax] pool slots
    kmax: int
    fresh_index: torch.Tensor | None   # [G*fmax] packed rows of fresh K/V
    fmax: int
    key_mask: torch.Tensor | None      # [G, kmax + fmax]
    bias: torch.Tensor | None = None   # the same as an additive SDPA mask (padded path)
    cu_q: list[int] | None = None      # flash: packed query and key offsets
    cu_k: list[int] | None = None


class StepContext:
    def __init__(self, batch: list[tuple[Request, Phase]], cu_q: list[int], policy: CachePolicy, pool: KVPool | None,
                 rotation, backend: str, key_budget: int, device, dtype: torch.dtype):
        self.batch, self.cu_q, self.policy, self.pool, self.backend = batch, cu_q, policy, pool, backend
        self.rotation, self.device, self.dtype = rotation, device, dtype
        n_q = [cu_q[i + 1] - cu_q[i] for i in range(len(batch))]
        specs = [policy.spec(req, phase, n) for (req, phase), n in zip(batch, n_q)]
        self._plan_stores(specs, n_q)
        self.select_plan = policy.plan_select([(req, cu_q[i]) for i, (req, phase) in enumerate(batch)
                                               if phase is Phase.REFRESH_SELECT])
        self.chunks: list[_Chunk] = []
        out_pos = [0] * len(batch)            # where each request's first output row lands
        base = 0
        for refresh in (True, False):
            members = [i for i, (_, p) in enumerate(batch) if p.is_refresh == refresh]
            for chunk in _split(members, [specs[i].cached + specs[i].fresh for i in members], key_budget):
                ch = self._chunk(chunk, specs, n_q)
                for g, i in enumerate(chunk):
                    out_pos[i] = base + (ch.cu_q[g] if ch.cu_q is not None else g * ch.Lq)
                base += ch.cu_q[-1] if ch.cu_q is not None else ch.G * ch.Lq
                self.chunks.append(ch)
        identity = all(out_pos[i] == cu_q[i] for i in range(len(batch))) and base == cu_q[-1]
        self.out_index = None if identity else ragged(out_pos, n_q, device)

    def _plan_stores(self, specs: list[KeySpec], n_q: list[int]) -> None:
        st = [i for i, s in enumerate(specs) if s.store_from >= 0]
        self.store_slots = self.store_src = None
        if st:
            tables = [self.batch[i][0].slots for i in st]
            all_slots = torch.cat(tables)
            offs = excl_cumsum([t.numel() for t in tables])
            self.store_slots = all_slots[ragged([o + specs[i].store_from for o, i in zip(offs, st)], [n_q[i] for i in st], self.device)]
            self.store_src = ragged([self.cu_q[i] for i in st], [n_q[i] for i in st], self.device)

    def _chunk(self, chunk: list[int], specs: list[KeySpec], n_q: list[int]) -> _Chunk:
        dev = self.device
        G = len(chunk)
        lq = [n_q[i] for i in chunk]
        kc = [specs[i].cached for i in chunk]
        kf = [specs[i].fresh for i in chunk]
        Lq, kmax, fmax = max(lq), max(kc), max(kf)
        cache_index = fresh_index = None
        valid = []
        if kmax:
            tables = [self.batch[i][0].slots for i in chunk]
            all_slots = torch.cat([t if t is not None else t_empty(dev) for t in tables])
            idx, ok = padded(excl_cumsum([0 if t is None else t.numel() for t in tables]), kc, kmax, dev)
            slots = all_slots[idx.clamp_(max=all_slots.numel() - 1).view(-1)]
            cache_index = torch.cat([slots, slots + self.pool.storage.shape[2]])     # K rows, then V rows
            valid.append(ok)
        if fmax:
            idx, ok = padded([self.cu_q[i] for i in chunk], kf, fmax, dev)
            fresh_index = idx.view(-1)
            valid.append(ok)
        lens_k = [a + b for a, b in zip(kc, kf)]
        full = all(n == kmax for n in kc) and all(n == fmax for n in kf)
        key_mask = None if full else (valid[0] if len(valid) == 1 else torch.cat(valid, 1))
        starts = [self.cu_q[i] for i in chunk]
        if self.backend == "flash_attn":
            cu_q = [0, *torch.tensor(lq).cumsum(0).tolist()]
            cu_k = [0, *torch.tensor(lens_k).cumsum(0).tolist()]
            return _Chunk(G, Lq, ragged(starts, lq, dev), cache_index, kmax, fresh_index, fmax, key_mask,
                          cu_q=cu_q, cu_k=cu_k)
        q_index, _ = padded(starts, lq, Lq, dev)
        bias = None if key_mask is None else key_bias(key_mask, self.dtype)
        return _Chunk(G, Lq, q_index.view(-1), cache_index, kmax, fresh_index, fmax, key_mask, bias)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pool = self.pool.storage[layer] if self.pool is not None and self.pool.storage.numel() else None  # [2, S, Hkv, D]
        if self.store_slots is not None:
            pool[0, self.store_slots] = k[self.store_src]
            pool[1, self.store_slots] = v[self.store_src]
        if self.select_plan is not None:
            self.policy.select(self.select_plan, pool, q, k, v)
        outs = [self._attend(ch, q, k, v, pool) for ch in self.chunks]
        o = outs[0] if len(outs) == 1 else torch.cat(outs)
        return o if self.out_index is None else o[self.out_index]

    def _attend(self, ch: _Chunk, q, k, v, pool) -> torch.Tensor:
        hkv, d = k.shape[1:]
        ks, vs = [], []
        if ch.cache_index is not None:                # K and V of every member in one indexed read
            kv = pool.view(-1, hkv, d)[ch.cache_index].view(2, ch.G, ch.kmax, hkv, d)
            ks.append(kv[0])
            vs.append(kv[1])
        if ch.fresh_index is not None:
            ks.append(k[ch.fresh_index].view(ch.G, ch.fmax, hkv, d))
            vs.append(v[ch.fresh_index].view(ch.G, ch.fmax, hkv, d))
        K = ks[0] if len(ks) == 1 else torch.cat(ks, 1)
        V = vs[0] if len(vs) == 1 else torch.cat(vs, 1)
        if ch.cu_q is not None:                      # flash-attn varlen: packed keys
            if ch.key_mask is not None:
                K, V = K[ch.key_mask], V[ch.key_mask]
            else:
                K, V = K.reshape(-1, hkv, d), V.reshape(-1, hkv, d)
            return flash_varlen(q[ch.q_index], ch.cu_q, K, V, ch.cu_k)
        qg = q[ch.q_index].view(ch.G, ch.Lq, *q.shape[1:])
        return padded_attention(qg, K, V, ch.bias).reshape(ch.G * ch.Lq, *q.shape[1:])


def t_empty(device) -> torch.Tensor:
    return torch.zeros(0, dtype=torch.long, device=device)


def _split(members: list[int], key_lens: list[int], budget: int) -> list[list[int]]:
    """Consecutive members, each chunk's padded key rows (count x longest) within the budget."""
    chunks: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i, n in zip(members, key_lens):
        if cur and (len(cur) + 1) * max(longest, n) > budget:
            chunks.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        chunks.append(cur)
    return chunks
