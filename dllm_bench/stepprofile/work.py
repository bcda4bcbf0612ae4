"""What a profiled step computed: the cost model's `Forward` of each step, read off the batch the
engine's scheduler or a baseline's static batch hands over (dllm_bench.simulate.work, as the
simulator does), and its FLOPs and bytes from the cost model's own per-forward counts.

The recorder wraps the system's runner (engine) or decoding policy (baseline) and reads the
step's Forward before delegating to it, inside profile-step's BOOKKEEPING region, which the
breakdown takes out of the step's time. FLOPs are the real members' (a padded step's dummy
members are not useful work); bytes are what the algorithm cannot avoid moving: each GEMM's
weights and operands, attention's Q/K/V/O, the LM head, KV reads and writes once
(ESSENTIAL: no implementation's extra elementwise traffic).
"""
from __future__ import annotations

import math

from dllm_bench.simulate.cost_model import CostModel, Efficiency, Forward, HostCost, ImplProfile, ModelShape
from dllm_bench.simulate.work import baseline_forward, engine_forward
from dllm_bench.stepprofile.regions import BOOKKEEPING, profiler_range

ESSENTIAL = ImplProfile("essential", elem_d=0, elem_f=0, softmax_bytes_per_entry=0, rope_bytes_per_key_d=0,
                        kv_copy=1, source="profile-step: the bytes every implementation moves")


def counts(fw: Forward, shape: ModelShape) -> dict[str, float]:
    """FLOPs by kind and essential bytes of one forward. The cost model times every term as a
    roofline max(FLOPs / peak, bytes / bandwidth): at a peak of 1 FLOP/s and an infinite
    bandwidth each term's "time" is its FLOPs, so its parts are the FLOP split it counts."""
    c = CostModel(shape, 1.0, math.inf, Efficiency(), ESSENTIAL, HostCost()).step(fw)
    return {"flops": c.flops, "gemm_flops": c.parts["gemm"], "attention_flops": c.parts["attn"],
            "lm_head_flops": c.parts["lm_head"], "bytes": c.bytes}


class _Delegate:
    def __init__(self, inner):
        self.inner = inner
        self.last: Forward | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)


class EngineWork(_Delegate):
    """Stands in for an LLMEngine's runner: each step's Forward, then the real run."""

    def __init__(self, runner, config, shape: ModelShape):
        super().__init__(runner)
        self.config, self.shape = config, shape

    def run(self, batch):
        with profiler_range(BOOKKEEPING):
            self.last = engine_forward(batch, self.config, self.shape)[0]
        return self.inner.run(batch)


class BaselineWork(_Delegate):
    """Stands in for a static batch's decoding policy: each forward's Forward, then the real step."""

    def __init__(self, policy, shape: ModelShape):
        super().__init__(policy)
        self.shape = shape

    def step(self, batch):
        with profiler_range(BOOKKEEPING):
            self.last = baseline_forward(self.inner.name, self.inner.knobs, batch, self.shape)[0]
        return self.inner.step(batch)


def record_work(system, shape: ModelShape):
    """Install the recorder on `system` (an LLMEngine or a StaticBatchSystem); returns it (its
    `last` is the latest step's Forward)."""
    if hasattr(system, "scheduler"):
        system.runner = EngineWork(system.runner, system.config, shape)
        return system.runner
    system.policy = BaselineWork(system.policy, shape)
    return system.policy
