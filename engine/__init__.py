"""The dLLM serving engine (nothing else of ours): `engine.open(EngineConfig(model=path)).generate(prompts, params)`."""
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.models import DenseLM
from engine.request import RequestOutput
from engine.sampling import SamplingParams
from engine.step import Runner

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "open"]


def open(config: EngineConfig, model: DenseLM | None = None, runner: Runner | None = None, *, threads: int = 1,
         cluster=None) -> LLMEngine:
    """The engine `config` describes, on one device or over ranks (`model`: loaded; `cluster`: ranks running)."""
    if config.tensor_parallel_size == 1 or runner is not None:
        return LLMEngine(config, model=model, runner=runner)
    if model is not None:
        raise ValueError("an engine over several ranks loads its shards of config.model on each rank: "
                         "give no loaded model")
    from engine.parallel.driver import ParallelEngine

    return ParallelEngine(config, cluster=cluster, threads=threads)
