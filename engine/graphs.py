"""CUDA graphs for Reuse-only steps, padded to batch buckets.

A Reuse step of B requests (each querying its current block against its cache) is the engine's
commonest and lightest step: on a GPU its kernels take ~15-25 ms for LLaDA-8B at 32 requests,
the same order as launching them one by one from Python. So, as vLLM and SGLang do for decode,
the engine captures such steps once per shape and replays them. The shape is made static by
padding: the batch to the next bucket (1, 2, 4, ..., 256) with dummy members, and the keys to a
power of two: with flash-attn the packed keys of the whole group (at most twice what the step
reads), with padded SDPA every member's keys (a step qualifies only while that stays within
the key budget the profiler measured). A dummy member queries one block at position 0,
stores its K/V into the pool's scratch slot (`KVPool.scratch`) and attends to it, so it can
change no request's cache; its hidden rows are dropped before decoding.

The graph's inputs are the step's staged metadata (`engine.staging`): each bucket owns a
staging buffer sized once, the same puts land at the same offsets every step, so a replay
reads the new step's ids, positions and indices from the memory the graph was captured on.
The weights, the KV pool (fixed capacity on CUDA) and the RoPE table (grown to
max_model_len first) stay where they were. Without CUDA (tests) the padding and bucketing run
the same way and the forward is a plain call, so float64 tests check that padded steps give
exactly the tokens of unpadded ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.request import Phase
from engine.staging import Staging
from engine.step_meta import CODES, StepMeta

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_KEY_WIDTH = 16


@dataclass
class PadSpec:
    """Dummy members appended to a Reuse-only step."""

    members: int                  # members after padding (the batch bucket)
    keys: int                     # static keys: in all (flash-attn) or per member (padded SDPA)
    scratch: int                  # the pool slot no request owns


def bucket(n: int) -> int | None:
    return next((b for b in BUCKETS if b >= n), None)


def key_width(n: int) -> int:
    return max(MIN_KEY_WIDTH, 1 << max(0, int(n) - 1).bit_length())


def pad_meta(m: StepMeta, spec: PadSpec) -> StepMeta:
    """`m` (Reuse members, one block length) plus dummy members up to `spec.members`."""
    n, bl = spec.members - len(m.n_q), int(m.block_len[0])
    if n <= 0:
        return m
    one = lambda v: np.full(n, v, dtype=np.int64)  # noqa: E731
    slot_base = len(m.slots) + bl * np.arange(n, dtype=np.int64)
    cu_q = np.concatenate([m.cu_q, m.cu_q[-1] + bl * np.arange(1, n + 1, dtype=np.int64)])
    cat = lambda a, b: np.concatenate([a, b])  # noqa: E731
    return StepMeta(offset=cat(m.offset, one(0)), length=cat(m.length, one(bl)), block_len=cat(m.block_len, one(bl)),
                    block_start=cat(m.block_start, one(0)), kv=cat(m.kv, one(bl)), k=cat(m.k, one(0)),
                    phase=cat(m.phase, one(CODES[Phase.REUSE])), slot_base=cat(m.slot_base, slot_base),
                    slot_len=cat(m.slot_len, one(bl)), slots=cat(m.slots, one(spec.scratch).repeat(bl)),
                    refresh=cat(m.refresh, np.zeros(n, dtype=bool)), q_start=cat(m.q_start, one(0)),
                    n_q=cat(m.n_q, one(bl)), cu_q=cu_q)


@dataclass
class _Entry:
    staging: Staging
    captured: object                     # the PackedStep the graph was captured with
    graph: object | None = None          # torch.cuda.CUDAGraph
    out: torch.Tensor | None = None      # the captured forward's output


class StepGraphs:
    """Per (bucket, key width, block length): a staging buffer and, on CUDA, a captured graph.
    `runner`: the engine's ModelRunner (prepare / forward)."""

    def __init__(self, runner):
        self.runner = runner
        self.pool = runner.pool
        self.capture = runner.device.type == "cuda" and self.pool.capacity is not None
        self.flash = runner.backend == "flash_attn"
        self.entries: dict[tuple[int, int, int], _Entry] = {}
        self.mempool = torch.cuda.graph_pool_handle() if self.capture else None
        self.replays = 0                     # steps run through a bucket (the first of each included)
        self.dummies = 0                     # dummy members they carried
        self.replayed = False                # the last step ran as a CUDA-graph replay
        runner.model.rope.reserve(runner.max_model_len, runner.device, runner.dtype)

    def takes(self, batch) -> bool:
        """Reuse-only, one block length, within the largest bucket and the token budget once padded."""
        if any(p is not Phase.REUSE for _, p in batch):
            return False
        bl = batch[0][0].block_length
        b = bucket(len(batch))
        if b is None or any(r.block_length != bl for r, _ in batch) or b * bl > self.runner.config.max_num_batched_tokens:
            return False
        return self.flash or b * self._keys(batch) <= self.runner.key_budget

    def _keys(self, batch) -> int:
        """The static key count of the step's bucket (see the module docstring)."""
        keys = [self.runner.policy.reuse_keys(r) for r, _ in batch]
        dummies = (bucket(len(batch)) - len(batch)) * batch[0][0].block_length      # a block of keys each
        return key_width(sum(keys) + dummies) if self.flash else key_width(max(keys))

    def run(self, batch) -> tuple[object, torch.Tensor]:
        """The step padded, through its graph -> (its PackedStep, the real rows' hidden states).

        A replay runs the forward as captured: with the captured step's tensors, which alias the
        bucket's staging buffer, now holding this step's metadata. Without CUDA the "replay" is
        a plain call of the forward on that captured step, so a CPU run checks the same thing:
        that a bucket's puts land where the captured step reads them."""
        r = self.runner
        spec = PadSpec(bucket(len(batch)), key_width(self._keys(batch)), self.pool.scratch)
        key = (spec.members, spec.keys, batch[0][0].block_length)
        entry = self.entries.get(key)
        if entry is None:
            sizing = Staging(r.device, buffered=True)
            r.prepare(batch, spec, sizing)           # the same puts, to size the bucket's buffer once
            staging = Staging(r.device, capacity=sizing.used, buffered=True)
            p = r.prepare(batch, spec, staging)
            entry = self.entries[key] = _Entry(staging, p)
            if self.capture:
                self._capture(entry, p)
        else:
            p = r.prepare(batch, spec, entry.staging)
        self.replayed = entry.graph is not None
        if entry.graph is not None:
            entry.graph.replay()
            hidden = entry.out
        else:
            hidden = r.forward(entry.captured)
        self.replays += 1
        self.dummies += spec.members - len(batch)
        return p, hidden[: int(p.meta.cu_q[-1])]
    def _capture(self, entry: _Entry, p) -> None:
        r = self.runner
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):             # warm-up outside the graph (allocator, kernels)
            r.forward(p)
        torch.cuda.current_stream().wait_stream(stream)
        entry.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(entry.graph, pool=self.mempool):
            entry.out = r.forward(p)
