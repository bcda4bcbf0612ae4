"""One `dllm-bench serve` run (docs/SERVE.md): the resolved options and workloads (ServeRun),
then every (dataset, rps, system) point one after another, each in a fresh worker process
(dllm_bench/serve/process.py) pinned to the same torch thread count.

Each finished point is persisted at once (results.write_point), so Ctrl-C keeps what finished
and `--resume` skips it. Rich progress, summaries and tables go to stderr; `--json` prints one
JSON document on stdout. Options are checked and resolved into a ServeRun by
dllm_bench/commands/serve.py.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllm_bench.errors import UserError


# ---------------------------------------------------------------- the resolved run
@dataclass
class ServeRun:
    preset: Any                      # ServePreset with CLI overrides applied
    model_dir: Path
    model_info: dict
    systems: list                    # [SystemVariant]
    datasets: list[str]
    rps: list[float]                 # for trace arrivals: the single offered rate per dataset
    arrivals: str
    burstiness: float
    seed: int
    num_prompts: int | None
    duration: float | None
    dataset_path: str | None
    time_scale: float
    burstgpt_model: str | None
    memory_budget: int | None
    max_duration: float | None
    num_warmups: int
    use_cache: bool
    workloads: dict = field(default_factory=dict)   # (dataset, rps) -> [ServingRequest]

    @property
    def engine_defaults(self) -> dict:
        p = self.preset
        return {"max_num_batched_tokens": p.max_num_batched_tokens, "max_num_logits": p.max_num_logits,
                "max_num_seqs": p.max_num_seqs, "retention": p.retention}

    @property
    def baseline_defaults(self) -> dict:
        knobs = {k: dict(v) for k, v in self.preset.baseline_knobs.items()}
        # One retention for both sparse systems (the paper's "Algorithmic Consistency").
        knobs.setdefault("sparse-dllm", {})["keep_ratio"] = self.preset.retention
        return knobs

    def fingerprint(self) -> dict:
        """What a resumed run must share with the original for its points to be comparable."""
        p = self.preset
        return {"model": str(self.model_dir), "preset": p.to_dict() | {"rps": None}, "seed": self.seed,
                "arrivals": self.arrivals, "burstiness": self.burstiness, "num_prompts": self.num_prompts,
                "duration": self.duration, "dataset_path": self.dataset_path, "time_scale": self.time_scale,
                "burstgpt_model": self.burstgpt_model, "memory_budget": self.memory_budget,
                "max_duration": self.max_duration}


# ---------------------------------------------------------------- point summaries and comparisons
def _display_label(summary: dict) -> str:
    label = summary["system"]
    if summary.get("is_baseline"):
        b = summary.get("max_batch_size")
        kind = summary.get("scenario_kind", "")
        label += f" [B={b} {'max-fit' if kind == 'max-fit' else 'fixed'}]"
    if summary.get("interrupted"):
        label += " (interrupted)"
    return label


def point_summary(out: dict, variant, rps: float, run: ServeRun, workload) -> tuple[dict, list, dict]:
    from dllm_bench.metrics import summarize

    res, info = out["result"], out["info"]
    summary = summarize(res)
    summary["rps"] = rps
    extra = {
        "system_name": variant.name, "is_baseline": variant.is_baseline, "knobs": info.get("knobs"),
        "scenario": info.get("scenario"), "scenario_kind": info.get("scenario_kind", "engine"),
        "max_batch_size": info.get("max_batch_size"), "kv_pool_tokens": info.get("kv_pool_tokens"),
        "fits_budget": info.get("fits_budget"), "peak_bytes": info.get("peak_bytes"),
        "memory_budget": run.memory_budget, "torch_threads": info.get("torch_threads"),
        "build_seconds": info.get("build_seconds"), "profile_cached": info.get("profile_cached"),
        "preset": run.preset.name, "num_prompts": len(workload), "peak_rss_bytes": info.get("peak_rss_bytes"),
        "stats": res.get("stats"),
    }
    if info.get("profile"):
        extra["profile"] = info["profile"]
    recs = [{"status": "finished", **r} for r in res["records"]]
    recs += [{"status": "rejected", **r} for r in res.get("rejected", [])]
    recs += [{"status": "unfinished", "request_id": rid} for rid in res.get("unfinished_ids", [])]
    return summary, recs, extra


def _point_line(s: dict) -> str:
    from dllm_bench.results import fmt_rps  # lazily: results pulls in pandas

    def f(v, scale=1.0, d=2):
        return "n/a" if v is None else f"{v * scale:.{d}f}"
    flags = " INTERRUPTED" if s.get("interrupted") else " TIMED OUT" if s.get("timed_out") else ""
    return (f"{_display_label(s)} @ {fmt_rps(s['rps'])} rps ({s.get('dataset')}): "
            f"{s['completed']}/{s.get('num_prompts', '?')} done in {f(s['duration_s'], d=1)} s, "
            f"{f(s['output_throughput'])} tok/s, mean E2EL {f(s['mean_e2el_ms'], 1e-3)} s{flags}")


def comparisons(points: list[dict], baseline_labels: set[str]) -> list[dict]:
    """Per (dataset, rps): the ratio table rows (ratios vs the best baseline)."""
    from dllm_bench.metrics import ratio_table

    groups: dict[tuple, dict] = {}
    for s in points:
        groups.setdefault((s.get("dataset", ""), s["rps"]), {})[_display_label(s)] = s
    out = []
    for (ds, rps), sums in groups.items():
        bl = [k for k, s in sums.items() if s["system"] in baseline_labels]
        rt = ratio_table(sums, bl)
        rows = [] if rt.empty else [{"system": k, **{c: (None if isinstance(v, float) and math.isnan(v) else v)
                                                     for c, v in r.items()}} for k, r in rt.iterrows()]
        out.append({"dataset": ds, "rps": rps, "best_baseline": rt.attrs.get("best_baseline"),
                    "summaries": sums, "baselines": bl, "rows": rows})
    return out


# ---------------------------------------------------------------- the run
def serve(run: ServeRun, *, result_dir: Path | None, run_id: str | None, resume: bool,
          as_json: bool) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dllm_bench import results
    from dllm_bench.results import PointKey, fmt_rps
    from dllm_bench.serve.process import WorkerFailed, progress_handler, run_worker, worker_spec
    from dllm_bench.serve.summary import print_comparison, print_summary
    from dllm_bench.serve.workload import workload_shape
    from dllm_bench.units import format_size
    from workloads.serving import describe, describe_gen_mapping

    console = Console(stderr=True)
    if not console.is_terminal:  # logs / CI: don't squeeze the comparison table into 80 columns
        console = Console(stderr=True, width=180)
    p = run.preset
    shape = workload_shape(run)
    baseline_labels = {v.label for v in run.systems if v.is_baseline}
    keys = [(ds, rps, v) for ds in run.datasets for rps in run.rps if (ds, rps) in run.workloads
            for v in run.systems]
    config = {
        "preset": p.to_dict(), "preset_line": p.describe(), "model_dir": str(run.model_dir),
        "model": run.model_info, "systems": [v.to_dict() for v in run.systems],
        "datasets": run.datasets, "rps": run.rps, "arrivals": run.arrivals, "burstiness": run.burstiness,
        "seed": run.seed, "num_prompts": run.num_prompts, "duration": run.duration,
        "dataset_path": run.dataset_path, "time_scale": run.time_scale, "burstgpt_model": run.burstgpt_model,
        "memory_budget": run.memory_budget, "max_duration": run.max_duration, "num_warmups": run.num_warmups,
        "engine_defaults": run.engine_defaults, "baseline_defaults": run.baseline_defaults,
        "gen_mapping": describe_gen_mapping(p.block_length, p.gen_cap),
        "workloads": {f"{ds}@{fmt_rps(r)}": describe(wl) for (ds, r), wl in run.workloads.items()},
        "fingerprint": run.fingerprint(),
    }
    root = results.results_root(result_dir)
    if resume:
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
    fresh = not resume
    name = f"serve-{Path(str(p.model)).name}-{'+'.join(run.datasets)}"
    try:
        run_dir = results.create_run("serve", config, name=name, run_id=run_id, root=root, resume=resume)
    except FileExistsError as e:
        raise UserError(str(e)) from None
    if resume:  # record systems/rps added by this invocation next to the original ones
        cfg = results.load_config(run_dir)
        c = cfg["config"]
        c["systems"] = list({s["label"]: s for s in c.get("systems", []) + config["systems"]}.values())
        c["rps"] = sorted(set(c.get("rps", [])) | set(run.rps), key=float)
        c["datasets"] = list(dict.fromkeys(c.get("datasets", []) + run.datasets))
        results.atomic_write_json(run_dir / "config.json", cfg)

    console.print(f"[bold]dllm-bench serve[/bold] → {run_dir}", highlight=False)
    console.print(p.describe(), markup=False, highlight=False)
    console.print(f"model {run.model_dir}: vocab {run.model_info['vocab_size']}, d_model "
                  f"{run.model_info['d_model']}, {run.model_info['n_layers']} layers, head dim "
                  f"{run.model_info['head_dim']}; memory budget {format_size(run.memory_budget)}; "
                  f"{config['gen_mapping']}", markup=False, highlight=False)
    console.print(f"systems: {', '.join(v.label for v in run.systems)}; rps: "
                  f"{', '.join(fmt_rps(r) for r in run.rps)}; datasets: {', '.join(run.datasets)}; "
                  f"arrivals {run.arrivals}" + (f" (burstiness {run.burstiness:g})" if run.arrivals == "gamma" else "")
                  + f"; seed {run.seed}", markup=False, highlight=False)
    for (ds, r), wl in run.workloads.items():
        d = describe(wl)
        console.print(f"workload {ds} @ {fmt_rps(r)} rps: {d['num_requests']} requests over "
                      f"{d['duration_s']:.1f} s, prompt {d['prompt_len_min']}-{d['prompt_len_max']} tokens "
                      f"(mean {d['prompt_len_mean']:.0f}), gen_length {d['gen_length_min']}-"
                      f"{d['gen_length_max']} (mean {d['gen_length_mean']:.0f}), steps = gen_length",
                      markup=False, highlight=False)

    done_keys = results.finished_points(run_dir) if resume else set()
    failures: list[str] = []
    interrupted = False
    user_error: str | None = None
    progress = Progress(TextColumn("{task.description}"), TextColumn("[dim]{task.fields[status]}"),
                        BarColumn(), MofNCompleteColumn(), TextColumn("arrived {task.fields[arrived]}"),
                        TextColumn("{task.fields[tps]:.1f} tok/s"), TimeElapsedColumn(),
                        console=console, transient=False)
    with progress:
        for ds, rps, v in keys:
            key = PointKey(v.label, float(rps), ds)
            wl = run.workloads[(ds, rps)]
            if key in done_keys:
                progress.console.print(f"skip {v.label} @ {fmt_rps(rps)} rps ({ds}): finished earlier",
                                       markup=False, highlight=False)
                continue
            task = progress.add_task(f"{v.label} @ {fmt_rps(rps)} rps", total=len(wl), status="starting",
                                     arrived=0, tps=0.0)
            spec = worker_spec(run, v, wl, shape)
            log_path = run_dir / "logs" / f"{results.point_name(key)}.log"
            try:
                out = run_worker(spec, log_path, p.threads, progress_handler(progress, task))
            except KeyboardInterrupt as e:
                interrupted = True
                out = getattr(e, "partial", None)
                if out is not None:
                    s, recs, extra = point_summary(out, v, rps, run, wl)
                    results.write_point(run_dir, key, s, recs, extra)
                progress.update(task, status="interrupted")
                break
            except WorkerFailed as e:
                progress.update(task, status="failed")
                if e.kind == "user":
                    user_error = str(e)
                    break
                failures.append(f"{v.label} @ {fmt_rps(rps)} rps ({ds}): {e} (log: {log_path})")
                progress.console.print(f"error: {failures[-1]}", markup=False, highlight=False)
                continue
            s, recs, extra = point_summary(out, v, rps, run, wl)
            results.write_point(run_dir, key, s, recs, extra)
            progress.console.print(_point_line({**extra, **s, "system": v.label, "dataset": ds}),
                                   markup=False, highlight=False)

    wanted = {(v.label, float(r), ds) for ds, r, v in keys}
    points = [s for s in results.load_points(run_dir) if (s["system"], float(s["rps"]), s.get("dataset", "")) in wanted]
    if user_error is not None and fresh and not points:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing measured: leave no run behind
        raise UserError(user_error)

    order = {v.label: i for i, v in enumerate(run.systems)}
    points.sort(key=lambda s: (run.datasets.index(s["dataset"]) if s.get("dataset") in run.datasets else 0,
                               float(s["rps"]), order.get(s["system"], 99)))
    for s in points:
        print_summary(s, console, title=_display_label(s))
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
    if len(finite) >= 2 and not interrupted:
        from dllm_bench.plots import plot_all

        df = results.metrics_frame(run_dir)
        df = df[[(sy, float(r), d) in wanted for sy, r, d in zip(df["system"], df["rps"], df["dataset"], strict=True)]]
        jitter = 0.5 if 0.5 in finite else None
        plots = [str(x) for x in plot_all(df, run_dir / "plots", sorted(baseline_labels), jitter)]
        console.print(f"plots: {', '.join(plots)}", markup=False, highlight=False)
    console.print(p.describe(), markup=False, highlight=False)
    console.print(f"results: {run_dir}", markup=False, highlight=False)
    if interrupted:
        console.print("interrupted: finished points are kept; rerun with --resume to complete",
                      markup=False, highlight=False)
    if as_json:
        doc = {"run_id": run_dir.name, "run_dir": str(run_dir), "preset": p.to_dict(),
               "preset_line": p.describe(), "interrupted": interrupted, "failures": failures,
               "points": points, "plots": plots,
               "comparisons": [{k: v for k, v in c.items() if k != "summaries"} for c in comps]}
        sys.stdout.write(json.dumps(results._clean(doc), default=results._default, allow_nan=False) + "\n")
        sys.stdout.flush()
    if user_error is not None:
        raise UserError(user_error)
    if interrupted:
        return 130
    return 1 if failures else 0
