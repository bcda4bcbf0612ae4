"""A Refresh longer than the step's token budget, run layer by layer in chunks along its tokens
(every token through the unchunked Refresh's operations), and the chunk the profiler picks for
it. How and why: docs/MEMORY.md, "The chunked Refresh"; its scheduling: engine.scheduler."""
from __future__ import annotations

import torch

from engine import sparse
from engine.attention import PACKED, PackedKernel, attention_over_key_chunks, key_piece, padded_attention
from engine.config import EngineConfig
from engine.memory import MemoryMeter
from engine.models import DenseLM, rms_norm
from engine.request import Phase, Request

MIN_CHUNK = 32      # the smallest chunk the profiler measures (then powers of two)
NEAR_BEST = 1.1     # `choose_chunk`'s tolerance over the smallest chunk's peak


def default_chunk(config: EngineConfig) -> int:
    """Without a profile (no memory budget): half the token budget."""
    return config.refresh_chunk_tokens or max(1, config.max_num_batched_tokens // 2)


class LongRefresh:
    """The state of one chunked Refresh (the canvas's hidden states, one layer's K/V) and its
    moments: a chunk's K/V, the layer's cache write, a chunk's attention and FFN."""

    def __init__(self, model: DenseLM, req: Request, phase: Phase, config: EngineConfig, backend: str):
        cfg = model.config
        self.model, self.req, self.config, self.backend = model, req, config, backend
        self.L, self.hkv, self.hd = req.length, cfg.kv_heads, cfg.head_dim
        self.positions = torch.arange(self.L, device=model.device)
        self.h = model.embed(req.canvas)                           # [L, d]: updated in place, layer by layer
        self.kv = self.h.new_empty(2, self.L, self.hkv, self.hd)  # one layer's K/V of the whole canvas
        self.s, self.e = req.block_range
        self.kernel = PackedKernel(backend) if backend in PACKED else None
        self.store = phase is Phase.REFRESH_STORE and req.slots is not None
        self.keep = req.kv_tokens - req.block_length if phase is Phase.REFRESH_SELECT and req.slots is not None else 0

    def _rot(self, a: int, b: int):
        return self.model.rope.at(self.positions[a:b], self.h.dtype, top=b - 1)

    def kv_pass(self, blk, a: int, b: int) -> None:
        """Tokens [a, b)'s RoPE'd K/V of this layer into the layer buffer."""
        n = rms_norm(self.h[a:b], blk.attn_norm.weight, blk.eps)
        self.kv[0, a:b] = self._rot(a, b)(blk.k_proj(n).view(-1, self.hkv, self.hd))
        self.kv[1, a:b] = blk.v_proj(n).view(-1, self.hkv, self.hd)

    def cache(self, i: int, blk, storage: torch.Tensor | None) -> None:
        """What the cache policy keeps of layer i (`storage`: the pool's [layers, 2, ...] tensor)."""
        slots = self.req.slots
        if self.store:
            storage[i, 0, slots[: self.L]] = self.kv[0]
            storage[i, 1, slots[: self.L]] = self.kv[1]
        if self.keep > 0:
            s, e = self.s, self.e
            q = self._rot(s, e)(blk.q_proj(rms_norm(self.h[s:e], blk.attn_norm.weight, blk.eps))
                                .view(-1, blk.n_heads, self.hd))
            _select(q, self.kv, s, e, self.keep, slots, storage[i], self.config)

    def chunk_pass(self, blk, a: int, b: int) -> None:
        """Tokens [a, b) through the rest of the layer (attention over every key, MLP), in place."""
        x = self.h[a:b]
        q = self._rot(a, b)(blk.q_proj(rms_norm(x, blk.attn_norm.weight, blk.eps)).view(-1, blk.n_heads, self.hd))
        o = _attend(q, self.kv, self.kernel, self.config.max_num_batched_tokens).reshape(b - a, -1)
        del q
        x = x + blk.attn_out(o)
        del o
        self.h[a:b] = x + blk.mlp(x)

    def block_rows(self) -> torch.Tensor:
        """The block's rows and, for a shifted family, the `shift` rows before it (a Reuse step's rows)."""
        return self.model.final_norm(self.h[self.s - min(self.s, self.model.config.shift) : self.e])


@torch.no_grad()
def refresh_rows(model: DenseLM, req: Request, phase: Phase, storage: torch.Tensor | None,
                 config: EngineConfig, chunk: int, backend: str = "sdpa") -> torch.Tensor:
    """The chunked Refresh of `req`'s canvas (its cache written as `phase` says, into `storage`: the
    pool's [layers, 2, slots, Hkv, D]) -> the final-normed rows of `LongRefresh.block_rows`."""
    run = LongRefresh(model, req, phase, config, backend)
    bounds = [(a, min(a + chunk, req.length)) for a in range(0, req.length, chunk)]
    for i, blk in enumerate(model.blocks):
        for a, b in bounds:
            run.kv_pass(blk, a, b)
        run.cache(i, blk, storage)
        for a, b in bounds:
            run.chunk_pass(blk, a, b)
    return run.block_rows()


@torch.no_grad()
def measure_moments(model: DenseLM, req: Request, phase: Phase, storage: torch.Tensor | None,
                    config: EngineConfig, chunks: list[int], backend: str) -> tuple[int, int, dict[int, int]]:
    """Measured bytes of a chunked Refresh of `req` on its first layer: (its state, what the cache
    write adds, {chunk: what a chunk's K/V pass or attention + FFN adds at most})."""
    with MemoryMeter(model.device) as m:
        run = LongRefresh(model, req, phase, config, backend)
    state = m.peak_bytes
    blk = model.blocks[0]
    for a in range(0, req.length, max(chunks)):
        run.kv_pass(blk, a, min(a + max(chunks), req.length))
    with MemoryMeter(model.device) as m:
        run.cache(0, blk, storage)
    cache = m.peak_bytes
    per_chunk = {}
    for c in chunks:
        with MemoryMeter(model.device) as m:
            run.kv_pass(blk, 0, c)
        kv = m.peak_bytes
        with MemoryMeter(model.device) as m:
            run.chunk_pass(blk, 0, c)
        per_chunk[c] = max(kv, m.peak_bytes)
    return state, cache, per_chunk


def _attend(q: torch.Tensor, kv: torch.Tensor, kernel: PackedKernel | None, key_chunk: int) -> torch.Tensor:
    """One chunk's queries [C, Hq, D] against the whole canvas's keys (past `key_chunk`: in pieces)."""
    L = kv.shape[1]
    if kernel is None and L > key_chunk:
        n = key_piece(key_chunk, q.shape[0], q.shape[1], kv.shape[2], q.shape[2], q.dtype)
        kt, vt = kv[0].transpose(0, 1), kv[1].transpose(0, 1)                 # [Hkv, L, D] views
        return attention_over_key_chunks(q, ((kt[:, a : a + n], vt[:, a : a + n]) for a in range(0, L, n)))
    if kernel is None:
        return padded_attention(q[None], kv[0][None], kv[1][None], None)[0]
    n = q.shape[0]
    cu = lambda k: torch.tensor([0, k], dtype=torch.int32, device=q.device)   # noqa: E731
    return kernel(q, kv[0], kv[1], cu(n), cu(L), n, L)


def _select(q_block: torch.Tensor, kv: torch.Tensor, s: int, e: int, keep: int, slots: torch.Tensor,
            pool: torch.Tensor, config: EngineConfig) -> None:
    """`SparseCache.select` for one member: the block [s, e)'s queries pick `keep` context tokens
    per KV head, their K then V packed into the first slots."""
    L = kv.shape[1]
    ctx = torch.cat([torch.arange(0, s, device=kv.device), torch.arange(e, L, device=kv.device)])
    kc = kv[0][ctx].transpose(0, 1)[None]                              # [1, Hkv, Lc, D]
    idx = sparse.select_many(q_block[None], kc, [(L - (e - s), keep, None)], keep, config.selection,
                             config.pool_window, config.score_query)   # [1, Hkv, keep]
    pool[0, slots[:keep]] = sparse.pack(kc, idx)[0].transpose(0, 1)
    del kc
    vc = kv[1][ctx].transpose(0, 1)[None]
    pool[1, slots[:keep]] = sparse.pack(vc, idx)[0].transpose(0, 1)


def choose_chunk(peaks: dict[int, int], activation_budget: int) -> int:
    """The largest chunk whose peak fits `activation_budget`, else the largest within `NEAR_BEST` of
    the smallest chunk's peak (docs/MEMORY.md, "Profiling")."""
    fits = [c for c, p in peaks.items() if p <= activation_budget]
    if fits:
        return max(fits)
    best = min(peaks.values())
    return max(c for c, p in peaks.items() if p <= best * NEAR_BEST)
