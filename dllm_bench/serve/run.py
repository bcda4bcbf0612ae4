"""One `dllm-bench serve` run (docs/SERVE.md): the run directory (new, or resumed with the
same fingerprint), every (dataset, rps, system) point through the point loop
(dllm_bench.serve.points.measure_points), then the summaries, the comparisons against the best
baseline and the plots.

`serve_command` is the command's entry: its options (ServeCommand: the serving run's ServeOptions
plus the run directory, output and --endpoint flags) checked, an endpoint added as one more system.
Rich progress, summaries and tables go to stderr; `--json` prints one JSON document on stdout.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

from rich.console import Console

from dllm_bench import console as cons
from dllm_bench import inputs, results
from dllm_bench.device_defaults import is_cuda
from dllm_bench.errors import UserError
from dllm_bench.repeats import aggregate_points, repeat_seeds
from dllm_bench.results import fmt_rps
from dllm_bench.serve.config import ServeRun
from dllm_bench.serve.endpoint import endpoint_api_key, resolve_endpoint
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.serve.points import (
    PlannedPoint,
    display_label,
    keep_run_budget,
    measure_points,
    record_repeats,
    resume_id,
    scenario_lines,
)
from dllm_bench.serve.speed_gauge import DRIFT_WARN, drift
from dllm_bench.serve.summary import comparisons, print_comparison, print_summary, too_few_line
from dllm_bench.serve.workload import repeat_workloads, workload_shape
from dllm_bench.units import format_size
from workloads.serving import describe, describe_gen_mapping

# What a CPU run adds under its measured table (the command passes dllm_bench.simulate.projection's
# gpu_projection): it prints its block and returns its document, or None when it has none.
Projector = Callable[[ServeRun, Console], dict | None]


@dataclass(frozen=True)
class ServeCommand(ServeOptions):
    """`serve`'s options as given: the serving run's, its run directory and output, and the
    OpenAI-compatible server it may measure too (--endpoint)."""
    result_dir: Path | None = None
    run_id: str | None = None
    resume: bool = False
    as_json: bool = False
    no_projection: bool = False
    endpoint: str | None = None
    endpoint_model: str | None = None
    api: str = "completions"
    stream: bool = True
    dllm_extras: bool = True
    api_key: str | None = None


# The options that shape only the systems `serve` runs itself (field -> flag): with --endpoint alone
# (no --systems) there is none of them, and such a flag would be recorded without any effect.
LOCAL_ONLY = {"trace_steps": "--trace-steps", "cuda_graphs": "--[no-]cuda-graphs", "tensor_parallel_size":
              "--tensor-parallel-size", "no_profile_cache": "--no-profile-cache", "max_num_batched_tokens":
              "--max-num-batched-tokens", "max_num_logits": "--max-num-logits", "max_num_seqs": "--max-num-seqs",
              "retention": "--retention", "baseline_batch": "--baseline-batch"}


def check_endpoint_alone(o: ServeCommand) -> None:
    """With --endpoint and no --systems, refuse a flag that applies to the systems serve runs itself."""
    if o.endpoint is None or o.systems is not None:
        return
    default = {f.name: f.default for f in fields(ServeCommand)}
    given = [flag for k, flag in LOCAL_ONLY.items() if getattr(o, k) != default[k]]
    if given:
        raise UserError(f"{given[0]} applies to the systems serve runs itself, and with --endpoint alone it runs "
                        "none: leave it out, or name them with --systems")


def serve_command(o: ServeCommand, projection: Projector | None = None) -> int:
    """`serve` from its options: an --endpoint (which may name the model) resolved first, every
    option checked before a run directory exists, then `serve`; its exit code."""
    if o.api_key is not None and o.endpoint is None:
        raise UserError("--api-key is what serve sends to --endpoint: give --endpoint too")
    check_endpoint_alone(o)
    ep, key = None, endpoint_api_key(o.api_key)
    if o.endpoint is not None:
        ep, model = resolve_endpoint(o.endpoint, o.endpoint_model, o.api, o.stream, o.dllm_extras, o.model,
                                     api_key=key)
        o = replace(o, model=model)
    result_dir, run_id = inputs.result_dir(o.result_dir), inputs.run_id(o.run_id)
    run = resolve_run(o)
    if ep is not None:
        run.systems = (run.systems if o.systems is not None else []) + [ep.variant()]
        run.api_key = key
    return serve(run, result_dir=result_dir, run_id=run_id, resume=o.resume, as_json=o.as_json,
                 projection=None if o.no_projection else projection)


def _run_config(run: ServeRun) -> dict:
    p = run.preset
    return {
        "preset": p.to_dict(), "preset_line": p.describe(), "model_dir": str(run.model_dir),
        "model": run.model_info, "systems": [v.to_dict() for v in run.systems],
        "datasets": run.datasets, "rps": run.rps, "arrivals": run.arrivals, "burstiness": run.burstiness,
        "seed": run.seed, "num_prompts": run.num_prompts, "duration": run.duration,
        "dataset_path": run.dataset_path, "time_scale": run.time_scale, "burstgpt_model": run.burstgpt_model,
        "memory_budget": run.memory_budget, "memory_budget_source": run.memory_budget_source,
        "max_duration": run.max_duration, "num_warmups": run.num_warmups, "graph_capture": run.graph_capture,
        "graph_keep": run.graph_keep,
        "engine_defaults": run.engine_defaults, "baseline_defaults": run.baseline_defaults,
        "gen_mapping": describe_gen_mapping(p.block_length, p.gen_cap, p.gen_length),
        "workloads": {f"{ds}@{fmt_rps(r)}": describe(wl) for (ds, r), wl in run.workloads.items()},
        "fingerprint": run.fingerprint(), "repeats": run.repeats,
        "repeat_seeds": repeat_seeds(run.seed, run.repeats), "trace_steps": run.trace_steps,
    }


def _print_header(console, run: ServeRun, run_dir: Path, gen_mapping: str) -> None:
    p, info = run.preset, run.model_info

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)
    console.print(f"[bold]dllm-bench serve[/bold] → {run_dir}", highlight=False)
    say(p.describe())
    say(f"model {run.model_dir}: vocab {info['vocab_size']}, d_model {info['d_model']}, {info['n_layers']} "
        f"layers, head dim {info['head_dim']}; memory budget {format_size(run.memory_budget)}"
        + (f" ({run.memory_budget_source['detail']})" if run.budget_is_auto else "") + f"; {gen_mapping}")
    say(f"systems: {', '.join(v.label for v in run.systems)}; rps: {', '.join(fmt_rps(r) for r in run.rps)}; "
        f"datasets: {', '.join(run.datasets)}; arrivals {run.arrivals}"
        + (f" (burstiness {run.burstiness:g})" if run.arrivals == "gamma" else "") + f"; seed {run.seed}")
    for (ds, r), wl in run.workloads.items():
        d = describe(wl)
        say(f"workload {ds} @ {fmt_rps(r)} rps: {d['num_requests']} requests over {d['duration_s']:.1f} s, "
            f"prompt {d['prompt_len_min']}-{d['prompt_len_max']} tokens (mean {d['prompt_len_mean']:.0f}), "
            f"gen_length {d['gen_length_min']}-{d['gen_length_max']} (mean {d['gen_length_mean']:.0f}), "
            "steps = gen_length")


def serve(run: ServeRun, *, result_dir: Path | None, run_id: str | None, resume: bool,
          as_json: bool, projection: Projector | None = None) -> int:
    """Measure every point of `run` (skipping those a resumed run finished), print and plot
    the results, and on a CPU what `projection` adds (the same comparison simulated at GPU
    scale); returns the exit code (130 after Ctrl-C, 1 after a failed point)."""
    console = cons.console()
    p = run.preset
    baseline_labels = {v.label for v in run.systems if v.is_baseline}
    config = _run_config(run)
    root = results.results_root(result_dir)
    if resume:
        run_id = resume_id("serve", run.fingerprint(), root, run_id)
    name = f"serve-{Path(str(p.model)).name}-{'+'.join(run.datasets)}"
    run_dir = results.create_run("serve", config, name=name, run_id=run_id, root=root, resume=resume)
    if resume:  # record systems/rps added by this invocation next to the original ones
        cfg = results.load_config(run_dir)
        c = cfg["config"]
        c["systems"] = list({s["label"]: s for s in c.get("systems", []) + config["systems"]}.values())
        c["rps"] = sorted(set(c.get("rps", [])) | set(run.rps), key=float)
        c["datasets"] = list(dict.fromkeys(c.get("datasets", []) + run.datasets))
        results.atomic_write_json(run_dir / "config.json", cfg)
        record_repeats(run_dir, run.seed, run.repeats)
        keep_run_budget(run, run_dir)
    _print_header(console, run, run_dir, config["gen_mapping"])

    planned = []
    for i, seed in enumerate(repeat_seeds(run.seed, run.repeats)):  # repeat-major: a whole comparison first
        wls = repeat_workloads(run, i)
        shape = workload_shape(run, wls)
        planned += [PlannedPoint(ds, rps, v, wls[(ds, rps)], shape, repeat=i, seed=seed)
                    for ds in run.datasets for rps in run.rps if (ds, rps) in wls for v in run.systems]
    done = results.finished_points(run_dir) if resume else set()
    outcome = measure_points(run, planned, run_dir, console, done=done)
    outcome.give_up_if_empty(run_dir, fresh=not resume)

    points = aggregate_points(outcome.points)
    order = {v.label: i for i, v in enumerate(run.systems)}
    points.sort(key=lambda s: (run.datasets.index(s["dataset"]) if s.get("dataset") in run.datasets else 0,
                               float(s["rps"]), order.get(s["system"], 99)))
    for s in points:
        reps = f" (median of {s['repeats']} repeats)" if s.get("repeats", 1) > 1 else ""
        print_summary(s, console, title=display_label(s) + reps)
    comps = comparisons(points, baseline_labels)
    for c in comps:
        if len(c["summaries"]) > 1:
            print_comparison(c["summaries"], c["baselines"], console,
                             title=f"{c['dataset']} @ {fmt_rps(c['rps'])} rps — vs best baseline")
    few = too_few_line(s for c in comps if len(c["summaries"]) > 1 for s in c["summaries"].values())
    for line in scenario_lines(points) + ([few] if few else []):
        console.print(line, markup=False, highlight=False)

    plots: list[str] = []
    finite = sorted({float(s["rps"]) for s in points if math.isfinite(float(s["rps"]))})
    if len(finite) >= 2 and not outcome.interrupted:
        plots = _plot(run_dir, {pp.key for pp in planned}, sorted(baseline_labels), 0.5 if 0.5 in finite else None)
        console.print(f"plots: {', '.join(plots)}", markup=False, highlight=False)
    console.print(p.describe(), markup=False, highlight=False)
    readings = [x for s in outcome.points for x in s.get("speed_gauge_readings_s") or []]
    spread = drift(readings)
    if spread and spread > DRIFT_WARN:
        console.print(f"[yellow]warning: this machine's speed changed by {spread:.2f}x over the run (a reference "
                      f"GEMM read {min(readings) * 1e3:.3g}-{max(readings) * 1e3:.3g} ms around the points): "
                      "differences of that size between points may be the machine's (docs/SIMULATE.md)[/yellow]",
                      highlight=False)
    projected = None
    if projection is not None and not is_cuda(p.device) and not outcome.interrupted:
        projected = projection(run, console)
        if projected is not None:
            results.atomic_write_json(run_dir / "projection.json", projected)
    doc = {"run_id": run_dir.name, "run_dir": str(run_dir), "preset": p.to_dict(), "preset_line": p.describe(),
           "interrupted": outcome.interrupted, "failures": outcome.failures, "repeats": run.repeats,
           "points": points, "repeat_points": outcome.points, "plots": plots, "speed_gauge_drift": spread,
           "comparisons": [{k: v for k, v in c.items() if k != "summaries"} for c in comps],
           "projection": projected}
    return outcome.finish(console, run_dir, doc, as_json, resumable=True)


def _plot(run_dir: Path, keys: set, baselines: list[str], jitter: float | None) -> list[str]:
    # matplotlib costs ~1 s to import: only runs that plot (two or more finite rates) pay for it.
    from dllm_bench.plots import plot_all

    df = results.metrics_frame(run_dir, aggregate=True)
    wanted = {(k.system, k.rps, k.dataset) for k in keys}
    df = df[[(sy, float(r), d) in wanted for sy, r, d in zip(df["system"], df["rps"], df["dataset"], strict=True)]]
    return [str(x) for x in plot_all(df, run_dir / "plots", baselines, jitter)]
