"""The cost model in place of the forward, behind the real systems' own seams.

* `CostRunner` is an `engine.step.Runner`: `LLMEngine(config, runner=CostRunner(...))` keeps the
  engine's scheduler, KV accounting and logit budget; each step is charged the cost of the work
  `work.engine_forward` reads off the batch (with `graphs`, Reuse-only steps padded to their
  bucket where it kept its graph, a graph's first step a capture unless `capture_graphs` took it
  at warm-up). With `inner` (a real ModelRunner) it also runs the model: the simulated schedule
  is the engine's.
* `CostPolicy` is a `baselines.static_batch.Policy`: the real static batching, each forward
  charged `work.baseline_forward`'s cost.

Neither commits tokens: fixed-step schedules do not depend on token values. Under parallel
decoding each request carries its planned forwards per block (Request.planned_steps); a
Fast-dLLM batch ends a block when its slowest row's plan does, as upstream.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import torch

from baselines.static_batch import Batch, Delegating, Policy, StepResult
from dllm_bench.simulate.clock import VirtualClock
from dllm_bench.simulate.cost_model import Forward, ModelShape
from dllm_bench.simulate.work import (
    baseline_work,
    engine_forward,
    graph_key,
    key_budget,
    padded,
    warm_up_steps,
)
from engine.attention import PACKED
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.kv_cache import KVPool, bytes_per_token
from engine.step import StepStats

Cost = Callable[[Forward], float]


class ShapeModel:
    """What the engine and the static batch read from a model when nothing runs: its config,
    device and dtype (requests' canvases stay on the CPU)."""

    def __init__(self, model_config, dtype: torch.dtype = torch.bfloat16):
        self.config, self.dtype, self.device = model_config, dtype, torch.device("cpu")


class AccountingPool(KVPool):
    """The engine's KV pool with its capacity accounting (can_ever_fit, can_reserve, peak) but
    no storage: an 8B model's pool would be tens of gigabytes of address space."""

    def __init__(self, capacity_tokens: int | None, cfg, dtype: torch.dtype, device):
        self.capacity, self.cfg, self.dtype, self.device = capacity_tokens, cfg, dtype, device
        self.bytes_per_token = bytes_per_token(cfg, dtype)
        self.used = self.peak_used = 0

    def reserve(self, n: int):
        if not self.can_reserve(n):
            raise RuntimeError("KV pool over-committed: the scheduler must check can_reserve first")
        self.used += n
        self.peak_used = max(self.peak_used, self.used)
        return None

    def release(self, n: int, table=None) -> None:
        self.used -= n


class CostRunner:
    """`graphs`: the engine replays Reuse-only steps through CUDA graphs (a GPU's default), their
    keys read `in_place` or gathered (work.graph_key). `keep(key, graph, eager)`: whether a
    graph is kept, asked once, at its capture, with the step the engine times there padded and
    unpadded (on a GPU: engine.graphs.keeps on their prices); None keeps every one (plain calls
    on a CPU; runs made before the timed keep). With `inner` each real step says it itself."""

    def __init__(self, model_config, config: EngineConfig, shape: ModelShape, cost: Cost, clock: VirtualClock,
                 dtype: torch.dtype = torch.bfloat16, inner=None, graphs: bool = False, in_place: bool = False,
                 keep: Callable[[tuple[int, int, int], Forward, Forward], bool] | None = None):
        self.model_config, self.dtype, self.device = model_config, dtype, torch.device("cpu")
        self.config, self.shape, self.cost, self.clock, self.inner = config, shape, cost, clock, inner
        self.model = getattr(inner, "model", None)
        self.graphs, self.in_place, self.keep = graphs, in_place, keep
        # The engine attends through padded SDPA unless its backend is a packed kernel (a GPU's in
        # bf16/fp16): then every attention call is charged padded as it runs (work.padded_calls).
        backend = getattr(inner, "backend", None)
        packed = backend in PACKED if backend is not None else in_place
        self.key_budget = None if packed else getattr(inner, "key_chunk", None) or key_budget(config, model_config)
        self.kept: dict[tuple[int, int, int], bool] = {}       # each captured graph: replayed or not
        self.decisions: dict[str, list] = {"kept": [], "eager": []}   # the same as [bucket, keys, block]
        self.last: list = []
        self.forwards = 0

    def _decide(self, key: tuple[int, int, int], eager: Forward, kept: bool | None = None) -> bool:
        if kept is None:
            kept = self.keep is None or self.keep(key, padded(eager, key, self.shape.shift), eager)
        self.kept[key] = kept
        self.decisions["kept" if kept else "eager"].append(list(key))
        return kept

    def capture_graphs(self, block_length: int, prompt_len: int, max_batch: int | None,
                       holds: Callable[[int], bool]) -> int:
        """The graphs `LLMEngine.capture_graphs` captures and decides at warm-up, before the point's
        clock starts: none of the point's steps captures them. -> graphs new."""
        if not self.graphs:
            return 0
        steps = warm_up_steps(self.config, block_length, prompt_len, max_batch, holds,
                              self.model_config.mask_token_id, self.in_place, self.shape.shift)
        new = [key for key in steps if key not in self.kept]
        for key in new:
            self._decide(key, engine_forward(steps[key], self.config, self.shape, self.key_budget)[0])
        return len(new)

    def run(self, batch) -> StepStats:
        fw, charged = engine_forward(batch, self.config, self.shape, self.key_budget)
        self.last = [req for req, _ in batch]
        if self.inner is not None:
            st = self.inner.run(batch)
        else:
            for (req, _), rows in zip(batch, charged, strict=True):
                req.nfe += 1
                req.logits_rows += rows
            n_ref = sum(1 for _, p in batch if p.is_refresh)
            cap = self.config.max_num_logits
            st = StepStats(fw.query_tokens, fw.rows, fw.rows if cap is None else min(fw.rows, cap),
                           n_ref, len(batch) - n_ref, cache=dict(Counter(req.cache for req, _ in batch)))
        key = graph_key(batch, self.config, self.in_place, self.shape.shift) if self.graphs else None
        if key is not None:                    # the counters above are the real rows, as the engine's
            capture = key not in self.kept
            if self.inner is not None:
                # the real step says whether it replayed its graph; plain calls on a CPU keep every one
                kept = st.graph or self.inner.device.type != "cuda"
                if capture:
                    self._decide(key, fw, kept)
            else:
                kept = self._decide(key, fw) if capture else self.kept[key]
            if kept:
                fw = replace(padded(fw, key, self.shape.shift), capture=capture)
                if self.inner is None:
                    st = replace(st, graph=True, padded_requests=key[0])
            else:                              # its graph was slower: eager and unpadded
                fw = replace(fw, capture=capture)
        fw = replace(fw, first=not self.forwards)
        self.forwards += 1
        self.clock.advance(self.cost(fw))
        return st


def cost_engine(config: EngineConfig, runner: CostRunner):
    """LLMEngine over `runner` whose pool only counts: built with an empty pool (LLMEngine
    allocates its pool's storage up front), then given the real capacity before any request."""

    capacity = config.kv_pool_tokens
    config.kv_pool_tokens = 0
    engine = LLMEngine(config, runner=runner)
    config.kv_pool_tokens = capacity
    engine.pool = engine.scheduler.pool = AccountingPool(capacity, engine.model_config, engine.dtype, engine.device)
    return engine


class CostPolicy(Delegating):
    """A baseline's forward schedule charged to the clock; `real` is the baseline's own policy
    object (its validated knobs and requests, its block and block end, cache accounting rules)."""

    def __init__(self, real: Policy, shape: ModelShape, cost: Cost, clock: VirtualClock, planned: bool = False):
        super().__init__(real)
        self.shape, self.cost, self.clock = shape, cost, clock
        self.work = baseline_work(real.name)
        self.parallel = any(self.knobs.get(k) is not None for k in ("threshold", "factor"))
        if self.parallel and not planned:
            raise ValueError("parallel decoding (threshold / factor) ends blocks by token values: the simulator needs "
                             "the forwards per block (--steps-per-block)")
        self.last: list = []
        self.forwards = 0
        self._bytes = real.kv_token_bytes()
        # A static batch repeats the same few forwards: memoise (cost, result) on what decides them.
        self._memo: dict = {}

    def begin(self, batch: Batch) -> None:
        """No cache to drop: nothing runs."""

    def _key(self, batch: Batch) -> tuple:
        return (batch.size, batch.length, batch.prompt_len, batch.block, batch.step_in_block, *self.work.memo_key(batch))

    def step(self, batch: Batch) -> StepResult:
        key = self._key(batch)
        hit = self._memo.get(key)
        if hit is None or not self.forwards:
            fw, res = self.work.forward(self.knobs, batch, self.shape)
            hit = (self.cost(replace(fw, first=not self.forwards)), res)
            if self.forwards:                  # the first forward's cost is its own
                self._memo[key] = hit
        self.forwards += 1
        self.last = batch.reqs
        self.clock.advance(hit[0])
        return hit[1]

    def block_done(self, batch: Batch) -> bool:
        if self.parallel:             # the slowest row's planned forwards for this block
            return batch.step_in_block >= max(r.planned_steps[batch.block % len(r.planned_steps)] for r in batch.reqs)
        return batch.step_in_block >= self.real.fixed_forwards(batch)

    def kv_row_tokens(self, batch: Batch) -> list[int]:
        return self.work.kv_row_tokens(self.knobs, batch)

    def kv_token_bytes(self) -> int:
        return self._bytes

    def cache_tensors(self) -> list:
        return []

    def cache_bytes(self) -> int:
        return 0  # no storage exists; stats report peak_kv_tokens
