"""`ParallelEngine`: rank 0 of a tensor-parallel engine, sending each prepared step's plan to the workers."""
from __future__ import annotations

import dataclasses

from engine import graphs
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.parallel.cluster import CLOSE, Build, Cluster
from engine.parallel.plan import RecordingStaging, plan_of
from engine.parallel.rank import build_rank
from engine.request import RequestOutput
from engine.runner import ModelRunner


class DriverRunner(ModelRunner):
    def __init__(self, model, config: EngineConfig, backend: str, cluster: Cluster, max_model_len: int):
        super().__init__(model, config, backend, None, max_model_len)   # the engine attaches its pool
        self.staging = RecordingStaging(self.device)
        self.cluster = cluster

    def prepare(self, batch, pad=None, fwd_staging=None):
        p = super().prepare(batch, pad, fwd_staging)
        self.cluster.send(plan_of(p, batch, self.staging, self.pool.storage.shape[2]))
        return p


class ParallelEngine(LLMEngine):
    """An engine over `config.tensor_parallel_size` ranks (`cluster`: running ranks, else its own)."""

    def __init__(self, config: EngineConfig, cluster: Cluster | None = None, threads: int = 1):
        self.own_cluster = cluster is None
        self.cluster = cluster or Cluster.start(config.tensor_parallel_size, config.device, threads)
        if self.cluster.tp.size != config.tensor_parallel_size:
            raise ValueError(f"the cluster has {self.cluster.tp.size} ranks, the config asks for "
                             f"{config.tensor_parallel_size}")
        config = graphs.eager(config)
        self.cluster.send(Build(config))
        with self.cluster.guard():
            built = build_rank(self.cluster.tp, config)
        config = dataclasses.replace(config, kv_pool_tokens=built.capacity)
        runner = DriverRunner(built.model, config, built.backend, self.cluster, built.max_model_len)
        super().__init__(config, runner=runner)
        runner.pool = self.pool
        self.profile = built.profile

    def step(self) -> list[RequestOutput]:
        with self.cluster.guard():
            return super().step()

    def close(self) -> None:
        """Drop this engine on every rank; stop the ranks if the cluster is its own."""
        if self.cluster.closed:
            return
        if self.cluster.busy:
            # interrupted mid-step: the workers wait in a collective and would never read CLOSE
            self.cluster.close(kill=True)
            return
        self.cluster.send(CLOSE)
        if self.own_cluster:
            self.cluster.close()
