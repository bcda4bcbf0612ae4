"""The steps of bench-gpu in the order they run, and `--only`.

The order puts first what the goals need most: the checkpoint and doctor (nothing else is worth
running on a broken machine), serving on the whole GPU and at 22 GiB (most goals), then the
engine's step profile (graphs against eager). The baselines' step profiles (each at the batch
serve-full measured for it) and the memory report answer no goal: they run when --only names
them, so the default run fits 10 minutes on an H100. A divisible step (one sub-command per
entry) stops at the time budget on its own; any other step is left out when its estimate no
longer fits."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dllm_bench.benchgpu.record import Bench, StepRecord
from dllm_bench.benchgpu.steps import checkpoint, doctor, memory, profile, serve
from dllm_bench.errors import UserError


@dataclass(frozen=True)
class Step:
    name: str
    what: str
    estimate: Callable[[Bench], float]
    run: Callable[[Bench, StepRecord], None]
    unit: Callable[[Bench], float] | None = None   # a divisible step: the time of one of its sub-commands
    default: bool = True                           # in a run without --only

    def unit_s(self, bench: Bench) -> float:
        """The least time worth starting it with."""
        return self.unit(bench) if self.unit is not None else self.estimate(bench)


STEPS = (
    Step("checkpoint", "make the random-weight model (or check --model)", checkpoint.estimate, checkpoint.run),
    Step("doctor", "dllm-bench doctor on the device and the checkpoint", doctor.estimate, doctor.run),
    Step("serve-full", "serve at saturation on the whole GPU", serve.estimate_full, serve.run_full),
    Step("serve-22g", "serve at 22 GiB: saturation and a steady rate", serve.estimate_small, serve.run_small),
    Step("profile", "profile-step: the engine per batch, graphs on/off", profile.estimate, profile.run,
         unit=lambda b: b.costs.profile_s),
    Step("profile-baselines", "profile-step: each baseline at its max-fit batch", profile.estimate_baselines,
         profile.run_baselines, unit=lambda b: b.costs.profile_s, default=False),
    Step("memory", "dllm-bench memory at 22 GiB and the whole GPU", memory.estimate, memory.run,
         unit=lambda b: b.costs.load_s, default=False),
)
NAMES = tuple(s.name for s in STEPS)
DEFAULT = tuple(s.name for s in STEPS if s.default)


def select(only: str | None) -> list[Step]:
    """The steps `--only a,b` names (in the plan's order), or the default ones."""
    if only is None:
        return [s for s in STEPS if s.default]
    names = [n.strip() for n in only.split(",") if n.strip()]
    if not names:
        raise UserError(f"--only names no step; steps: {', '.join(NAMES)}")
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise UserError(f"--only: unknown step(s) {', '.join(unknown)}; steps: {', '.join(NAMES)}")
    return [s for s in STEPS if s.name in names]
