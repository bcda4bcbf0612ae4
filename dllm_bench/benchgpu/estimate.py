"""How long each step takes, before it runs: printed up front, used to choose serve-22g's
request count so the default run fits its time budget, and to leave out a step that no
longer fits (the run writes what it measured instead of being killed halfway).

The GPU figures come from the first run on one H100 80GB (torch 2.11, flash-attn absent):
a sub-command that loads LLaDA-8B (Python, imports, 16 GB of weights to the GPU, the KV pool
profiled, one warm-up request) costs ~16 s before it measures anything, one that loads no model
~6 s (a profile-step, without serve's warm-up request, is taken at 16 s with its profiling);
making the checkpoint took 21 s, doctor 8 s. Throughputs at saturation are that run's
(engine 212-232, Fast-dLLM 279, Sparse-dLLM 234 tok/s on the whole GPU), the engine's taken at
300 (its goal is 380); at 22 GiB `simulate --preset paper --hardware h100 --memory-budget 22GiB`
scaled by the whole-GPU errors of the same simulation. Replays are bounded by each point's
--max-duration, so a slower system costs at most `point_cap` more.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dllm_bench.benchgpu.scale import Scale


@dataclass(frozen=True)
class Costs:
    process_s: float                 # a sub-command that loads no model
    load_s: float                    # one that loads the model and warms it up
    make_s: float                    # making the random-weight checkpoint
    doctor_s: float
    profile_s: float                 # one profile-step, its process and model load included
    request_s: float                 # one request alone: the tail of a fixed-rate point
    tok_s: dict = field(default_factory=dict)  # (regime, system) -> output tok/s at saturation
    default_tok_s: float = 200.0

    def rate(self, regime: str, system: str) -> float:
        return self.tok_s.get((regime, system), self.tok_s.get((regime, system.split(":")[0]), self.default_tok_s))


GPU_COSTS = Costs(process_s=6, load_s=16, make_s=30, doctor_s=25, profile_s=16, request_s=4, tok_s={
    ("full", "engine"): 300, ("full", "engine:cache=dual"): 280, ("full", "engine:cache=sparse"): 230,
    ("full", "fast-dllm"): 280, ("full", "sparse-dllm"): 235,
    ("small", "engine"): 210, ("small", "fast-dllm"): 160, ("small", "sparse-dllm"): 200})
# The tiny preset on a 2-core CPU: a fresh process (Python, torch, the project) is most of it.
CPU_COSTS = Costs(process_s=6, load_s=8, make_s=5, doctor_s=25, profile_s=8, request_s=0.2, default_tok_s=200)


def costs(scale: Scale) -> Costs:
    return GPU_COSTS if scale.gpu else CPU_COSTS


def replay_s(c: Costs, scale: Scale, regime: str, system: str, prompts: int, rps: str) -> float:
    """One point's replay: the work at saturation, or the arrivals' span (and one request's
    tail) at a fixed rate when the system keeps up with it."""
    work = prompts * scale.gen_length / c.rate(regime, system)
    if rps == "inf":
        return work
    return max(prompts / float(rps), work) + c.request_s


def point_cap(c: Costs, replay: float) -> float:
    """--max-duration of a point: three times its expected replay, at least a minute."""
    return max(60.0, 3 * replay)


def serve_s(c: Costs, scale: Scale, regime: str, systems: Sequence[str], rates: Sequence[str], prompts: int) -> float:
    return c.process_s + sum(c.load_s + replay_s(c, scale, regime, s, prompts, r) for s in systems for r in rates)


def small_prompts(c: Costs, scale: Scale, systems: Sequence[str], rates: Sequence[str], left_s: float) -> int:
    """serve-22g's request count: the largest candidate whose estimate fits in `left_s` (what
    the budget leaves after the other selected steps), else the smallest."""
    for n in scale.small_prompts:
        if serve_s(c, scale, "small", systems, rates, n) <= left_s:
            return n
    return scale.small_prompts[-1]
