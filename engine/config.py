"""EngineConfig: one dataclass that flows everywhere. Every dLLM-Serve mechanism has a switch
here, which is what `dllm-bench ablate` flips."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

SCHEDULERS = ("phase", "request", "lookahead")   # engine.scheduler.POLICIES' names
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GPU_MEMORY_UTILIZATION = 0.9   # the automatic budget on CUDA: this share of the memory free before the weights load
CHOICES = {"cache": ("none", "dual", "sparse", "auto"), "selection": ("head", "uniform"),
           "score_query": ("mean", "max"), "scheduler": SCHEDULERS, "dtype": tuple(DTYPES),
           "attention_backend": ("auto", "sdpa", "varlen", "flash_attn")}


@dataclass
class EngineConfig:
    model: str = ""                        # checkpoint directory (presets are resolved by the CLI)
    dtype: str = "float32"
    device: str = "auto"                   # auto = cuda when available
    attention_backend: str = "auto"        # auto = on CUDA torch varlen_attn, else flash-attn, else SDPA
    cuda_graphs: bool | None = None        # Reuse-only steps as CUDA graphs (cuda_graphs_on); None = on CUDA
    tensor_parallel_size: int = 1          # ranks of one engine (engine.parallel)
    scheduler: str = "phase"               # phase | request | lookahead (docs/SCHEDULER.md)
    max_num_batched_tokens: int = 8192     # query tokens per step
    max_num_seqs: int = 64
    max_model_len: int | None = None       # None = the checkpoint's max_sequence_length
    refresh_chunk_tokens: int | None = None    # chunk of a Refresh over the token budget (None: profiled)
    max_num_logits: int | None = 1024      # None = monolithic full-sequence logits (an HF forward)
    cache: str = "auto"                    # none (exact LLaDA) | dual (Fast-dLLM) | sparse (dLLM-Serve) | auto
    selection: str = "head"                # head-centric per-KV-head top-k | uniform (Sparse-dLLM)
    retention: float = 0.5                 # fraction of context tokens kept per head
    score_query: str = "mean"              # the block queries' mean (upstream's) | their max
    pool_window: int = 3                   # max-pool window along positions (odd)
    delay_step: int = 1                    # step within a block at which the sparse cache is built
    ridge_rows: int = 256                  # cache=auto's roofline: query rows where a step stops being weight-bound
    overhead_rows: int = 0                 # ... and a step's fixed cost in query rows (dllm_bench.systems.ridge)
    memory_budget: int | None = None       # bytes for weights + activations + KV; None = unbounded on CPU
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION   # CUDA default budget = free memory x this
    kv_pool_tokens: int | None = None      # override the profiled pool size (token slots)
    guard_fraction: float = 0.05           # of the budget, kept free against fragmentation/noise
    sampling: bool = True                  # requests may sample (T > 0): the profiler counts the Gumbel noise

    def __post_init__(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        for name, choices in CHOICES.items():
            check(getattr(self, name) in choices, f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            check(getattr(self, name) > 0, f"{name} must be positive")
        for name in ("memory_budget", "max_model_len", "refresh_chunk_tokens"):
            check(getattr(self, name) is None or getattr(self, name) > 0, f"{name} must be positive")
        for name in ("delay_step", "ridge_rows", "overhead_rows"):
            check(getattr(self, name) >= 0, f"{name} must be >= 0")
        check(self.kv_pool_tokens is None or self.kv_pool_tokens >= 0, "kv_pool_tokens must be >= 0")
        check(self.tensor_parallel_size >= 1, "tensor_parallel_size must be >= 1")
        check(self.max_num_logits is None or self.max_num_logits > 0, "max_num_logits must be positive (or None)")
        check(0 < self.retention <= 1, f"retention must be in (0, 1], got {self.retention}")
        check(self.pool_window > 0 and self.pool_window % 2 == 1, "pool_window must be a positive odd number")
        check(0 <= self.guard_fraction < 1, "guard_fraction must be in [0, 1)")

    def to_dict(self) -> dict:
        return asdict(self)


def default_dtype(device: torch.device) -> str:
    """The dtype a run takes unless told: bfloat16 on CUDA (LLaDA's own), float32 elsewhere."""
    return "bfloat16" if device.type == "cuda" else "float32"


def cuda_graphs_on(flag: bool | None, device: torch.device) -> bool:
    """Whether Reuse-only steps run bucketed (as CUDA graphs on CUDA): `flag`, by default on CUDA."""
    return device.type == "cuda" if flag is None else bool(flag)
