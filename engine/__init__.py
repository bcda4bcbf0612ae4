"""The dLLM serving engine, depending on nothing else in this repository: `with engine.open(EngineConfig(
model=path)) as eng: outputs = eng.generate(prompts, SamplingParams(gen_length=64))`."""
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.engine import open_engine as open
from engine.request import RequestOutput
from engine.sampling import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "open"]
