"""CUDA graphs for Reuse-only steps, padded to batch buckets, kept only where they are faster."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engine.config import EngineConfig, cuda_graphs_on
from engine.kv_cache import AUTO, kv_need
from engine.kv_cache import CODES as CACHE_CODES
from engine.request import Phase, Request
from engine.sampling import SamplingParams
from engine.step import CODES, Staging, StepMeta

KEY_GRANULE = 16          # key widths below 128 are multiples of this
TIMED_RUNS = 3            # replays and eager runs timed per bucket (after one warm-up each)


def enabled(config: EngineConfig, device) -> bool:
    """Whether steps run bucketed: `cuda_graphs`, by default on CUDA (on a CPU: plain calls)."""
    return cuda_graphs_on(config.cuda_graphs, torch.device(device))


def eager(config: EngineConfig) -> EngineConfig:
    """`config` without graphs (the profiler's measured steps, tensor-parallel ranks)."""
    return dataclasses.replace(config, cuda_graphs=False)


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every 8 up to max_num_seqs (and max_num_seqs itself)."""
    sizes = {b for b in (1, 2, 4) if b <= max_num_seqs} | set(range(8, max_num_seqs + 1, 8)) | {max_num_seqs}
    return tuple(sorted(sizes))


def bucket(n: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= n), None)


def warm_up_plan(config: EngineConfig, block_length: int, prompt_len: int, max_batch: int | None,
                 holds: Callable[[int], bool], shift: int = 0) -> tuple[str, int, list[int]]:
    """(cache mode, KV slots each, buckets) `StepGraphs.capture_all` captures, decided without a model."""
    mode = "dual" if config.cache == AUTO else config.cache
    need = kv_need(mode, prompt_len + block_length, block_length, config.retention)
    if mode == "none" or need == 0:
        return mode, need, []
    buckets = batch_buckets(config.max_num_seqs)
    last = (bucket(max_batch, buckets) if max_batch is not None else None) or buckets[-1]
    sizes = []
    for b in buckets:
        if b > last or b * (block_length + shift) > config.max_num_batched_tokens or not holds(b * need):
            break
        sizes.append(b)
    return mode, need, sizes


def warm_up_requests(b: int, mode: str, need: int, block_length: int, prompt_len: int, mask_id: int,
                     device) -> list[Request]:
    """The `b` synthetic one-block requests a bucket is captured on (slots: the caller's)."""
    params = SamplingParams(gen_length=block_length, steps=block_length, block_length=block_length)
    reqs = [Request(f"graph-{b}-{i}", [0] * prompt_len, params, mask_id, device, cache=mode) for i in range(b)]
    for req in reqs:
        req.kv_tokens = need
    return reqs


def keeps(graph_ms: float, eager_ms: float) -> bool:
    """A bucket replays its graph only if it timed faster than the step eager, unpadded."""
    return graph_ms < eager_ms


def key_width(n: int) -> int:
    """n keys rounded up to a multiple of max(16, 2^⌊log2 n⌋ / 8): at most 1/8 more from 128 on."""
    n = max(int(n), 1)
    step = max(KEY_GRANULE, (1 << (n.bit_length() - 1)) >> 3)
    return -(-n // step) * step


@dataclass
class PadSpec:
    """Dummy members appended to a Reuse-only step."""

    members: int                  # members after padding (the batch bucket)
    keys: int                     # static keys: gathered in all (packed) or per member (padded); 0 = in place
    scratch: int                  # the pool slot no request owns
    lead: int = 0                 # query-only rows before each block (the model's shift), dummies' too


def pad_meta(m: StepMeta, spec: PadSpec) -> StepMeta:
    """`m` (Reuse members, one block length) plus dummy members up to `spec.members`."""
    n, bl, s = spec.members - len(m.n_q), int(m.block_len[0]), spec.lead
    if n <= 0:
        return m
    nq = bl + s                   # a dummy's canvas: `lead` rows, then its block
    dummy = dict(offset=0, length=nq, block_len=bl, block_start=s, kv=bl, k=0, phase=CODES[Phase.REUSE], slot_len=nq,
                 refresh=False, q_start=0, n_q=nq, lead=s, cache=CACHE_CODES["dual"])
    cols = {f: np.concatenate([getattr(m, f), np.full(n, v, dtype=getattr(m, f).dtype)])
            for f, v in dummy.items() if getattr(m, f) is not None}
    return StepMeta(**cols, slot_base=np.concatenate([m.slot_base, len(m.slots) + nq * np.arange(n, dtype=np.int64)]),
                    slots=np.concatenate([m.slots, np.full(n * nq, spec.scratch, dtype=np.int64)]),
                    cu_q=np.concatenate([m.cu_q, m.cu_q[-1] + nq * np.arange(1, n + 1, dtype=np.int64)]))


class CudaCapture:
    """Captures a forward as a CUDA graph and times calls with CUDA events."""

    def __init__(self):
        self.mempool = torch.cuda.graph_pool_handle()

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
        """Mean milliseconds of `fn` over TIMED_RUNS calls after an untimed one."""
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(TIMED_RUNS):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / TIMED_RUNS


@dataclass
class _Entry:
    staging: Staging | None
    captured: object | None               # the PackedStep the graph was captured with
    graph: object | None = None
    out: torch.Tensor | None = None
    decision: str = "plain"               # graph | eager | plain (no capture: plain calls)
    graph_ms: float | None = None
    eager_ms: float | None = None
    steps: int = 0
    dummies: int = 0


class StepGraphs:
    """Per (bucket, key width, block length): a staging buffer and, with a `capturer`, its graph."""

    def __init__(self, runner, capturer=None):
        self.runner, self.pool = runner, runner.pool
        if capturer is None and runner.device.type == "cuda" and self.pool.capacity is not None:
            capturer = CudaCapture()
        self.capturer = capturer
        self.buckets = batch_buckets(runner.config.max_num_seqs)
        self.entries: dict[tuple[int, int, int], _Entry] = {}
        self.replays = self.dummies = 0      # steps run padded (graph replays or plain calls), their dummies
        runner.model.rope.reserve(runner.max_model_len, runner.device, runner.dtype)

    def takes(self, batch) -> bool:
        """Reuse-only, one block length, within the largest bucket and the token budget once padded."""
        if any(p is not Phase.REUSE for _, p in batch):
            return False
        bl = batch[0][0].block_length
        b = bucket(len(batch), self.buckets)
        if b is None or any(r.block_length != bl for r, _ in batch) or \
                b * (bl + self.runner.model_config.shift) > self.runner.config.max_num_batched_tokens:
            return False
        if self._in_place():   # a fragmented slot table runs eager, not a graph per key width
            return all(self.pool.contiguous(req.slots) for req, _ in batch)
        return self.runner.kernel is not None or b * self._keys(batch) <= self.runner.key_budget

    def _in_place(self) -> bool:
        r = self.runner
        return r.kernel is not None and r.in_place_keys and r.kernel.reads_in_place(r.model_config.n_heads,
                                                                                  r.model_config.kv_heads)

    def _keys(self, batch) -> int:
        r = self.runner
        if self._in_place():
            return 0
        keys = [r.policy.reuse_keys(req) for req, _ in batch]
        dummy = batch[0][0].block_length + r.model_config.shift
        if r.kernel is None:
            return key_width(max(keys + [dummy]))
        return key_width(sum(keys) + (bucket(len(batch), self.buckets) - len(batch)) * dummy)

    def _spec(self, batch) -> tuple[PadSpec, tuple[int, int, int]]:
        spec = PadSpec(bucket(len(batch), self.buckets), self._keys(batch), self.pool.scratch,
                       self.runner.model_config.shift)
        return spec, (spec.members, spec.keys, batch[0][0].block_length)

    def capture_all(self, block_length: int, prompt_len: int = 1, max_batch: int | None = None) -> int:
        """Decide every bucket for Reuse steps of `block_length` now, as its first step would -> how many new."""
        r = self.runner
        mode, need, sizes = warm_up_plan(r.config, block_length, prompt_len, max_batch, self.pool.can_reserve,
                                         r.model_config.shift)
        new = 0
        for b in sizes:
            reqs = warm_up_requests(b, mode, need, block_length, prompt_len, r.model_config.mask_token_id, r.device)
            for req in reqs:
                req.slots, req.kv_pool = self.pool.reserve(need), self.pool
            batch = [(req, Phase.REUSE) for req in reqs]
            try:
                spec, key = self._spec(batch) if self.takes(batch) else (None, None)
                if spec is not None and key not in self.entries:
                    self._first(key, batch, spec)
                    new += 1
            finally:
                for req in reqs:
                    self.pool.release(need, req.slots)
        return new

    def run(self, batch) -> tuple[object, torch.Tensor, bool] | None:
        """The step padded -> (PackedStep, the real rows' hidden states, replayed?); None: it runs eager."""
        r = self.runner
        spec, key = self._spec(batch)
        entry = self.entries.get(key)
        if entry is None:
            entry, p = self._first(key, batch, spec)
        elif entry.decision != "eager":
            p = r.prepare(batch, spec, entry.staging)
        entry.steps += 1
        if entry.decision == "eager":
            return None
        if entry.graph is not None:
            entry.graph.replay()
        hidden = entry.out if entry.graph is not None else r.forward(entry.captured)
        entry.dummies += spec.members - len(batch)
        self.replays += 1
        self.dummies += spec.members - len(batch)
        return p, hidden[: int(p.meta.cu_q[-1])], entry.graph is not None

    def _first(self, key, batch, spec: PadSpec):
        """A bucket's first step: its staging buffer, and with a capturer its graph."""
        r, cap = self.runner, self.capturer
        eager_ms = None
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
                entry.graph, entry.out, entry.decision = graph, out, "graph"
            else:
                entry.staging = entry.captured = None
                entry.decision = "eager"
        return entry, p

    def report(self) -> list[dict]:
        return [{"batch": b, "keys": k, "block_length": bl, "decision": e.decision, "graph_ms": e.graph_ms,
                 "eager_ms": e.eager_ms, "steps": e.steps, "dummies": e.dummies}
                for (b, k, bl), e in sorted(self.entries.items())]
