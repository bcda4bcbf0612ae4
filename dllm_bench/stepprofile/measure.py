"""The step loop of profile-step: B requests in the system, stepped until `steps` steps of the
asked phase mix were profiled and as many were timed without the profiler, after `warmup` such
steps (a CUDA graph's capture, first calls) that count for neither.

Profiled and unprofiled steps alternate (the profiler's own cost shows as the difference of
their wall times); each profiled step is its own profiler session around one `system.step()`,
CPU and CUDA activities, followed by a device synchronisation inside the session. Steps that do
not have the mix run unprofiled in between. When every request has finished, B new ones come
(the same shape), so a mix that comes once per block is reached as often as asked.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections import deque
from dataclasses import dataclass, field

import torch

from dllm_bench.errors import UserError
from dllm_bench.serve import trace
from dllm_bench.stepprofile import phases
from dllm_bench.stepprofile.categories import STEP, Breakdown, breakdown
from dllm_bench.stepprofile.regions import labelled
from engine.sampling import SamplingParams


@dataclass
class ProfiledStep:
    row: dict                       # the step's trace row (dllm_bench.serve.trace.row)
    breakdown: Breakdown
    forward: object                 # its cost_model.Forward


@dataclass
class Measured:
    profiled: list[ProfiledStep] = field(default_factory=list)
    plain: list[dict] = field(default_factory=list)     # trace rows of the unprofiled steps
    warmup: list[dict] = field(default_factory=list)
    discarded: int = 0              # chosen by their predicted mix, which the step did not have
    steps_run: int = 0
    fills: int = 0


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto prints a line on stderr as a profiler starts and stops (once per profiled step)."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def profiled_step(system, cuda: bool) -> Breakdown:
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    prof = torch.profiler.profile(activities=acts)
    with _quiet_stderr():
        prof.start()
    try:
        with torch.profiler.record_function(STEP):
            system.step()
        if cuda:
            torch.cuda.synchronize()
    finally:
        with _quiet_stderr():
            prof.stop()
    return breakdown(prof.events(), cuda)


@labelled()
def measure(system, prompts: list[list[int]], params: SamplingParams, phase: str, steps: int, warmup: int,
            shape, recorder, cuda: bool, max_steps: int) -> Measured:
    """Run the loop (module docstring) on `system` with its work `recorder` installed and the
    engine's regions labelled."""
    batch = len(prompts)
    gap = max(1, params.steps_per_block // batch) if phase == "mixed" else 0
    rows: list[dict] = []
    system.counters.sink = lambda *r: rows.append(trace.row(*r))
    out = Measured()
    pending: deque[list[int]] = deque()
    since_admit = gap
    try:
        while len(out.profiled) < steps or len(out.plain) < steps:
            if out.steps_run >= max_steps:
                found = len(out.warmup) + len(out.profiled) + len(out.plain)
                raise UserError(f"--phase {phase}: {found} of the {warmup + 2 * steps} steps needed came in "
                                f"{max_steps} steps at batch {batch}; lower --steps or --warmup, or choose "
                                "another --phase")
            if not pending and not system.has_unfinished():
                pending.extend(prompts)
                out.fills += 1
            while pending and since_admit >= gap:
                _add(system, pending.popleft(), params)
                since_admit = 0 if gap else since_admit
            predicted = phases.next_phases(system, shape) if phase != "serve" else None
            wanted = not pending and phases.qualifies(phase, predicted, batch)
            profile = wanted and len(out.warmup) >= warmup and len(out.profiled) <= len(out.plain) \
                and len(out.profiled) < steps
            rows.clear()
            bd = profiled_step(system, cuda) if profile else _step(system)
            out.steps_run += 1
            since_admit += 1
            if not wanted or not rows:
                continue
            row = rows[-1]
            if not phases.confirmed(phase, predicted, row):
                out.discarded += 1
            elif len(out.warmup) < warmup:
                out.warmup.append(row)
            elif profile:
                out.profiled.append(ProfiledStep(row, bd, recorder.last))
            elif len(out.plain) < steps:
                out.plain.append(row)
    finally:
        system.counters.sink = None
    return out


def _step(system) -> None:
    system.step()


def _add(system, prompt: list[int], params: SamplingParams) -> None:
    try:
        system.add_request(prompt, params)
    except ValueError as e:
        raise UserError(f"a request of {len(prompt)} prompt tokens + {params.gen_length} generated cannot run: {e}") \
            from None
