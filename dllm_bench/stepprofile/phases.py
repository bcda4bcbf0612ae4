"""The phase mix of the steps profile-step measures, and how the next step is known to have it.

* reuse — every member of the step in a Reuse phase (it queries its block against its cache);
* refresh — every member in a Refresh phase (it queries its whole canvas);
* mixed — both in one step: the engine's requests are admitted a stagger apart, so their blocks
  start at different steps (the steady state of continuous batching);
* serve — whatever comes: B requests admitted together and stepped as the system schedules them.

Before each step the members' phases are predicted from the requests' cursors (a pure function
of their position in the block, engine.request.phase_at; a baseline's from its policy's own
forward description, dllm_bench.simulate.work); the step's trace row confirms them afterwards.
"""
from __future__ import annotations

from baselines import SYSTEMS
from dllm_bench.errors import UserError
from dllm_bench.simulate.work import baseline_forward
from dllm_bench.systems.spec import ENGINE

PHASES = ("reuse", "refresh", "mixed", "serve")


def is_engine(system) -> bool:
    return hasattr(system, "scheduler")


def check_feasible(system: str, cache: str | None, phase: str, batch: int | str) -> None:
    """UserError for a phase mix `system` (engine with KV `cache`, or a baseline's name) can never
    run at this batch."""
    if phase not in PHASES:
        raise UserError(f"--phase must be one of {', '.join(PHASES)}, got {phase!r}")
    engine = system == ENGINE
    no_reuse = cache == "none" if engine else not SYSTEMS[system].reuses
    if phase in ("reuse", "mixed") and no_reuse:
        raise UserError(f"--phase {phase}: this system has no Reuse phase (every step refreshes the whole canvas)")
    if phase == "mixed" and not engine:
        raise UserError("--phase mixed: a static batch runs its rows in lock step (one phase per forward); "
                        "mixed steps are the engine's")
    if phase == "mixed" and batch == 1:
        raise UserError("--phase mixed needs --batch 2 or more (a Refresh and a Reuse member in one step)")


def next_phases(system, shape) -> list[bool] | None:
    """Whether each member of the next step refreshes (request order), or None when it cannot
    be told before the step (the engine about to admit requests)."""
    if is_engine(system):
        s, c = system.scheduler, system.config
        if s.waiting:
            return None
        out: list[bool] = []
        tokens = 0
        for r in s.running:                   # what Scheduler.schedule takes, FCFS within the budgets
            ph = r.phase(c.delay_step)        # under its own cache mode (auto: chosen at admission)
            cost = s.policy.cost(r, ph)
            if s.policy.plan is None and (len(out) >= c.max_num_seqs or tokens + cost > c.max_num_batched_tokens):
                break                         # (a look-ahead plan may defer some: the trace row tells)
            out.append(ph.is_refresh)
            tokens += cost
        return out
    b = system.batch
    if b is None:                             # a new static batch: every policy's first forward is a full one
        return [True] * min(len(system.waiting), system.max_batch_size) if system.waiting else None
    policy = getattr(system.policy, "inner", system.policy)
    return [baseline_forward(policy.name, policy.knobs, b, shape)[1].refresh] * b.size


def qualifies(phase: str, phases: list[bool] | None, batch: int) -> bool:
    """Does a step of these members' phases count for `phase` (serve: every step)?"""
    if phase == "serve":
        return True
    if phases is None or len(phases) != batch:
        return False
    n = sum(phases)
    return {"reuse": n == 0, "refresh": n == batch, "mixed": 0 < n < batch}[phase]


def confirmed(phase: str, predicted: list[bool] | None, row: dict) -> bool:
    """The step's trace row agrees with the prediction it was chosen by."""
    if phase == "serve":
        return True
    return (predicted is not None and row["requests"] == len(predicted) and row["refresh"] == sum(predicted))
