"""`dllm-bench sweep --scheduler phase,lookahead`: the engine's scheduler as a sweep setting. Each
engine system of the run that does not choose a scheduler itself is swept once per scheduler
listed (its label gains `scheduler=S`), so the Fig. 7 table puts, e.g., the paper's phase
scheduler and the look-ahead one (engine.scheduler.Lookahead, docs/SCHEDULER.md) side by side against
the same baseline on the same fixed-length workloads. Baselines and engines that set
`scheduler=` are kept as given.
"""
from __future__ import annotations

from dllm_bench.errors import UserError
from dllm_bench.systems.spec import ENGINE, parse_systems
from dllm_bench.units import comma_list
from engine.config import SCHEDULERS


def _scheduler(name: str) -> str:
    if name not in SCHEDULERS:
        raise UserError(f"--scheduler: expected one of {', '.join(SCHEDULERS)}, got {name!r}")
    return name


def with_schedulers(systems: str, schedulers: str | None) -> str:
    """The --systems text with every engine system that sets no scheduler once per scheduler in
    `schedulers` (a comma list; None: unchanged)."""
    if schedulers is None:
        return systems
    names = comma_list(schedulers, "--scheduler", _scheduler)
    out: list[str] = []
    for v in parse_systems(systems):
        if v.name != ENGINE or "scheduler" in v.knob_dict:
            out.append(v.label)
            continue
        out += [f"{v.label}{',' if v.knobs else ':'}scheduler={s}" for s in names]
    return ",".join(out)
