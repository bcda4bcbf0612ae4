"""`dllm-bench train`'s flags checked into a TrainConfig before anything is written: --out an
empty (or --force) writable directory, the comma lists parsed, and the task able to draw its
held-out probe with these knobs (a bad knob is one `error:` line, not a failure minutes in)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.train.loop import TrainConfig
from workloads.tasks import generated


def int_list(spec: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag} takes comma-separated integers, got {spec!r}") from None
    if not vals:
        raise UserError(f"{flag} is empty")
    return vals


def train_config(out: Path, *, force: bool, train_facts: str, ops: str, **knobs: Any) -> TrainConfig:
    """The config of `train`'s flags (the others are TrainConfig's fields by name)."""
    if inputs.writable_dir(out, "--out").exists() and (not out.is_dir() or (any(out.iterdir()) and not force)):
        raise UserError(f"--out {out} exists and is not an empty directory (use --force)")
    if knobs.get("threads") is not None and knobs["threads"] <= 0:
        raise UserError("--threads must be positive")
    try:
        cfg = TrainConfig(out=str(out), train_facts=int_list(train_facts, "--train-facts"),
                          ops=tuple(o.strip() for o in ops.split(",") if o.strip()), **knobs)
        generated.examples(cfg.task, "test", 1, context_facts=cfg.eval_facts, **generated.knobs_of(cfg.task, vars(cfg)))
    except ValueError as e:
        raise UserError(str(e)) from None
    return cfg
