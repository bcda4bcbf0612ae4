"""`engine.open`: the one constructor of an engine. An `EngineConfig` says what to build: one
device (`LLMEngine`) or, with `tensor_parallel_size` N > 1, an engine over N ranks
(`engine.parallel.ParallelEngine`: this process is rank 0, the others spawned or torchrun's).
Either is a context manager whose `close()` stops what it started (nothing, on one device), so
no caller needs to know which it holds."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.models.llada import LLaDAModelLM
from engine.step import Runner


def open_engine(config: EngineConfig, model: LLaDAModelLM | None = None, runner: Runner | None = None, *,
                threads: int = 1, cluster=None) -> LLMEngine:
    """The engine `config` describes. `model`: already loaded (one device; else `config.model` is
    loaded); `runner`: any `engine.step.Runner` in place of the model's (a simulator's cost
    model: the engine's own scheduler over simulated ranks). Over several ranks each rank loads
    only its shard of `config.model`, with `threads` torch threads on a CPU; `cluster`: ranks
    already running (several engines in turn)."""
    if config.tensor_parallel_size == 1 or runner is not None:
        return LLMEngine(config, model=model, runner=runner)
    if model is not None:
        raise ValueError("an engine over several ranks loads its shards of config.model on each rank: "
                         "give no loaded model")
    from engine.parallel.driver import ParallelEngine

    return ParallelEngine(config, cluster=cluster, threads=threads)
