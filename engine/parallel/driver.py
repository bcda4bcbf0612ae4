"""`ParallelEngine`: rank 0 of a tensor-parallel engine, sending each prepared step's plan to the workers."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from engine import graphs
from engine.attention import resolve_backend
from engine.config import DTYPES, EngineConfig
from engine.engine import LLMEngine
from engine.kv_cache import KVPool
from engine.logits import RowSegment
from engine.parallel.cluster import Cluster, TPGroup
from engine.parallel.model import load_sharded
from engine.profiler import MemoryProfile, profile_kv_pool
from engine.runner import ModelRunner, row_segments
from engine.step import StepMeta


class DriverRunner(ModelRunner):
    def prepare(self, batch, pad=None, fwd_staging=None):
        p = super().prepare(batch, pad, fwd_staging)
        segments = [(s.start, s.count, s.temperature, s.gen.get_state(), s.dream)
                    for s in row_segments([r for r, _ in batch], p.plan)]
        self.cluster.send(worker_step, p.padded_meta, p.ids.cpu().numpy(), p.plan.rows.cpu().numpy(), segments,
                          p.plan.entropy, self.pool.storage.shape[2])
        return p


def build_rank(tp: TPGroup, config: EngineConfig, runner=ModelRunner) -> tuple[ModelRunner, MemoryProfile | None]:
    """A rank's runner over its shard (no pool yet) and, if the pool is bounded, its profile; the runner's
    `kv_pool_tokens` then the smallest pool of any rank."""
    model = load_sharded(config.model, tp, DTYPES[config.dtype])
    backend = resolve_backend(config.attention_backend, model.device, model.dtype)
    profile = None
    if config.kv_pool_tokens is None and (config.memory_budget is not None or model.device.type == "cuda"):
        profile = profile_kv_pool(model, config, backend, config.max_model_len or model.config.max_sequence_length)
        tokens = torch.tensor([profile.kv_pool_tokens], device=tp.device)
        tokens = tp.all_reduce(tokens, torch.distributed.ReduceOp.MIN)
        config = dataclasses.replace(config, kv_pool_tokens=int(tokens.item()))
    return runner(model, config, backend, None, config.max_model_len), profile


def worker_build(tp: TPGroup, config: EngineConfig) -> None:
    tp.runner, _ = build_rank(tp, config)
    tp.runner.pool = KVPool(tp.runner.config.kv_pool_tokens, tp.runner.model_config, tp.runner.dtype, tp.runner.device)


def worker_step(tp: TPGroup, meta: StepMeta, ids: np.ndarray, rows: np.ndarray, segments: list[tuple],
                entropy: bool, n_slots: int) -> None:
    """A worker's share of the driver's step (`segments`: RowSegment's, generator states): forward, decode."""
    runner = tp.runner
    if runner.pool.storage.shape[2] != n_slots:
        runner.pool.grow_to(n_slots)            # an unbounded pool grew on the driver
    fwd = runner.staging.begin()
    p = runner.packed(meta, meta, fwd, ids=ids)
    row_index = fwd.put(rows)
    fwd.flush()
    hidden = runner.forward(p)
    segments = [RowSegment(a, n, t, torch.Generator(device=runner.device).set_state(state), dream)
                for a, n, t, state, dream in segments]
    runner.decode_rows(runner.model.lm_head, hidden, row_index, segments, runner.config.max_num_logits,
                       runner.model_config.mask_token_id, entropy=entropy)


class ParallelEngine(LLMEngine):
    """An engine over `config.tensor_parallel_size` ranks (`cluster`: running ranks, else its own)."""

    def __init__(self, config: EngineConfig, cluster: Cluster | None = None, threads: int = 1):
        self.own_cluster = cluster is None
        self.cluster = cluster or Cluster.start(config.tensor_parallel_size, config.device, threads)
        config = graphs.eager(config)
        self.cluster.send(worker_build, config)
        with self.cluster.guard():
            runner, profile = build_rank(self.cluster.tp, config, DriverRunner)
        runner.cluster = self.cluster
        super().__init__(runner.config, runner=runner)
        runner.pool, self.profile = self.pool, profile

    def step(self):
        with self.cluster.guard():
            return super().step()

    def close(self) -> None:
        """Drop this engine on every rank, or stop the ranks if the cluster is its own or was interrupted mid-step."""
        if self.own_cluster or self.cluster.busy:
            self.cluster.close()
        elif not self.cluster.closed:
            self.cluster.send(setattr, "runner", None)
