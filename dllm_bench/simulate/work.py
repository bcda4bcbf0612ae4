"""What each system computes in one forward, as a cost_model.Forward — read from the request
state the real scheduler or static batch hands over, never from token values.

* `engine_forward`: one packed engine step: a Refresh queries its whole canvas, a Reuse its
  block against the cache (dual: every position, sparse: the kept ones, each request in its own
  mode under `cache=auto`), a shifted family's Reuse also the `shift` rows before the block
  (query-only, never stored: engine.step.StepMeta.lead); logits only for the block's still-masked
  rows, in chunks of the logit budget. With CUDA graphs a Reuse-only step runs padded to its bucket (`graph_key`; those captured at
  warm-up, and the steps they are timed on: `warm_up_steps`).
* `baseline_forward`: one static-batch forward of a baseline policy, padded to the batch's
  canvas, with the StepResult the real policy reports for it.

Candidate rows follow the linear transfer schedule (engine.unmask.transfer_schedule): a block's
k-th step has block_length − Σ schedule[:k] masked positions (decoders never propose the mask).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from baselines.dllm_cache import DLLMCache
from baselines.dream import DreamSampler
from baselines.fast_dllm import FastDLLM
from baselines.llada import LLaDASampler
from baselines.registry import SYSTEMS
from baselines.sparse_dllm import SparseDLLM
from baselines.static_batch import Batch, StepResult
from dllm_bench.simulate.cost_model import Call, Forward, LayerPass, ModelShape, Seg
from engine.config import EngineConfig
from engine.graphs import batch_buckets, bucket, key_width, warm_up_plan
from engine.request import Phase, Request
from engine.sampling import SamplingParams
from engine.step_context import split_by_keys


def masked_in_block(req) -> int:
    """Still-masked positions of the current block (engine Request or baseline Batch row)."""
    return req.params.block_length - sum(req.block_commits[: req.step_in_block])


def engine_forward(batch: list[tuple[Request, Phase]], config: EngineConfig, shape: ModelShape,
                   key_budget: int | None = None) -> tuple[Forward, list[int]]:
    """The step's Forward and what each request is charged in logits rows. `key_budget` (the
    runner's padded key rows per call): the engine attends through padded SDPA (a CPU, fp32, or
    attention_backend=sdpa), so its attention calls and key gathers are charged padded
    (`padded_calls`); None: a packed kernel, every segment as it is."""
    segs, charged = [], []
    rows = kv_read = kv_write = cached = 0
    reuse = Phase.REUSE
    for req, phase in batch:
        blk = req.params.block_length
        L = req.prompt_len + req.params.gen_length      # req.length without a tensor call
        cand = masked_in_block(req)
        if phase is not reuse:
            q, k = L, L
            if phase is Phase.REFRESH_STORE:
                kv_write += L
            elif phase is Phase.REFRESH_SELECT:
                kv_write += req.kv_tokens - blk          # the retained tokens; the block slots follow
        else:
            # dual and sparse alike: the block's K/V are written into their slots, then every key
            # the request reserved (dual: the canvas; sparse: retained + block) is read from the pool.
            q = blk + min(req.prompt_len + req.block * blk, shape.shift)     # the edge rows: queries only
            k = req.kv_tokens
            kv_read += k
            cached += k
            kv_write += blk
        segs.append(Seg(q, k))
        r = q if config.max_num_logits is None else cand
        charged.append(r)
        rows += r
    n_ref = sum(1 for _, p in batch if p is not reuse)
    calls = None
    if key_budget is not None:
        refresh = np.array([p is not reuse for _, p in batch])
        calls = padded_calls(segs, refresh, key_budget)
        kv_read = sum(c.g * c.k for c, from_pool in calls if from_pool)    # every padded key is gathered
        calls = tuple(c for c, _ in calls)
    fw = Forward((LayerPass(shape.layers, tuple(segs), calls=calls),), rows=rows, kv_read=kv_read, kv_write=kv_write,
                 cached_key_layers=cached * shape.layers, n_seq=len(batch), softmax_rows=rows,
                 lm_chunk=config.max_num_logits or 0, refresh=n_ref)
    return fw, charged


def padded_calls(segs: list[Seg], refresh: np.ndarray, key_budget: int) -> list[tuple[Call, bool]]:
    """The padded path's attention calls of one step, as engine.step_context makes them: the
    Refresh members (keys: their own canvas) and the Reuse members (keys: their cache slots) each
    one group, split into consecutive chunks within `key_budget` padded key rows, every member
    of a chunk padded to its longest queries and keys; with whether its keys come from the pool."""
    q = np.array([s.q for s in segs])
    k = np.array([s.k for s in segs])
    out = []
    for is_refresh in (True, False):
        members = np.flatnonzero(refresh == is_refresh)
        for part in split_by_keys(members, k[members], key_budget) if members.size else []:
            out.append((Call(len(part), int(q[part].max()), int(k[part].max())), not is_refresh))
    return out


def key_budget(config: EngineConfig, model_config) -> int:
    """The engine runner's padded key rows per attention call (engine.runner.ModelRunner.key_chunk)."""
    return config.max_num_batched_tokens


def graph_key(batch: list[tuple[Request, Phase]], config: EngineConfig,
              in_place: bool = False, shift: int = 0) -> tuple[int, int, int] | None:
    """(bucket, key width, block length) of the CUDA graph a step replays (engine.graphs.StepGraphs.takes:
    Reuse only, one block length, the padded batch (each member `shift` edge rows more) within the token
    budget), or None: it runs eagerly.
    Keys read `in_place` (`keys_in_place`): width 0, one graph serves every step of its bucket; else
    the padded-SDPA width (every member's keys to `key_width` of the longest). Whether the bucket
    keeps its graph is the runner's (runners.CostRunner); a fragmented pool's step is not known
    here: it counts as the bucket's."""
    if not batch or any(p is not Phase.REUSE for _, p in batch):
        return None
    bl = batch[0][0].params.block_length
    b = bucket(len(batch), batch_buckets(config.max_num_seqs))
    if b is None or any(r.params.block_length != bl for r, _ in batch) or b * (bl + shift) > config.max_num_batched_tokens:
        return None
    # each Reuse reads its reserved keys, a dummy member at most its block and edge rows (StepGraphs._spec)
    return b, _width(max(max(req.kv_tokens for req, _ in batch), bl + shift), in_place), bl


def _width(keys: int, in_place: bool) -> int:
    return 0 if in_place else key_width(keys)


def keys_in_place(config: EngineConfig, gpu: bool) -> bool:
    """Whether the engine's Reuse steps read their keys in place from the KV pool: on a GPU in
    bf16/fp16 its default backend is a packed varlen kernel (engine.attention.choose_backend) that
    does; padded SDPA (attention_backend=sdpa, fp32, a CPU) gathers them."""
    return gpu and config.attention_backend != "sdpa" and config.dtype in ("bfloat16", "float16")


def warm_up_steps(config: EngineConfig, block_length: int, prompt_len: int, max_batch: int | None,
                  holds: Callable[[int], bool], mask_id: int, in_place: bool = False,
                  shift: int = 0) -> dict[tuple[int, int, int], list[tuple[Request, Phase]]]:
    """The graphs the engine captures at warm-up (engine.graphs.warm_up_plan, as `graph_key` keys
    them), each with the Reuse step of synthetic one-block requests after a `prompt_len` prompt it
    is timed on (`warm_up_requests`), one bucket each. Its requests are alike: one
    stands for them all (a thousand-request bucket builds no thousand requests)."""
    mode, need, sizes = warm_up_plan(config, block_length, prompt_len, max_batch, holds, shift)
    if not sizes:
        return {}
    (req,) = warm_up_requests(1, mode, need, block_length, prompt_len, mask_id, "cpu")
    return {(b, _width(max(need, block_length + shift), in_place), block_length): [(req, Phase.REUSE)] * b
            for b in sizes}


def warm_up_requests(b: int, mode: str, need: int, block_length: int, prompt_len: int, mask_id: int,
                     device) -> list[Request]:
    """The `b` synthetic one-block requests a bucket is timed on, as engine.graphs.StepGraphs.capture_all
    builds them (slots: the caller's)."""
    params = SamplingParams(gen_length=block_length, steps=block_length, block_length=block_length)
    reqs = [Request(f"graph-{b}-{i}", [0] * prompt_len, params, mask_id, device, cache=mode) for i in range(b)]
    for req in reqs:
        req.kv_tokens = need
    return reqs


def padded(fw: Forward, key: tuple[int, int, int], shift: int = 0) -> Forward:
    """`fw` as its graph replays it: dummy members (the `shift` edge rows and one block of queries
    over as many keys, the block written to the pool's scratch slot: engine.graphs.pad_meta) up to
    the bucket; their rows are dropped before decoding."""
    b, width, bl = key
    extra = b - fw.n_seq
    (p,) = fw.passes
    nq = bl + shift
    # padded SDPA under a graph: every member's keys padded to the bucket's key width
    calls = None if p.calls is None else (Call(b, nq, width or max(c.k for c in p.calls)),)
    kv_read = fw.kv_read if calls is None else b * calls[0].k
    return replace(fw, passes=(LayerPass(p.layers, p.segs + (Seg(nq, nq),) * extra, calls=calls),),
                   kv_write=fw.kv_write + extra * bl, kv_read=kv_read, graph=True)


def _kept(batch: Batch, keep_ratio: float) -> int:
    """Sparse-dLLM's largest kept count over the rows: int(ratio · context) of its own context."""
    s, e = batch.block_range
    return max(int(((s - pad) + (batch.length - e)) * keep_ratio) for pad in batch.pads)


def baseline_forward(name: str, knobs: dict, batch: Batch, shape: ModelShape) -> tuple[Forward, StepResult]:
    """One forward of baseline `name` (knobs as the policy holds them) on static batch `batch`."""
    return baseline_work(name).forward(knobs, batch, shape)


def _uniform(batch: Batch, shape: ModelShape, q: int, k: int) -> tuple[LayerPass, ...]:
    return (LayerPass(shape.layers, (Seg(q, k),) * batch.size),)


def _full(batch: Batch, shape: ModelShape, kv_write: int = 0) -> tuple[Forward, StepResult]:
    """A forward of the whole canvas, every row a Refresh."""
    B, L = batch.size, batch.length
    return (Forward(_uniform(batch, shape, L, L), rows=B * L, kv_write=kv_write, n_seq=B, softmax_rows=B * L,
                    refresh=B), StepResult(B * L, L, True))


class BaselineWork:
    """What one baseline computes per forward and holds in KV (its policy in baselines/*.py):
    `forward`, `kv_row_tokens` (each row's cached tokens after a step) and `memo_key` (what besides
    the batch's shape decides a forward). When a block ends is the policy's own `fixed_forwards`."""

    def forward(self, knobs: dict, batch: Batch, shape: ModelShape) -> tuple[Forward, StepResult]:
        return _full(batch, shape)

    def kv_row_tokens(self, knobs: dict, batch: Batch) -> list[int]:
        return [0] * batch.size

    def memo_key(self, batch: Batch) -> tuple:
        return ()


class FastDLLMWork(BaselineWork):
    def forward(self, knobs, batch, shape):
        B, L, i = batch.size, batch.length, batch.step_in_block
        s, e = batch.block_range
        blk = e - s
        dual = knobs.get("fast_dllm_cache", "dual") == "dual"
        if i == 0:
            return _full(batch, shape, kv_write=B * (L if dual else s))
        q0, q1 = s, (e if dual else L)
        q = q1 - q0
        held = L if dual else s
        k = L if dual else s + q
        # Every key is RoPE'd in every layer; the block's own (dual: written in place) are fresh.
        cached = held - blk if dual else held
        fw = Forward(_uniform(batch, shape, q, k), rows=B * q, kv_read=B * held, kv_write=B * blk if dual else 0,
                     cached_key_layers=B * cached * shape.layers, n_seq=B, softmax_rows=B * q)
        return fw, StepResult(B * q, q, False)

    def kv_row_tokens(self, knobs, batch):
        held = batch.length if knobs.get("fast_dllm_cache", "dual") == "dual" else batch.block_range[0]
        return [max(0, held - p) for p in batch.pads]


class SparseDLLMWork(BaselineWork):
    def forward(self, knobs, batch, shape):
        B, i = batch.size, batch.step_in_block
        s, e = batch.block_range
        blk = e - s
        if i <= 1:
            return _full(batch, shape, kv_write=B * _kept(batch, knobs.get("keep_ratio", 0.5)) if i == 1 else 0)
        kept = _kept(batch, knobs.get("keep_ratio", 0.5))
        fw = Forward(_uniform(batch, shape, blk, kept + blk), rows=B * blk, kv_read=B * kept, n_seq=B,
                     softmax_rows=B * blk)
        return fw, StepResult(B * blk, blk, False)

    def kv_row_tokens(self, knobs, batch):
        if batch.step_in_block < 2:   # called after the step: the kept set exists from step 1 on
            return [0] * batch.size
        s, e = batch.block_range
        r = knobs.get("keep_ratio", 0.5)
        return [int(((s - p) + (batch.length - e)) * r) for p in batch.pads]

    def memo_key(self, batch):
        return tuple(batch.pads)


class DLLMCacheWork(BaselineWork):
    def forward(self, knobs, batch, shape):
        return _dllm_cache(knobs, batch, shape)

    def kv_row_tokens(self, knobs, batch):
        return [batch.row_length(i) for i in range(batch.size)]

    def memo_key(self, batch):
        return (batch.forwards,)


# Each registry policy's cost description (baselines.registry.SYSTEMS[name].policy).
WORK: dict[type, BaselineWork] = {LLaDASampler: BaselineWork(), DreamSampler: BaselineWork(), FastDLLM: FastDLLMWork(),
                                  SparseDLLM: SparseDLLMWork(), DLLMCache: DLLMCacheWork()}


def baseline_work(name: str) -> BaselineWork:
    work = WORK.get(SYSTEMS[name].policy) if name in SYSTEMS else None
    if work is None:
        raise ValueError(f"no cost description for baseline {name!r}")
    return work


def _dllm_cache(knobs: dict, batch: Batch, shape: ModelShape) -> tuple[Forward, StepResult]:
    """Layer 0 always refreshes; the others by the prompt/gen intervals at global step t, with
    V-verify of every gen token and Q/K/attention/MLP for the int(G · ratio) least similar."""
    B, L, P = batch.size, batch.length, batch.prompt_len
    G = L - P
    t = batch.forwards + 1
    pi, gi, ratio = knobs["prompt_interval"], knobs["gen_interval"], knobs["transfer_ratio"]
    rp, rg = (t - 1) % pi == 0, (t - 1) % gi == 0
    transfer = 0 < ratio <= 1
    n_sel = int(G * ratio) if transfer else 0
    v_only = B * G if transfer and not rg else 0
    if rp and rg:
        q = L
    elif rg:
        q = G
    elif rp:
        q = P + n_sel
    else:
        q = n_sel
    passes = [LayerPass(1, (Seg(L, L),) * B)]
    if shape.layers > 1:
        passes.append(LayerPass(shape.layers - 1, (Seg(q, L),) * B, v_only=v_only))
    # Cached K, V and the two deltas of every token are read back in every layer; in layers 1..
    # the L - q keys not recomputed come from the (pre-RoPE) cache.
    fw = Forward(tuple(passes), rows=B * L, kv_read=2 * B * L, n_seq=B, softmax_rows=B * G,
                 cached_key_layers=B * (L - q) * (shape.layers - 1), refresh=B if rp and rg else 0)
    return fw, StepResult(B * L, L, rp and rg)
