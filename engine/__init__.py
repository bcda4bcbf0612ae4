"""The dLLM serving engine. Depends on nothing else in this repository."""
from engine.config import EngineConfig
from engine.engine import LLMEngine
from engine.request import RequestOutput
from engine.sampling import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
