"""Request-level, static-batch baseline systems (see `baselines.registry`): the registry, the
shared kit (`baselines.common`), the static-batch server (`baselines.static_batch`) and the
largest-batch profile (`baselines.profile`)."""
from __future__ import annotations

from baselines.dllm_cache import TASK_DEFAULTS, DLLMCache
from baselines.dream import DreamSampler
from baselines.fast_dllm import FastDLLM
from baselines.llada import LLaDASampler
from baselines.profile import measure_run, profile_max_batch
from baselines.registry import SYSTEMS, SystemSpec, make_policy, make_system, systems_for
from baselines.sparse_dllm import SparseDLLM
from baselines.static_batch import StaticBatchSystem

__all__ = ["SYSTEMS", "SystemSpec", "TASK_DEFAULTS", "make_policy", "make_system", "profile_max_batch",
           "measure_run", "StaticBatchSystem", "LLaDASampler", "DreamSampler", "FastDLLM", "DLLMCache", "SparseDLLM",
           "systems_for"]
