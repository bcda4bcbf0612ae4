"""Tensor parallelism: one engine over N devices (or N CPU processes) on torch.distributed.

group.py (process groups) · sharding.py (which slice of each weight a rank holds) · model.py
(a rank's LLaDA) · loader.py (shard-wise checkpoint reads) · vocab_decode.py (the logit
chunks decoded across ranks) · plan.py (a step, sent from the driver to the workers) · rank.py
(what every rank builds) · cluster.py (the processes, the workers' loop, failures) · driver.py
(`ParallelEngine`, rank 0's engine). docs/PARALLEL.md has the whole picture.
"""
from engine.parallel.cluster import Cluster
from engine.parallel.driver import ParallelEngine
from engine.parallel.group import RankFailure

__all__ = ["Cluster", "ParallelEngine", "RankFailure"]
