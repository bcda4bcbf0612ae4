"""One `dllm-bench serve` run (docs/SERVE.md): the run directory (new, or resumed with the
same fingerprint), every (dataset, rps, system) point through the point loop
(dllm_bench.serve.points.measure_points), then the summaries, the comparisons against the best
baseline and the plots.

Rich progress, summaries and tables go to stderr; `--json` prints one JSON document on stdout.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from dllm_bench import console as cons
from dllm_bench import results
from dllm_bench.errors import UserError
from dllm_bench.metrics import ratio_table
from dllm_bench.results import fmt_rps
from dllm_bench.serve.config import ServeRun
from dllm_bench.serve.points import PlannedPoint, display_label, measure_points
from dllm_bench.serve.summary import print_comparison, print_summary
from dllm_bench.serve.workload import workload_shape
from dllm_bench.units import format_size
from workloads.serving import describe, describe_gen_mapping


def comparisons(points: list[dict], baseline_labels: set[str]) -> list[dict]:
    """Per (dataset, rps): the ratio table rows (ratios vs the best baseline)."""
    groups: dict[tuple, dict] = {}
    for s in points:
        groups.setdefault((s.get("dataset", ""), s["rps"]), {})[display_label(s)] = s
    out = []
    for (ds, rps), sums in groups.items():
        bl = [k for k, s in sums.items() if s["system"] in baseline_labels]
        rt = ratio_table(sums, bl)
        rows = [] if rt.empty else [{"system": k, **{c: (None if isinstance(v, float) and math.isnan(v) else v)
                                                     for c, v in r.items()}} for k, r in rt.iterrows()]
        out.append({"dataset": ds, "rps": rps, "best_baseline": rt.attrs.get("best_baseline"),
                    "summaries": sums, "baselines": bl, "rows": rows})
    return out


def _resume_id(run: ServeRun, root: Path, run_id: str | None) -> str:
    """The run to resume (--run-id, default the latest), refused unless it was made with the
    same fingerprint (its points would not be comparable)."""
    if run_id is None:
        latest = results.latest_run("serve", root)
        if latest is None:
            raise UserError(f"--resume: no serve run under {root} (give --run-id)")
        run_id = latest.name
    cfg_path = root / run_id / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"--resume: no run {run_id!r} under {root}")
    stored = json.loads(cfg_path.read_text(encoding="utf-8")).get("config", {})
    old, new = stored.get("fingerprint", {}), json.loads(json.dumps(run.fingerprint(), default=str))
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if diff:
        raise UserError(f"--resume: run {run_id} was made with different {', '.join(diff)}; "
                        "resume with the same options (or start a new run)")
    return run_id


def _run_config(run: ServeRun) -> dict:
    p = run.preset
    return {
        "preset": p.to_dict(), "preset_line": p.describe(), "model_dir": str(run.model_dir),
        "model": run.model_info, "systems": [v.to_dict() for v in run.systems],
        "datasets": run.datasets, "rps": run.rps, "arrivals": run.arrivals, "burstiness": run.burstiness,
        "seed": run.seed, "num_prompts": run.num_prompts, "duration": run.duration,
        "dataset_path": run.dataset_path, "time_scale": run.time_scale, "burstgpt_model": run.burstgpt_model,
        "memory_budget": run.memory_budget, "max_duration": run.max_duration, "num_warmups": run.num_warmups,
        "engine_defaults": run.engine_defaults, "baseline_defaults": run.baseline_defaults,
        "gen_mapping": describe_gen_mapping(p.block_length, p.gen_cap, p.gen_length),
        "workloads": {f"{ds}@{fmt_rps(r)}": describe(wl) for (ds, r), wl in run.workloads.items()},
        "fingerprint": run.fingerprint(),
    }


def _print_header(console, run: ServeRun, run_dir: Path, gen_mapping: str) -> None:
    p, info = run.preset, run.model_info

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)
    console.print(f"[bold]dllm-bench serve[/bold] → {run_dir}", highlight=False)
    say(p.describe())
    say(f"model {run.model_dir}: vocab {info['vocab_size']}, d_model {info['d_model']}, {info['n_layers']} "
        f"layers, head dim {info['head_dim']}; memory budget {format_size(run.memory_budget)}; {gen_mapping}")
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
          as_json: bool) -> int:
    """Measure every point of `run` (skipping those a resumed run finished), print and plot
    the results; returns the exit code (130 after Ctrl-C, 1 after a failed point)."""
    console = cons.console()
    p = run.preset
    baseline_labels = {v.label for v in run.systems if v.is_baseline}
    config = _run_config(run)
    root = results.results_root(result_dir)
    if resume:
        run_id = _resume_id(run, root, run_id)
    name = f"serve-{Path(str(p.model)).name}-{'+'.join(run.datasets)}"
    run_dir = results.create_run("serve", config, name=name, run_id=run_id, root=root, resume=resume)
    if resume:  # record systems/rps added by this invocation next to the original ones
        cfg = results.load_config(run_dir)
        c = cfg["config"]
        c["systems"] = list({s["label"]: s for s in c.get("systems", []) + config["systems"]}.values())
        c["rps"] = sorted(set(c.get("rps", [])) | set(run.rps), key=float)
        c["datasets"] = list(dict.fromkeys(c.get("datasets", []) + run.datasets))
        results.atomic_write_json(run_dir / "config.json", cfg)
    _print_header(console, run, run_dir, config["gen_mapping"])

    shape = workload_shape(run)
    planned = [PlannedPoint(ds, rps, v, run.workloads[(ds, rps)], shape)
               for ds in run.datasets for rps in run.rps if (ds, rps) in run.workloads for v in run.systems]
    done = results.finished_points(run_dir) if resume else set()
    outcome = measure_points(run, planned, run_dir, console, done=done)
    outcome.give_up_if_empty(run_dir, fresh=not resume)

    points = outcome.points
    order = {v.label: i for i, v in enumerate(run.systems)}
    points.sort(key=lambda s: (run.datasets.index(s["dataset"]) if s.get("dataset") in run.datasets else 0,
                               float(s["rps"]), order.get(s["system"], 99)))
    for s in points:
        print_summary(s, console, title=display_label(s))
    comps = comparisons(points, baseline_labels)
    for c in comps:
        if len(c["summaries"]) > 1:
            print_comparison(c["summaries"], c["baselines"], console,
                             title=f"{c['dataset']} @ {fmt_rps(c['rps'])} rps — vs best baseline")
    scenarios = {s["system"]: s for s in points if s.get("is_baseline")}
    for label, s in scenarios.items():  # which scenario each baseline row is
        note = "" if s.get("fits_budget") in (True, None) else " (exceeds the memory budget!)"
        console.print(f"{label}: {s.get('scenario')}{note}", markup=False, highlight=False)

    plots: list[str] = []
    finite = sorted({float(s["rps"]) for s in points if math.isfinite(float(s["rps"]))})
    if len(finite) >= 2 and not outcome.interrupted:
        plots = _plot(run_dir, {pp.key for pp in planned}, sorted(baseline_labels), 0.5 if 0.5 in finite else None)
        console.print(f"plots: {', '.join(plots)}", markup=False, highlight=False)
    console.print(p.describe(), markup=False, highlight=False)
    doc = {"run_id": run_dir.name, "run_dir": str(run_dir), "preset": p.to_dict(), "preset_line": p.describe(),
           "interrupted": outcome.interrupted, "failures": outcome.failures, "points": points, "plots": plots,
           "comparisons": [{k: v for k, v in c.items() if k != "summaries"} for c in comps]}
    return outcome.finish(console, run_dir, doc, as_json, resumable=True)


def _plot(run_dir: Path, keys: set, baselines: list[str], jitter: float | None) -> list[str]:
    # matplotlib costs ~1 s to import: only runs that plot (two or more finite rates) pay for it.
    from dllm_bench.plots import plot_all

    df = results.metrics_frame(run_dir)
    df = df[[results.PointKey(sy, float(r), d) in keys
             for sy, r, d in zip(df["system"], df["rps"], df["dataset"], strict=True)]]
    return [str(x) for x in plot_all(df, run_dir / "plots", baselines, jitter)]
