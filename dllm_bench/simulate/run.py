"""One `dllm-bench simulate` run: every (dataset, rps, system) point of a resolved ServeRun
simulated in-process (dllm_bench.simulate.simulator.simulate_point) and written in serve's
layout (results.write_point: summary.json, requests.jsonl; run-level metrics.csv; the serving
plots), each summary marked `simulated: true` with its hardware and implementation profiles.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

from dllm_bench import console as cons
from dllm_bench import results
from dllm_bench.errors import UserError
from dllm_bench.metrics.serving import summarize
from dllm_bench.repeats import aggregate_points, repeat_seeds
from dllm_bench.results import fmt_rps
from dllm_bench.serve.points import PlannedPoint, point_line, point_summary, scenario_lines
from dllm_bench.serve.summary import comparisons, print_comparison
from dllm_bench.serve.workload import repeat_workloads, shape_of, workload_shape
from dllm_bench.simulate import drift, validate
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.hardware import Hardware
from dllm_bench.simulate.implementations import MEASURED_HOST, implementations_line
from dllm_bench.simulate.simulator import DTYPE_BYTES, SimSetup, simulate_point
from dllm_bench.systems.build import build_system
from engine.engine import DTYPES
from engine.models import config_from_pretrained, load_model


def make_setup(run, hw: Hardware, impls: dict[str, str], loadable: bool) -> SimSetup:

    cfg = config_from_pretrained(run.model_dir)
    real = _real_capacity(run) if hw.kind == "cpu" and loadable else None
    return SimSetup(cfg, ModelShape.from_config(cfg, DTYPE_BYTES[run.preset.dtype]), hw, run.preset.dtype, impls,
                    memory_budget=float(run.memory_budget), engine_defaults=run.engine_defaults,
                    baseline_defaults=run.baseline_defaults, real_capacity=real)


def _real_capacity(run):
    """serve's own builders (cached KV-pool profiles and static-batch searches), so a simulated
    point on this machine has exactly the measured point's pool or batch."""

    model = load_model(run.model_dir, DTYPES[run.preset.dtype], "cpu")
    keep = ("kv_pool_tokens", "max_batch_size", "scenario", "scenario_kind", "fits_budget", "peak_bytes")

    def capacity(variant, seed: int | None = None) -> dict:
        # serve sizes a repeat's static batches for that repeat's workloads (workload seed)
        i = 0 if seed is None or not 0 <= seed - run.seed < run.repeats else seed - run.seed
        shape = workload_shape(run, repeat_workloads(run, i))
        built = build_system(variant, model_dir=run.model_dir, dtype=run.preset.dtype, device="cpu",
                             memory_budget=run.memory_budget, shape=shape, engine_defaults=run.engine_defaults,
                             baseline_defaults=run.baseline_defaults, max_model_len=run.preset.max_model_len,
                             use_cache=run.use_cache, model=model)
        return {k: built.info.get(k) for k in keep if built.info.get(k) is not None}
    return capacity


def _pinned(pin: dict) -> str:
    """What a system is pinned to; a capacity that differs between workload seeds, per seed."""
    knobs, by_seed = pin.get("knobs", {}), pin.get("info_by_seed") or {None: pin.get("info", {})}
    what = []
    for key, name in (("kv_pool_tokens", "KV pool {} tokens"), ("max_batch_size", "static batch B={}")):
        vals = {seed: info[key] for seed, info in by_seed.items() if key in info}
        if len(set(vals.values())) == 1:
            what.append(name.format(next(iter(vals.values()))))
        elif vals:
            what.append(name.format(", ".join(f"{v} (seed {seed})" for seed, v in sorted(vals.items()))))
    return ", ".join(what + [f"{k}={v}" for k, v in knobs.items()])


def _simulate_one(run, setup: SimSetup, pp: PlannedPoint, run_dir: Path, console) -> dict:
    """One point simulated and written in serve's layout; its summary."""
    hw, v = setup.hardware, pp.variant
    t0 = time.process_time()
    out = simulate_point(v, setup, pp.workload, run.preset.block_length, max_duration=run.max_duration,
                         max_concurrency=run.max_concurrency, seed=pp.seed or 0)
    s, recs, extra = point_summary(out, pp, run)
    extra.update(simulated=True, hardware=hw.name, hardware_file=hw.path, impl=setup.impls[v.name],
                 scenario=out["info"].get("scenario"), scenario_kind=out["info"].get("scenario_kind", "engine"),
                 max_batch_size=out["info"].get("max_batch_size"), kv_pool_tokens=out["info"].get("kv_pool_tokens"),
                 graph_capture=out["info"].get("graph_capture"), graph_keep=out["info"].get("graph_keep"),
                 **{f"graphs_{k}": len(keys) for k, keys in (out["info"].get("graphs") or {}).items()},
                 simulation_cpu_seconds=time.process_time() - t0)
    results.write_point(run_dir, pp.key, s, recs, extra)
    point = {**extra, **s, "system": v.label, "dataset": pp.dataset, "repeat": pp.repeat}
    console.print(point_line(point), markup=False, highlight=False)
    return point


def _at_measured_speed(run, setup: SimSetup, meas: pd.DataFrame, console) -> pd.DataFrame:
    """Every measured point that read the speed gauge, simulated again (same workload seed) with
    each cost scaled by the machine's speed during that point relative to the calibration: the
    simulator's error once the machine's drift between calibration and measurement is taken out.
    Kept in memory; nothing is written besides the validation tables."""
    speeds = drift.measured_speeds(meas, *drift.speed_reference(setup.hardware.fit))
    variants = {v.label: v for v in run.systems}
    workloads: dict[int, dict] = {}            # repeat -> its workloads, built once
    rows = []
    for r in speeds.itertuples(index=False):
        i = int(r.workload_seed) - run.seed
        v = variants.get(r.system)
        if v is None or not 0 <= i < run.repeats:
            continue
        if i not in workloads:
            workloads[i] = repeat_workloads(run, i)
        wl = workloads[i].get((r.dataset, float(r.rps)))
        if wl is None:
            continue
        out = simulate_point(v, replace(setup, speed=float(r.speed)), wl, run.preset.block_length,
                             max_duration=run.max_duration, seed=int(r.workload_seed))
        rows.append({**summarize(out["result"]), "dataset": r.dataset, "system": r.system, "rps": float(r.rps),
                     "workload_seed": int(r.workload_seed), "speed": float(r.speed)})
    if rows:
        console.print(f"validation: {len(rows)} measured points simulated again at their machine speed "
                      f"(speed gauge)", markup=False, highlight=False)
    return pd.DataFrame(rows)


def simulate_serve(run, setup: SimSetup, *, result_dir: Path | None, run_id: str | None, as_json: bool,
                   validate_against: list[Path] | None = None) -> int:
    """Simulate every point; with `validate_against` (measured serve runs of the same workload)
    also print and write the per-cell validation (dllm_bench.simulate.validate). Exit code 1
    when no cell of the measured runs was simulated."""
    console = cons.console()
    hw = setup.hardware
    config = {"simulated": True, "hardware": hw.to_dict(), "hardware_file": hw.path, "impls": setup.impls,
              "validation_label": hw.validation_label(), "pinned": setup.pinned,
              "preset": run.preset.to_dict(), "model_dir": str(run.model_dir), "model": run.model_info,
              "systems": [v.to_dict() for v in run.systems], "datasets": run.datasets, "rps": run.rps,
              "arrivals": run.arrivals, "burstiness": run.burstiness, "seed": run.seed,
              "num_prompts": run.num_prompts, "memory_budget": run.memory_budget, "repeats": run.repeats,
              "engine_defaults": run.engine_defaults, "baseline_defaults": run.baseline_defaults,
              "decoding": str(run.decoding),
              "steps_per_block": setup.steps_plan.describe() if setup.steps_plan is not None else None}
    name = f"simulate-{hw.name}-{Path(str(run.preset.model)).name}-{'+'.join(run.datasets)}"
    try:
        run_dir = results.create_run("simulate", config, name=name, run_id=run_id, root=results.results_root(result_dir))
    except FileExistsError as e:
        raise UserError(str(e)) from None
    console.print(f"[bold]dllm-bench simulate[/bold] on {hw.name} ({hw.description}) → {run_dir}", highlight=False)
    console.print(run.preset.describe(), markup=False, highlight=False)
    what = f"{hw.name}: {hw.validation_label()}; " + implementations_line({v.label: setup.impls[v.name] for v in run.systems})
    console.print(what, markup=False, highlight=False)
    for v in run.systems:
        pin = setup.pinned.get(v.label)
        if pin:
            console.print(f"{v.label}: simulated as measured ({_pinned(pin)})", markup=False, highlight=False)
    for v in run.systems:
        if setup.impls[v.name] == MEASURED_HOST and not hw.host_fitted(MEASURED_HOST, v.name):
            console.print(f"[yellow]warning: {hw.name} has no host time fitted for {v.name} (dllm-bench calibrate "
                          f"--systems {v.name}): its steps are charged the operators' time alone[/yellow]")
    points = []
    for i, seed in enumerate(repeat_seeds(run.seed, run.repeats)):  # serve's repeats: workload seed = seed + i
        for (ds, rps), wl in repeat_workloads(run, i).items():
            for v in run.systems:
                points.append(_simulate_one(run, setup, PlannedPoint(
                    ds, rps, v, wl, shape_of(wl, run.preset.block_length), repeat=i, seed=seed), run_dir, console))
    if run.repeats > 1:
        points = aggregate_points(points)
    baseline_labels = {v.label for v in run.systems if v.is_baseline}
    for c in comparisons(points, baseline_labels):
        if len(c["summaries"]) > 1:
            print_comparison(c["summaries"], c["baselines"], console,
                             title=f"simulated on {hw.name} ({hw.validation_label(short=True)}): {c['dataset']} @ "
                                   f"{fmt_rps(c['rps'])} rps — vs best baseline")
    for line in scenario_lines(points):
        console.print(line, markup=False, highlight=False)
    plots: list[str] = []
    if len({float(s["rps"]) for s in points if math.isfinite(float(s["rps"]))}) >= 2:
        from dllm_bench.plots import plot_all  # matplotlib costs ~1 s to import: only runs that plot pay

        plots = [str(p) for p in plot_all(results.metrics_frame(run_dir), run_dir / "plots", sorted(baseline_labels))]
        console.print(f"plots: {', '.join(plots)}", markup=False, highlight=False)
    code, validation = 0, None
    if validate_against:
        meas = validate.measured_frame(validate_against)
        df = validate.compare(run_dir, validate_against, _at_measured_speed(run, setup, meas, console), meas)
        if df.empty:
            console.print("validation: no (dataset, system, rps) cell of the measured runs was simulated; "
                          "give the same --dataset, --systems, --rps and --preset as those runs", markup=False,
                          highlight=False)
            code = 1
        else:
            floor = validate.reproducibility([results.metrics_frame(d) for d in validate_against])
            validation = validate.write(run_dir, df, validate_against, floor, what)
            console.print(validate.as_markdown(df, floor), markup=False, highlight=False)
            console.print(f"validation: {run_dir / 'validation.md'}", markup=False, highlight=False)
    console.print(f"results: {run_dir}", markup=False, highlight=False)
    if as_json:
        doc = {"run_id": run_dir.name, "run_dir": str(run_dir), "simulated": True, "hardware": hw.name,
               "hardware_validation": hw.validation_label(), "impls": setup.impls,
               "points": points, "plots": plots, "validation": validation}
        sys.stdout.write(json.dumps(results._clean(doc), default=results._default, allow_nan=False) + "\n")
    return code
