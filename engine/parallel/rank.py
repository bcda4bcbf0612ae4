"""What every rank builds for an engine, in lockstep: its model shard and its memory profile."""
from __future__ import annotations

from dataclasses import dataclass

from engine import graphs
from engine.attention import resolve_backend
from engine.config import DTYPES, EngineConfig
from engine.kv_cache import KVPool
from engine.parallel.group import TPGroup
from engine.parallel.loader import load_sharded
from engine.parallel.model import ShardedLM
from engine.profiler import MemoryProfile, profile_kv_pool
from engine.runner import ModelRunner


@dataclass
class RankBuild:
    model: ShardedLM
    backend: str
    max_model_len: int
    capacity: int | None              # KV token slots per rank (None: unbounded, CPU without a budget)
    profile: MemoryProfile | None     # this rank's own profile


def build_rank(tp: TPGroup, config: EngineConfig) -> RankBuild:
    model = load_sharded(config.model, tp, DTYPES[config.dtype])
    backend = resolve_backend(config.attention_backend, model.device, model.dtype)
    max_model_len = config.max_model_len or model.config.max_sequence_length
    capacity, profile = config.kv_pool_tokens, None
    if capacity is None and (config.memory_budget is not None or model.device.type == "cuda"):
        profile = profile_kv_pool(model, config, backend, max_model_len)
        capacity = tp.min_int(profile.kv_pool_tokens)
    return RankBuild(model, backend, max_model_len, capacity, profile)


def rank_profile(tp: TPGroup, config: EngineConfig, max_model_len: int) -> MemoryProfile | str:
    """This rank's memory profile of `config` (on every rank at once), or the profiler's refusal."""
    model = load_sharded(config.model, tp, DTYPES[config.dtype])
    try:
        return profile_kv_pool(model, graphs.eager(config), resolve_backend(config.attention_backend, model.device,
                                                                           model.dtype), max_model_len)
    except ValueError as e:
        return str(e)


def worker_runner(b: RankBuild, config: EngineConfig) -> ModelRunner:
    """A worker's runner: the same `ModelRunner` over its shard and its own KV pool."""
    pool = KVPool(b.capacity, b.model.config, b.model.dtype, b.model.device)
    return ModelRunner(b.model, config, b.backend, pool, b.max_model_len)
