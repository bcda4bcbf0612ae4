"""Timed steps of the real systems on this machine, each paired with the Forward the simulator
would charge for it: the samples `calibrate.fit_host` turns into per-system host costs.

The engine runs with a recording `CostRunner` around its real ModelRunner (so the Forward is
read off exactly the batch the Scheduler built); a baseline runs its real policy under a
recording wrapper. Each system runs `sizes` concurrent requests (all at t = 0) after one
warm-up request, as serve's worker warms up before it measures.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from baselines import make_policy
from baselines.static_batch import Batch, Policy, StaticBatchSystem, StepResult
from dllm_bench.serve.speed_gauge import device_sync
from dllm_bench.simulate.clock import VirtualClock
from dllm_bench.simulate.cost_model import Forward, ModelShape
from dllm_bench.simulate.runners import CostRunner
from dllm_bench.simulate.work import baseline_forward
from engine.engine import LLMEngine


class RecordingPolicy(Policy):
    """The real policy, with the Forward of each of its steps recorded."""

    def __init__(self, real: Policy, shape: ModelShape):
        super().__init__(real.model)
        self.real, self.shape, self.name, self.knobs = real, shape, real.name, real.knobs
        self.forwards: list[Forward] = []

    def begin(self, batch: Batch) -> None:
        self.real.begin(batch)

    def step(self, batch: Batch) -> StepResult:
        self.forwards.append(baseline_forward(self.name, self.knobs, batch, self.shape)[0])
        return self.real.step(batch)

    def block_done(self, batch: Batch) -> bool:
        return self.real.block_done(batch)

    def kv_row_tokens(self, batch: Batch) -> list[int]:
        return self.real.kv_row_tokens(batch)

    def kv_token_bytes(self) -> int:
        return self.real.kv_token_bytes()

    def cache_tensors(self):
        return self.real.cache_tensors()


def _timed_steps(system, forwards: list, prompts, params, device) -> list[tuple[Forward, float]]:
    wait = device_sync(device) or (lambda: None)
    for p in prompts:
        system.add_request(p, params)
    out = []
    while system.has_unfinished():
        n = len(forwards)
        wait()
        t0 = time.perf_counter()
        system.step()
        wait()
        dt = time.perf_counter() - t0
        if len(forwards) > n:
            out.append((forwards[-1], dt))
    return out


def engine_steps(model, config, shape: ModelShape, prompts, params) -> list[tuple[Forward, float]]:
    fws: list[Forward] = []
    eng = plain_engine(model, config)
    try:
        eng.runner = CostRunner(model.config, config, shape, lambda fw: fws.append(fw) or 0.0, VirtualClock(),
                                model.dtype, inner=eng.runner)
        _timed_steps(eng, fws, prompts[:1], params, model.device)      # warm-up
        return _timed_steps(eng, fws, prompts, params, model.device)
    finally:
        del eng
        release(model.device)


def baseline_steps(model, name: str, knobs: dict, shape: ModelShape, prompts, params) -> list[tuple[Forward, float]]:
    pol = RecordingPolicy(make_policy(name, model, **knobs), shape)
    system = StaticBatchSystem(model, pol, max_batch_size=len(prompts))
    try:
        _timed_steps(system, pol.forwards, prompts[:1], params, model.device)
        return _timed_steps(system, pol.forwards, prompts, params, model.device)
    finally:
        del system, pol
        release(model.device)


def release(device) -> None:
    """Free what a finished system held before the next one is built. The engine profiles its KV
    pool from the free memory CUDA reports, and neither a system kept alive by a reference cycle
    nor the blocks PyTorch's allocator caches count as free: without this each batch size's
    engine would get a smaller pool than the last, and a baseline's batch could run out of memory."""
    import gc

    import torch

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def plain_engine(model, config):
    return LLMEngine(config, model=model)


def plain_baseline(model, name: str, knobs: dict):
    return StaticBatchSystem(model, make_policy(name, model, **knobs), max_batch_size=1)


@dataclass
class GapTimes:
    """`after_gaps`' timings, each list indexed by round: the whole request (add_request to its
    last step), its add_request alone, and how late each idle sleep returned."""

    request: dict[float, list[float]]
    add: dict[float, list[float]]
    overshoot: dict[float, list[float]]


def after_gaps(system, prompts, params, gaps: Sequence[float], rounds: int, device,
               sleep: Callable[[float], None] = time.sleep, seed: int = 0) -> GapTimes:
    """One request alone, run after each idle gap (the gaps in a shuffled order every round, each
    round on one prompt), after three warm-up requests: what a request pays for the idle time
    before it, as a served point at a low rate sees it."""
    wait = device_sync(device) or (lambda: None)

    def one(prompt) -> tuple[float, float]:
        wait()
        t0 = time.perf_counter()
        system.add_request(prompt, params)
        added = time.perf_counter() - t0
        while system.has_unfinished():
            system.step()
        wait()
        return time.perf_counter() - t0, added

    for i in range(3):
        one(prompts[i % len(prompts)])
    out = GapTimes(*({g: [] for g in gaps} for _ in range(3)))
    order, rnd = list(gaps), random.Random(seed)
    for r in range(rounds):
        rnd.shuffle(order)
        for g in order:
            t0 = time.perf_counter()
            sleep(g)
            out.overshoot[g].append(time.perf_counter() - t0 - g)
            total, added = one(prompts[r % len(prompts)])
            out.request[g].append(total)
            out.add[g].append(added)
    return out
