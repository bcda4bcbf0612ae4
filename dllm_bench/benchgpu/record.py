"""What a bench-gpu run knows as it goes: each step's record (status, estimated and actual
seconds, one line of detail, its files, the data the summary reads) and the run's context that
the steps share (sizes, the model, which sub-commands exist, the time left). bench.json is the
whole of it, written after every step beside summary.md."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dllm_bench.benchgpu.estimate import Costs
from dllm_bench.benchgpu.scale import SMALL_SYSTEMS, Scale
from dllm_bench.benchgpu.subcommand import Commands
from dllm_bench.results import atomic_write_json

OK, FAILED, SKIPPED, NOT_RUN = "ok", "failed", "skipped", "not run"


@dataclass
class StepRecord:
    name: str
    estimate_s: float
    status: str = NOT_RUN
    seconds: float | None = None
    detail: str = ""
    outputs: list[str] = field(default_factory=list)   # paths relative to the results directory
    data: dict[str, Any] = field(default_factory=dict)

    def fail(self, detail: str) -> None:
        self.status, self.detail = FAILED, detail


@dataclass
class Bench:
    out: Path
    scale: Scale
    costs: Costs
    commands: Commands
    model: str                          # --model as given (or the scale's preset)
    model_dir: Path | None              # its checkpoint directory once it exists
    full_systems: tuple[str, ...]
    small_prompts: int
    aliases: dict[str, str]             # a variant left out of serve-full -> the point that is the same system
    time_budget_s: float | None
    small_systems: tuple[str, ...] = SMALL_SYSTEMS   # serve-22g's: those with a version for the model's family
    records: dict[str, StepRecord] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)       # lines the summary prints under its title
    started: float = field(default_factory=time.perf_counter)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def left_s(self) -> float | None:
        return None if self.time_budget_s is None else self.time_budget_s - self.elapsed_s()

    def model_arg(self) -> str:
        """What sub-commands get as --model: the directory when it exists (nothing is made
        twice), else the preset's name."""
        return str(self.model_dir) if self.model_dir is not None else self.model

    def rel(self, path: Path) -> str:
        return str(Path(path).relative_to(self.out))

    def log(self, name: str) -> Path:
        return self.out / "logs" / f"{name}.log"

    def data(self, step: str) -> dict[str, Any]:
        rec = self.records.get(step)
        return rec.data if rec is not None else {}

    def document(self) -> dict:
        return {"scale": asdict(self.scale), "model": self.model, "model_dir": str(self.model_dir or ""),
                "full_systems": list(self.full_systems), "small_systems": list(self.small_systems),
                "aliases": self.aliases,
                "small_prompts": self.small_prompts,
                "time_budget_s": self.time_budget_s, "elapsed_s": round(self.elapsed_s(), 1), "notes": self.notes,
                "steps": [asdict(r) for r in self.records.values()]}

    def save(self) -> None:
        atomic_write_json(self.out / "bench.json", self.document())
