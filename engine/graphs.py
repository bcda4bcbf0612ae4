"""CUDA graphs for Reuse-only steps, padded to batch buckets, kept only where they are faster."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from engine import kv_cache
from engine.config import EngineConfig
from engine.request import Phase, Request
from engine.sampling import SamplingParams
from engine.step import CODES, Staging, StepMeta


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    return tuple(sorted({b for b in (1, 2, 4) if b <= max_num_seqs} | {*range(8, max_num_seqs + 1, 8), max_num_seqs}))


def bucket(n: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= n), None)


def warm_up_plan(config: EngineConfig, block_length: int, prompt_len: int, max_batch: int | None,
                 holds: Callable[[int], bool], shift: int = 0) -> tuple[str, int, list[int]]:
    """(cache mode, KV slots each, buckets) `StepGraphs.capture_all` captures, decided without a model."""
    mode = "dual" if config.cache == kv_cache.AUTO else config.cache
    need = kv_cache.kv_need(mode, prompt_len + block_length, block_length, config.retention)    # 0: no cache, no Reuse
    buckets = batch_buckets(config.max_num_seqs)
    wanted = buckets[-1] if max_batch is None else min(max_batch, buckets[-1])
    last = min(bucket(wanted, buckets), config.max_num_batched_tokens // (block_length + shift))    # padded, in budget
    return mode, need, [b for b in buckets if need > 0 and b <= last and holds(b * need)]     # `holds`: monotone


def keeps(graph_ms: float, eager_ms: float) -> bool:
    return graph_ms < eager_ms


def key_width(n: int) -> int:
    """n keys rounded up to a multiple of max(16, 2^⌊log2 n⌋ / 8): at most 1/8 more from 128 on."""
    n = max(int(n), 1)
    step = max(16, (1 << (n.bit_length() - 1)) >> 3)
    return -(-n // step) * step


@dataclass
class PadSpec:
    members: int
    keys: int                     # static keys: gathered in all (packed) or per member (padded); 0 = in place
    scratch: int
    lead: int = 0                 # query-only rows before each block (the model's shift), dummies' too


def pad_meta(m: StepMeta, spec: PadSpec) -> StepMeta:
    """`m` (Reuse members, one block length) plus dummy members up to `spec.members`."""
    n, bl, s = spec.members - len(m.n_q), int(m.block_len[0]), spec.lead
    nq = bl + s                   # a dummy's canvas: `lead` rows, then its block
    dummy = dict(offset=0, length=nq, block_len=bl, block_start=s, kv=bl, k=0, phase=CODES[Phase.REUSE],
                 refresh=False, q_start=0, n_q=nq, lead=s, cache=kv_cache.CODES["dual"])
    cols = {f: np.concatenate([getattr(m, f), np.full(n, v, dtype=getattr(m, f).dtype)]) for f, v in dummy.items()}
    return StepMeta(**cols, slot_base=np.concatenate([m.slot_base, len(m.slots) + nq * np.arange(n, dtype=np.int64)]),
                    slots=np.concatenate([m.slots, np.full(n * nq, spec.scratch, dtype=np.int64)]),
                    cu_q=np.concatenate([m.cu_q, m.cu_q[-1] + nq * np.arange(1, n + 1, dtype=np.int64)]))


@dataclass
class CudaCapture:
    mempool: object = field(default_factory=torch.cuda.graph_pool_handle)

    def capture(self, fn):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):             # warm-up outside the graph (allocator, kernels)
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = fn()
        return graph, out

    def time_ms(self, fn, what: str) -> float:
        fn()
        runs, start, end = 3, torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(runs):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / runs


@dataclass
class _Entry:
    staging: Staging | None
    captured: object | None               # the PackedStep captured (no graph: called in its place)
    graph: object | None = None
    out: torch.Tensor | None = None
    graph_ms: float | None = None
    eager_ms: float | None = None
    steps: int = 0
    dummies: int = 0


class StepGraphs:
    """Per (bucket, key width, block length): a staging buffer and, with a `capturer`, its graph."""

    def __init__(self, runner, capturer=None):
        self.runner, self.pool = runner, runner.pool
        cuda = runner.device.type == "cuda" and self.pool.capacity is not None
        self.capturer = CudaCapture() if capturer is None and cuda else capturer
        self.buckets, self.entries = batch_buckets(runner.config.max_num_seqs), {}     # (b, keys, bl) -> _Entry
        self.replays = self.dummies = 0      # steps run padded (graph replays or plain calls), their dummies
        runner.model.rope.reserve(runner.max_model_len, runner.device, runner.dtype)

    def takes(self, batch) -> bool:
        """Reuse-only, one block length, within the largest bucket and the token budget once padded."""
        bl, b = batch[0][0].block_length, bucket(len(batch), self.buckets)
        if b is None or any(p is not Phase.REUSE or r.block_length != bl for r, p in batch):
            return False
        if b * (bl + self.runner.model_config.shift) > self.runner.config.max_num_batched_tokens:
            return False
        keys = self._spec(batch)[0].keys
        if keys == 0:   # read in place: a fragmented slot table runs eager, not a graph per key width
            return all(self.pool.contiguous(req.slots) for req, _ in batch)
        return self.runner.kernel is not None or b * keys <= self.runner.key_budget

    def _spec(self, batch) -> tuple[PadSpec, tuple[int, int, int]]:
        r, cfg, bl = self.runner, self.runner.model_config, batch[0][0].block_length
        b = bucket(len(batch), self.buckets)
        if r.kernel is not None and r.in_place_keys and r.kernel.reads_in_place(cfg.n_heads, cfg.kv_heads):
            keys = 0
        else:
            each, dummy = [req.kv_tokens if r.policy.selects else req.length for req, _ in batch], bl + cfg.shift
            keys = key_width(max(each + [dummy]) if r.kernel is None else sum(each) + (b - len(batch)) * dummy)
        return PadSpec(b, keys, self.pool.scratch, cfg.shift), (b, keys, bl)

    def capture_all(self, block_length: int, prompt_len: int = 1, max_batch: int | None = None) -> int:
        """Decide every bucket for Reuse steps of `block_length` now, as its first step would -> how many new."""
        r, before = self.runner, len(self.entries)
        mode, need, sizes = warm_up_plan(r.config, block_length, prompt_len, max_batch, self.pool.can_reserve,
                                         r.model_config.shift)
        params = SamplingParams(gen_length=block_length, steps=block_length, block_length=block_length)
        for b in sizes:
            batch = [(Request(f"graph-{b}-{i}", [0] * prompt_len, params, r.model_config.mask_token_id, r.device,
                              cache=mode), Phase.REUSE) for i in range(b)]
            for req, _ in batch:
                req.kv_tokens, req.slots, req.kv_pool = need, self.pool.reserve(need), self.pool
            try:
                spec, key = self._spec(batch)
                if self.takes(batch) and key not in self.entries:
                    self._first(batch, spec, key)
            finally:
                for req, _ in batch:
                    self.pool.release(need, req.slots)
        return len(self.entries) - before

    def run(self, batch) -> tuple[object, torch.Tensor, bool] | None:
        """The step padded -> (PackedStep, the real rows' hidden states, replayed?); None: it runs eager."""
        spec, key = self._spec(batch)
        entry = self.entries.get(key) or self._first(batch, spec, key)
        entry.steps += 1
        if entry.staging is None:
            return None
        p = self.runner.prepare(batch, spec, entry.staging)
        if entry.graph is not None:
            entry.graph.replay()
        hidden = entry.out if entry.graph is not None else self.runner.forward(entry.captured)
        entry.dummies += spec.members - len(batch)
        self.replays, self.dummies = self.replays + 1, self.dummies + spec.members - len(batch)
        return p, hidden[: int(p.meta.cu_q[-1])], entry.graph is not None

    def _first(self, batch, spec: PadSpec, key) -> _Entry:
        """A bucket's first step: its staging buffer, and with a capturer its graph (kept if faster than eager)."""
        r, cap = self.runner, self.capturer
        if cap is not None:                      # first, while nothing of the padded step is staged
            unpadded = r.prepare(batch)
            eager_ms = cap.time_ms(lambda: r.forward(unpadded), "eager")
        sizing = Staging(r.device, buffered=True)
        r.prepare(batch, spec, sizing)           # the same puts, to size the bucket's buffer once
        staging = Staging(r.device, capacity=sizing.used, buffered=True)
        p = r.prepare(batch, spec, staging)
        entry = self.entries[key] = _Entry(staging, p)
        if cap is not None:
            graph, out = cap.capture(lambda: r.forward(p))
            entry.graph_ms, entry.eager_ms = cap.time_ms(graph.replay, "graph"), eager_ms
            if keeps(entry.graph_ms, eager_ms):
                entry.graph, entry.out = graph, out
            else:
                entry.staging = entry.captured = None
        return entry
