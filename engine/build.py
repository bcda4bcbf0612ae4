"""`engine.open`: the one constructor of an engine, on one device or over `tensor_parallel_size` ranks."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.models import DenseLM
from engine.step import Runner


def open_engine(config: EngineConfig, model: DenseLM | None = None, runner: Runner | None = None, *,
                threads: int = 1, cluster=None) -> LLMEngine:
    """The engine `config` describes (`model`: loaded; `runner`: any `Runner`; `cluster`: ranks running)."""
    if config.tensor_parallel_size == 1 or runner is not None:
        return LLMEngine(config, model=model, runner=runner)
    if model is not None:
        raise ValueError("an engine over several ranks loads its shards of config.model on each rank: "
                         "give no loaded model")
    from engine.parallel.driver import ParallelEngine

    return ParallelEngine(config, cluster=cluster, threads=threads)
