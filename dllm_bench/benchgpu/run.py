"""bench_gpu(): check the options (bad input is one error line before anything is written),
size the run (GPU or CPU scale; serve-22g's request count from the time budget), print the plan
with each step's estimate, run the steps in order (a step that raises is recorded as failed and
the next one runs), and rewrite bench.json and summary.md after every step."""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from dllm_bench import inputs
from dllm_bench.benchgpu import estimate as est
from dllm_bench.benchgpu import plan, summary
from dllm_bench.benchgpu.record import NOT_RUN, OK, Bench, StepRecord
from dllm_bench.benchgpu.scale import FULL_SYSTEMS, SMALL_SYSTEMS, Scale, for_device
from dllm_bench.benchgpu.steps.checkpoint import existing_dir
from dllm_bench.benchgpu.steps.serve import small_rates
from dllm_bench.benchgpu.subcommand import Commands
from dllm_bench.checkpoints.load import load_shape
from dllm_bench.checkpoints.presets import PRESETS
from dllm_bench.console import console
from dllm_bench.errors import UserError
from dllm_bench.results import make_run_id, results_root
from dllm_bench.systems.families import supports
from dllm_bench.systems.spec import ENGINE_KNOB_TABLE

MARGIN_S = 20.0  # of the budget kept for the parent's own work between steps


@dataclass(frozen=True)
class Options:
    model: str | None = None
    out: Path | None = None
    only: str | None = None
    device: str | None = None
    time_budget_s: float | None = 600.0


def check_model(model: str, scale: Scale) -> None:
    """A preset this device can make (or a committed one), or a checkpoint directory."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"--model {model}: not a checkpoint directory (no config.json)")
        return
    if model not in PRESETS:
        if "/" in model or model.startswith((".", "~")):
            raise UserError(f"--model {model}: no such checkpoint directory")
        raise UserError(f"--model: unknown model preset {model!r}; presets: {', '.join(PRESETS)}")
    preset = PRESETS[model]
    if not preset.makeable and not preset.asset:
        raise UserError(f"--model {model} describes a shape only ({preset.note})")
    if preset.draw_device != "cpu" and not scale.gpu:
        raise UserError(f"--model {model} is made on a CUDA device; on a CPU run `bench-gpu --model tiny`")


def check_out(out: Path | None) -> Path:
    path = out if out is not None else results_root() / make_run_id("bench-gpu")
    inputs.writable_dir(path, "--out")
    if path.is_dir() and any(path.iterdir()):
        raise UserError(f"--out {path} exists and is not empty (bench-gpu writes a fresh directory)")
    return path


def serving_cache() -> str:
    """The cache the `engine` system serves with when none is named (EngineConfig's default)."""
    return ENGINE_KNOB_TABLE["cache"].default


def for_model(systems: tuple[str, ...], model: str) -> tuple[str, ...]:
    """The systems (and variants) with a version for the family of --model (systems.families)."""
    model_type = load_shape(model).model_type
    return tuple(s for s in systems if supports(s.split(":")[0], model_type))


def engine_aliases(systems: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
    """serve-full's systems without a cache variant that is the engine's default (the `engine`
    point already measures it), and which variant each left-out one stands for."""
    same = f"engine:cache={serving_cache()}"
    return tuple(s for s in systems if s != same), ({same: "engine"} if same in systems else {})


def prepare(opts: Options, commands: Commands) -> tuple[Bench, list[plan.Step]]:
    device = inputs.device(opts.device) if opts.device else ("cuda" if torch.cuda.is_available() else "cpu")
    scale = for_device(device)
    model = opts.model or scale.model
    check_model(model, scale)
    if opts.time_budget_s is not None and opts.time_budget_s < 0:
        raise UserError(f"--time-budget must be >= 0 seconds (0: none), got {opts.time_budget_s:g}")
    steps = plan.select(opts.only)
    out = check_out(opts.out)
    full, aliases = engine_aliases(for_model(FULL_SYSTEMS, model))
    budget = opts.time_budget_s or None
    bench = Bench(out=out, scale=scale, costs=est.costs(scale), commands=commands, model=model,
                  model_dir=existing_dir(model), full_systems=full, small_prompts=scale.small_prompts[0],
                  aliases=aliases, time_budget_s=budget, small_systems=for_model(SMALL_SYSTEMS, model))
    if budget is not None and any(s.name == "serve-22g" for s in steps):
        others = sum(s.estimate(bench) for s in steps if s.name != "serve-22g")
        bench.small_prompts = est.small_prompts(bench.costs, scale, bench.small_systems, small_rates(bench),
                                                budget - MARGIN_S - others)
    return bench, steps


def _describe(bench: Bench) -> str:
    s = bench.scale
    return (f"{s.name} scale: model {bench.model}, serve preset {s.serve_preset} with fixed decoding; "
            f"{s.full_prompts} requests at saturation on {s.full_budget_label}; {bench.small_prompts} at "
            f"{s.small_budget_label}, at saturation and at {s.rate} req/s; engine profiled at batch "
            f"{', '.join(map(str, s.profile_batches))}")


def _run_step(bench: Bench, step: plan.Step, rec: StepRecord) -> None:
    left = bench.left_s()
    if left is not None and left < step.unit_s(bench):
        rec.status = NOT_RUN
        rec.detail = (f"time budget: {max(left, 0):.0f} s left of {bench.time_budget_s:.0f} s, it needs "
                      f"~{step.unit_s(bench):.0f} s (run it alone: --only {step.name})")
        return
    t0 = time.perf_counter()
    try:
        step.run(bench, rec)
    except Exception as e:  # noqa: BLE001 - a step's bug is its failure, the next step still runs
        (bench.out / "logs").mkdir(parents=True, exist_ok=True)
        (bench.out / "logs" / f"{step.name}.error.txt").write_text("".join(traceback.format_exception(e)))
        rec.fail(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} (logs/{step.name}.error.txt)")
    rec.seconds = time.perf_counter() - t0


def bench_gpu(opts: Options, commands: Commands) -> int:
    """Run the plan; the exit code is 0 when every selected step finished ok, 1 otherwise."""
    bench, steps = prepare(opts, commands)
    con = console()
    bench.out.mkdir(parents=True, exist_ok=True)
    bench.notes.append(_describe(bench))
    if not bench.scale.gpu:
        bench.notes.append("CPU run: the toy scale tests the pipeline end to end; the goals' targets are an H100's, "
                           "so the verdicts here say nothing about the engine.")
    for step in steps:
        bench.records[step.name] = StepRecord(step.name, round(step.estimate(bench), 1))
    total = sum(r.estimate_s for r in bench.records.values())
    con.print(f"bench-gpu → {bench.out}")
    con.print(bench.notes[0], highlight=False)
    con.print("plan: " + ", ".join(f"{r.name} ~{r.estimate_s:.0f} s" for r in bench.records.values())
              + f": ~{total:.0f} s" + (f" (budget {bench.time_budget_s:.0f} s)" if bench.time_budget_s else ""),
              highlight=False)
    if bench.time_budget_s and total > bench.time_budget_s:
        over = (f"the estimate is {total - bench.time_budget_s:.0f} s over the budget: a last step that no longer "
                f"fits is left out (summary.md names it; --only runs it alone, --time-budget 0 runs everything)")
        bench.notes.append(over)
        con.print(over, highlight=False)
    bench.save()
    summary.write(bench)
    for i, step in enumerate(steps, 1):
        rec = bench.records[step.name]
        head = f"[{i}/{len(steps)}] {step.name}"
        with con.status(f"{head}: {step.what} (~{rec.estimate_s:.0f} s)"):
            _run_step(bench, step, rec)
        took = f" in {rec.seconds:.1f} s" if rec.seconds is not None else ""
        con.print(f"{head}: {rec.status}{took} (estimate {rec.estimate_s:.0f} s): {rec.detail}", highlight=False,
                  markup=False)
        bench.save()
        summary.write(bench)
    con.print(f"{bench.elapsed_s():.0f} s; summary: {bench.out / 'summary.md'}", highlight=False)
    return 0 if all(r.status == OK for r in bench.records.values()) else 1

