"""The dLLM serving engine. Depends on nothing else in this repository.

    with engine.open(EngineConfig(model=path)) as eng:     # one device, or tensor_parallel_size ranks
        outputs = eng.generate(prompts, SamplingParams(gen_length=64))
"""
from engine.build import open_engine as open
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.request import RequestOutput
from engine.sampling import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "open"]
