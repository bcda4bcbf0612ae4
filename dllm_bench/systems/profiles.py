"""The KV-pool profiles an engine of each config would take (engine.profiler), measured without
building the engine (`dllm-bench profile`): on one device over the whole model, or with
`tensor_parallel_size` N on N CPU processes, each profiling its own shard."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch.distributed as dist

from dllm_bench.checkpoints.load import load_model
from dllm_bench.systems.build import check_tensor_parallel
from engine.attention import choose_backend
from engine.config import DTYPES, EngineConfig
from engine.parallel.driver import Cluster
from engine.parallel.model import load_sharded
from engine.profiler import MemoryProfile, profile_kv_pool


def profile_pools(configs: Mapping[str, EngineConfig], max_model_len: int,
                  threads: int = 1) -> dict[str, MemoryProfile | str]:
    """Each named config's profile; a budget that does not hold the worst step is the profiler's
    reason (a str). Every config names the same checkpoint (`model`) and parallel size. Over N
    ranks (one process spawned per rank, `threads` torch threads each; spawned once for every
    config): rank 0's profile, its KV pool the smallest any rank holds (every rank's pool
    addresses the same slots)."""
    first = next(iter(configs.values()))
    n = first.tensor_parallel_size
    check_tensor_parallel(first.model, n, "cpu")
    if n == 1:
        model = load_model(first.model, first.dtype, first.device)
        return {label: _one_device(model, cfg, max_model_len) for label, cfg in configs.items()}
    out = {}
    cluster = Cluster.spawn(n, "cpu", threads)
    try:
        for label, cfg in configs.items():
            ranks = on_every_rank(cluster, _rank_profile, cfg, max_model_len)
            bad = next((r for r in ranks if isinstance(r, str)), None)
            out[label] = bad or dataclasses.replace(ranks[0], kv_pool_tokens=min(r.kv_pool_tokens for r in ranks))
    finally:
        cluster.close()
    return out


def on_every_rank(cluster: Cluster, fn, *args) -> list:
    """fn(tp, *args) on every rank of `cluster` at once (`fn` importable by name): each rank's result, in rank order."""
    cluster.send(_gathered, fn, *args)
    with cluster.guard():
        return _gathered(cluster.tp, fn, *args)


def _gathered(tp, fn, *args) -> list:
    out = [None] * tp.size
    dist.gather_object(fn(tp, *args), out if tp.rank == 0 else None, dst=0, group=tp.host_group)
    return out


def _rank_profile(tp, cfg: EngineConfig, max_model_len: int) -> MemoryProfile | str:
    """This rank's profile of `cfg` over its shard (on every rank at once; ranks run eager)."""
    eager = dataclasses.replace(cfg, cuda_graphs=False)
    return _one_device(load_sharded(cfg.model, tp, DTYPES[cfg.dtype]), eager, max_model_len)


def _one_device(model, cfg: EngineConfig, max_model_len: int) -> MemoryProfile | str:
    try:
        return profile_kv_pool(model, cfg, choose_backend(cfg.attention_backend, model.device, model.dtype).name,
                               max_model_len)
    except ValueError as e:
        return str(e)   # the budget does not even hold the worst step: say so
