"""Tensor parallelism: one engine over N devices (or N CPU processes) on torch.distributed (docs/PARALLEL.md)."""
from engine.parallel.cluster import Cluster, RankFailure
from engine.parallel.driver import ParallelEngine

__all__ = ["Cluster", "ParallelEngine", "RankFailure"]
