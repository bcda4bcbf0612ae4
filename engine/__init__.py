"""The dLLM serving engine (nothing else of ours): `engine.open(EngineConfig(model=path)).generate(prompts, params)`."""
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.engine import open_engine as open
from engine.request import RequestOutput
from engine.sampling import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "open"]
