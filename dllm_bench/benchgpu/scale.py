"""The sizes of a bench-gpu run: LLaDA-8B at the paper's setting on a GPU, or the same steps at
toy size on a CPU (so the pipeline is tested end to end where there is no GPU).

On a GPU: the `paper` serve preset (LiveBench-shaped prompts, 256 tokens per request, fixed
decoding), 32 requests at saturation on the whole GPU (auto budget), and the RTX 4090's 22 GiB
(the paper's card, where a baseline fits a batch of a few) at saturation and at 1.0 req/s. On
a CPU: the `tiny` preset, a few requests, and 2 MiB instead of 22 GiB (Fast-dLLM fits 2).
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.config import GPU_MEMORY_UTILIZATION

# serve-full: the engine's default and its two fixed cache policies against each baseline the
# goals name (dLLM-Cache is far behind on every GPU budget simulated: not worth its minute).
FULL_SYSTEMS = ("engine", "engine:cache=dual", "engine:cache=sparse", "fast-dllm", "sparse-dllm")
SMALL_SYSTEMS = ("engine", "fast-dllm", "sparse-dllm")
BASELINES = ("fast-dllm", "sparse-dllm")
ENGINE = "engine"


@dataclass(frozen=True)
class Scale:
    name: str                      # gpu | cpu
    device: str                    # cuda | cpu
    model: str                     # model preset when --model is not given
    serve_preset: str              # dllm_bench.serve.presets
    gen_length: int                # tokens per request (the preset's), for the estimates
    full_prompts: int              # serve-full: requests at saturation
    full_budget: str | None        # serve-full budget; None = the preset's (auto on CUDA)
    full_budget_label: str
    small_budget: str              # serve-22g budget
    small_budget_label: str
    small_prompts: tuple[int, ...]  # serve-22g request counts to choose from, largest first
    rate: str                      # serve-22g's steady rate (req/s) beside saturation
    profile_batches: tuple[int, ...]

    @property
    def gpu(self) -> bool:
        return self.name == "gpu"


GPU = Scale("gpu", "cuda", model="llada-8b", serve_preset="paper", gen_length=256, full_prompts=32,
            full_budget=None, full_budget_label=f"Whole GPU (auto budget: free memory x {GPU_MEMORY_UTILIZATION:g})",
            small_budget="22GiB", small_budget_label="22 GiB (an RTX 4090's budget)", small_prompts=(32, 24, 16, 12, 8),
            rate="1.0", profile_batches=(1, 8, 32))
CPU = Scale("cpu", "cpu", model="tiny", serve_preset="tiny", gen_length=16, full_prompts=4,
            full_budget="8MiB", full_budget_label="8 MiB (the tiny preset's budget)",
            small_budget="2MiB", small_budget_label="2 MiB (CPU stand-in for 22 GiB)", small_prompts=(4,),
            rate="8", profile_batches=(1,))


def for_device(device: str) -> Scale:
    return GPU if device.startswith("cuda") else CPU
