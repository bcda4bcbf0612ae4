"""Tensor parallelism: one engine over N devices (or N CPU processes) on torch.distributed
(docs/PARALLEL.md)."""
from engine.parallel.cluster import Cluster
from engine.parallel.driver import ParallelEngine
from engine.parallel.group import RankFailure

__all__ = ["Cluster", "ParallelEngine", "RankFailure"]
