"""EngineConfig: one dataclass that flows everywhere, every mechanism's switch (docs/ENGINE.md, "EngineConfig")."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch

SCHEDULERS = ("phase", "request", "lookahead")   # engine.scheduler.POLICIES' names
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GPU_MEMORY_UTILIZATION = 0.9
CHOICES = {"cache": ("none", "dual", "sparse", "auto"), "selection": ("head", "uniform"),
           "score_query": ("mean", "max"), "scheduler": SCHEDULERS, "dtype": tuple(DTYPES),
           "attention_backend": ("auto", "sdpa", "varlen", "flash_attn")}
RULES = {**dict.fromkeys(("max_num_batched_tokens", "max_num_seqs", "max_model_len", "refresh_chunk_tokens",
                          "max_num_logits", "memory_budget"), (lambda v: v > 0, "positive")),
         **dict.fromkeys(("kv_pool_tokens", "delay_step", "ridge_rows", "overhead_rows"), (lambda v: v >= 0, ">= 0")),
         "tensor_parallel_size": (lambda v: v >= 1, ">= 1"), "retention": (lambda v: 0 < v <= 1, "in (0, 1]"),
         "pool_window": (lambda v: v > 0 and v % 2 == 1, "a positive odd number"),
         "guard_fraction": (lambda v: 0 <= v < 1, "in [0, 1)")}


@dataclass
class EngineConfig:
    model: str = ""
    dtype: str = "float32"
    device: str = "auto"
    attention_backend: str = "auto"
    cuda_graphs: bool | None = None
    tensor_parallel_size: int = 1
    scheduler: str = "phase"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 64
    max_model_len: int | None = None
    refresh_chunk_tokens: int | None = None
    max_num_logits: int | None = 1024
    cache: str = "auto"
    selection: str = "head"
    retention: float = 0.5
    score_query: str = "mean"
    pool_window: int = 3
    delay_step: int = 1
    ridge_rows: int = 256
    overhead_rows: int = 0
    memory_budget: int | None = None
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    kv_pool_tokens: int | None = None
    guard_fraction: float = 0.05
    sampling: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value, (test, what) = getattr(self, f.name), RULES.get(f.name, (None, ""))
            if f.name in CHOICES and value not in CHOICES[f.name]:
                raise ValueError(f"{f.name} must be one of {CHOICES[f.name]}, got {value!r}")
            if test is not None and value is not None and not test(value):
                raise ValueError(f"{f.name} must be {what}, got {value!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def cuda_graphs_on(flag: bool | None, device: torch.device) -> bool:
    """Whether Reuse-only steps run bucketed (as CUDA graphs on CUDA): `flag`, by default on CUDA."""
    return device.type == "cuda" if flag is None else bool(flag)


def resolve_device(name: str) -> torch.device:
    """`auto`: CUDA when available."""
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def default_dtype(device: torch.device) -> str:
    """The dtype a run takes unless told: bfloat16 on CUDA (LLaDA's own), float32 elsewhere."""
    return "bfloat16" if device.type == "cuda" else "float32"
