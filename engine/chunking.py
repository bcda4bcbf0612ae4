"""A Refresh longer than the token budget, run layer by layer in chunks of its tokens (docs/MEMORY.md,
"The chunked Refresh"; its scheduling: engine.scheduler; its chunk: engine.profiler)."""
from __future__ import annotations

import torch

from engine import sparse
from engine.attention import PACKED, PackedKernel, attention_over_key_chunks, key_piece, padded_attention
from engine.config import EngineConfig
from engine.models import DenseLM, rms_norm
from engine.request import Phase, Request


class LongRefresh:
    """One chunked Refresh's state (the canvas's hidden states, one layer's K/V) and its moments."""

    def __init__(self, model: DenseLM, req: Request, phase: Phase, config: EngineConfig, backend: str):
        self.model, self.req, self.config = model, req, config
        self.L, self.hkv, self.hd = req.length, model.config.kv_heads, model.config.head_dim
        self.positions = torch.arange(self.L, device=model.device)
        self.h = model.embed(req.canvas)                           # [L, d]: updated in place, layer by layer
        self.kv = self.h.new_empty(2, self.L, self.hkv, self.hd)  # one layer's K/V of the whole canvas
        self.s, self.e = req.block_range
        self.kernel = PackedKernel(backend) if backend in PACKED else None
        self.store = phase is Phase.REFRESH_STORE and req.slots is not None
        self.keep = req.kv_tokens - req.block_length if phase is Phase.REFRESH_SELECT and req.slots is not None else 0

    def _rot(self, a: int, b: int):
        return self.model.rope.at(self.positions[a:b], self.h.dtype, top=b - 1)

    def _q(self, blk, a: int, b: int) -> torch.Tensor:
        return self._rot(a, b)(blk.q_proj(rms_norm(self.h[a:b], blk.attn_norm.weight, blk.eps))
                               .view(-1, blk.n_heads, self.hd))

    def kv_pass(self, blk, a: int, b: int) -> None:
        """Tokens [a, b)'s RoPE'd K/V of this layer into the layer buffer."""
        n = rms_norm(self.h[a:b], blk.attn_norm.weight, blk.eps)
        self.kv[0, a:b] = self._rot(a, b)(blk.k_proj(n).view(-1, self.hkv, self.hd))
        self.kv[1, a:b] = blk.v_proj(n).view(-1, self.hkv, self.hd)

    def cache(self, i: int, blk, storage: torch.Tensor | None) -> None:
        """What the cache policy keeps of layer i (`storage`: the pool's [layers, 2, ...] tensor)."""
        slots, s, e, keep, c = self.req.slots, self.s, self.e, self.keep, self.config
        if self.store:
            storage[i, 0, slots[: self.L]] = self.kv[0]
            storage[i, 1, slots[: self.L]] = self.kv[1]
        if keep > 0:            # `CachePolicy.select` for this one member, its packed K freed before its V's
            q = self._q(blk, s, e)
            ctx = torch.cat([torch.arange(0, s, device=q.device), torch.arange(e, self.L, device=q.device)])
            kc = self.kv[0][ctx].transpose(0, 1)[None]                              # [1, Hkv, Lc, D]
            idx = sparse.select_many(q[None], kc, [(self.L - (e - s), keep, None)], keep, c.selection,
                                     c.pool_window, c.score_query)                  # [1, Hkv, keep]
            storage[i, 0, slots[:keep]] = sparse.pack(kc, idx)[0].transpose(0, 1)
            del kc
            vc = self.kv[1][ctx].transpose(0, 1)[None]
            storage[i, 1, slots[:keep]] = sparse.pack(vc, idx)[0].transpose(0, 1)

    def chunk_pass(self, blk, a: int, b: int) -> None:
        """Tokens [a, b) through the rest of the layer (attention over every key, MLP), in place."""
        x, q, L, key_chunk = self.h[a:b], self._q(blk, a, b), self.L, self.config.max_num_batched_tokens
        if self.kernel is not None:
            cu_q, cu_k = (torch.tensor([0, n], dtype=torch.int32, device=q.device) for n in (b - a, L))
            o = self.kernel(q, self.kv[0], self.kv[1], cu_q, cu_k, b - a, L)
            del cu_q, cu_k
        elif L > key_chunk:     # the keys in pieces (`key_piece`), [Hkv, n, D] views
            n = key_piece(key_chunk, q.shape[0], q.shape[1], self.hkv, self.hd, q.dtype)
            kt, vt = self.kv[0].transpose(0, 1), self.kv[1].transpose(0, 1)
            o = attention_over_key_chunks(q, ((kt[:, j : j + n], vt[:, j : j + n]) for j in range(0, L, n)))
        else:
            o = padded_attention(q[None], self.kv[0][None], self.kv[1][None], None)[0]
        o = o.reshape(b - a, -1)
        del q
        x = x + blk.attn_out(o)
        del o
        self.h[a:b] = x + blk.mlp(x)


@torch.no_grad()
def refresh_rows(model: DenseLM, req: Request, phase: Phase, storage: torch.Tensor | None,
                 config: EngineConfig, chunk: int, backend: str = "sdpa") -> torch.Tensor:
    """`req`'s chunked Refresh, its cache written into `storage` -> the rows a Reuse step queries (block, shift)."""
    run = LongRefresh(model, req, phase, config, backend)
    bounds = [(a, min(a + chunk, req.length)) for a in range(0, req.length, chunk)]
    for i, blk in enumerate(model.blocks):
        for a, b in bounds:
            run.kv_pass(blk, a, b)
        run.cache(i, blk, storage)
        for a, b in bounds:
            run.chunk_pass(blk, a, b)
    return model.final_norm(run.h[run.s - min(run.s, model.config.shift) : run.e])
