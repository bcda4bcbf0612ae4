"""THE benchmark-point loop of `dllm-bench serve`, `ablate` and `sweep`: every planned
(dataset label, rps, system) point in a fresh worker process (dllm_bench.serve.process.run_worker),
one after another, each written at once in the run directory (results.write_point).

One loop for the three commands keeps their points comparable: same workload builder, same
memory-budget profiling, same process isolation, same point summary. Ctrl-C keeps what finished
(and the interrupted point's partial result); with --trace-steps each point's steps.jsonl is
written before its summary (dllm_bench.serve.trace); a worker's user error (e.g. a budget too small
for a system) stops the run; an internal failure is recorded and the run goes on.
"""
from __future__ import annotations

import json
import math
import shutil
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from dllm_bench import console as cons
from dllm_bench import results
from dllm_bench.errors import UserError
from dllm_bench.metrics.serving import summarize
from dllm_bench.repeats import batch_text, repeat_seeds
from dllm_bench.results import PointKey, fmt_rps
from dllm_bench.serve import trace
from dllm_bench.serve.config import ServeRun
from dllm_bench.serve.endpoint import measure_endpoint
from dllm_bench.serve.process import WorkerFailed, progress_handler, run_worker, worker_spec
from dllm_bench.systems.build import WorkloadShape
from dllm_bench.systems.spec import SystemVariant
from engine.decoding import FIXED
from workloads.serving import ServingRequest


@dataclass
class PlannedPoint:
    dataset: str                   # the point's dataset label (a serve dataset, or a sweep label)
    rps: float
    variant: SystemVariant
    workload: list[ServingRequest]
    shape: WorkloadShape           # what a baseline's static batch is profiled for
    extra: dict = field(default_factory=dict)  # merged into the point's summary.json
    repeat: int = 0                # the i-th run of this point (dllm_bench.repeats)
    seed: int | None = None        # the workload seed of this repeat (run seed + repeat)

    @property
    def key(self) -> PointKey:
        return PointKey(self.variant.label, float(self.rps), self.dataset, self.repeat)

    @property
    def title(self) -> str:
        rep = f", repeat {self.repeat} (seed {self.seed})" if self.repeat else ""
        return f"{self.variant.label} @ {fmt_rps(self.rps)} rps ({self.dataset}{rep})"


@dataclass
class Outcome:
    """What a run of measure_points leaves: the summaries of its planned points (also those
    finished by an earlier, resumed run) and how it ended."""

    points: list[dict]
    failures: list[str]
    interrupted: bool
    user_error: str | None

    def give_up_if_empty(self, run_dir: Path, fresh: bool = True) -> None:
        """A user error before any point finished: remove the new run directory (nothing
        measured, leave no run behind) and raise it."""
        if self.user_error is not None and fresh and not self.points:
            shutil.rmtree(run_dir, ignore_errors=True)
            raise UserError(self.user_error)

    def finish(self, console: Console, run_dir: Path, doc: Mapping, as_json: bool, resumable: bool = False) -> int:
        """The last lines of a command (where the results are, whether it was interrupted), its
        --json document, and its exit code: raises the user error, else 130 after Ctrl-C, 1
        after a failed point."""
        console.print(f"results: {run_dir}", markup=False, highlight=False)
        if self.interrupted:
            console.print("interrupted: finished points are kept" + ("; rerun with --resume to complete"
                                                                    if resumable else ""),
                          markup=False, highlight=False)
        if as_json:
            results.print_json(doc)
        if self.user_error is not None:
            raise UserError(self.user_error)
        if self.interrupted:
            return 130
        return 1 if self.failures else 0


def display_label(summary: Mapping[str, Any]) -> str:
    """A point's system label, with a baseline's batch and scenario, for tables and lines."""
    label = summary["system"]
    if summary.get("is_baseline"):
        kind = summary.get("scenario_kind", "")
        kind = kind if kind in ("max-fit", "upstream") else "fixed"
        label += f" [B={batch_text(summary)} {kind}{' (all)' if summary.get('batch_capped') else ''}]"
    if summary.get("decoding_note"):      # asked for parallel decoding, has none upstream
        label += " · fixed (none upstream)"
    elif summary.get("decoding", FIXED) != FIXED:
        label += f" · {summary['decoding']}"
    if summary.get("interrupted"):
        label += " (interrupted)"
    return label


def point_summary(out: Mapping, pp: PlannedPoint, run: ServeRun) -> tuple[dict, list, dict]:
    """A worker's output -> (metrics summary, request records, extra fields of summary.json)."""
    res, info = out["result"], out["info"]
    summary = summarize(res, run.metric_options, run.max_concurrency)
    summary["rps"] = pp.rps
    dec = run.decoding_for(pp.variant)
    summary["decoding"] = str(dec.decoding)
    if dec.note:
        summary["decoding_note"] = dec.note
    extra = {
        # vLLM's --save-result keys where the meaning is the same (docs/SERVE.md)
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "model_id": info.get("model_id") or str(run.preset.model),
        "request_rate": "inf" if math.isinf(pp.rps) else pp.rps, "burstiness": run.burstiness,
        "max_concurrency": run.max_concurrency,
        "system_name": pp.variant.name, "is_baseline": pp.variant.is_baseline, "knobs": info.get("knobs"),
        "scenario": info.get("scenario"), "scenario_kind": info.get("scenario_kind", "engine"),
        "max_batch_size": info.get("max_batch_size"), "batch_capped": info.get("batch_capped", False),
        "kv_pool_tokens": info.get("kv_pool_tokens"),
        "fits_budget": info.get("fits_budget"), "peak_bytes": info.get("peak_bytes"),
        # An endpoint runs under its server's own memory, not this run's budget.
        "memory_budget": info.get("memory_budget", run.memory_budget), "torch_threads": info.get("torch_threads"),
        "build_seconds": info.get("build_seconds"), "profile_cached": info.get("profile_cached"),
        "preset": run.preset.name, "num_prompts": len(pp.workload), "peak_rss_bytes": info.get("peak_rss_bytes"),
        "stats": res.get("stats"), "workload_seed": pp.seed if pp.seed is not None else run.seed,
    }
    gauge = info.get("speed_gauge_s")
    if gauge:  # the machine's speed around the replay (CPU): its mean is a metrics.csv column
        extra.update(speed_gauge_s=sum(gauge) / len(gauge), speed_gauge_readings_s=list(gauge))
    if info.get("profile"):
        extra["profile"] = info["profile"]
    if info.get("engine_config"):  # the built engine's effective EngineConfig (after profiling)
        extra["engine_config"] = info["engine_config"]
    extra.update(pp.extra)
    recs = [{"status": "finished", **r} for r in res["records"]]
    recs += [{"status": "rejected", **r} for r in res.get("rejected", [])]
    recs += [{"status": "unfinished", "request_id": rid} for rid in res.get("unfinished_ids", [])]
    return summary, recs, extra


def point_line(s: Mapping[str, Any]) -> str:
    """One finished point as a progress-console line."""
    def f(v, scale=1.0, d=2):
        return "n/a" if v is None else f"{v * scale:.{d}f}"
    flags = " INTERRUPTED" if s.get("interrupted") else " TIMED OUT" if s.get("timed_out") else ""
    rep = f", repeat {s['repeat']}" if s.get("repeat") else ""
    return (f"{display_label(s)} @ {fmt_rps(s['rps'])} rps ({s.get('dataset')}{rep}): "
            f"{s.get('completed')}/{s.get('num_prompts', '?')} done in {f(s.get('duration_s'), d=1)} s, "
            f"{f(s.get('output_throughput'))} tok/s, mean E2EL {f(s.get('mean_e2el_ms'), 1e-3)} s{flags}")


def scenario_lines(points) -> list[str]:
    """Which scenario each baseline row is (its static batch), flagged when that batch exceeds the
    memory budget (measured on this machine; from the byte counts on a simulated GPU)."""
    scenarios = {s["system"]: s for s in points if s.get("is_baseline")}
    return [f"{label}: {s.get('scenario')}" + ("" if s.get("fits_budget") in (True, None) else
                                              " (exceeds the memory budget!)") for label, s in scenarios.items()]


def resume_id(kind: str, fingerprint: Mapping, root: Path, run_id: str | None) -> str:
    """The run of `kind` to resume (--run-id, default the latest), refused unless it was made
    with the same fingerprint (ServeRun.fingerprint: its points would not be comparable). The
    number of repeats is not part of it: resuming with more runs only the missing repeats."""
    if run_id is None:
        latest = results.latest_run(kind, root)
        if latest is None:
            raise UserError(f"--resume: no {kind} run under {root} (give --run-id)")
        run_id = latest.name
    cfg_path = root / run_id / "config.json"
    if not cfg_path.is_file():
        raise UserError(f"--resume: no run {run_id!r} under {root}")
    stored = results.read_json(cfg_path)
    if stored.get("kind") != kind:
        raise UserError(f"--resume: run {run_id} is a {stored.get('kind')} run, not {kind}")
    old, new = stored.get("config", {}).get("fingerprint", {}), json.loads(json.dumps(fingerprint, default=str))
    diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if diff:
        raise UserError(f"--resume: run {run_id} was made with different {', '.join(diff)}; "
                        "resume with the same options (or start a new run)")
    return run_id


def keep_run_budget(run: ServeRun, run_dir: Path) -> None:
    """An `auto` budget is the one measured when the run started, as its config.json records
    it: a resumed run sizes its remaining points for the same bytes as the finished ones, and
    with the same step budgets where they were scaled with it; a measured ridge is the run's too."""
    config = results.load_config(run_dir).get("config", {})
    preset = config.get("preset") or {}
    rules = [("ridge_rows", "ridge_rule", "measured")]
    if run.budget_is_auto:
        stored = config.get("memory_budget")
        if isinstance(stored, int) and stored > 0:
            run.memory_budget = stored
        rules += [("max_num_batched_tokens", "tokens_rule", "auto"), ("max_num_logits", "logits_rule", "auto")]
    keep = {k: preset[k] for k, rule, auto in rules if str(getattr(run.preset, rule)).startswith(auto) and k in preset}
    keep |= {rule: preset.get(rule, "") for k, rule, _ in rules if k in keep}
    if keep:
        run.preset = replace(run.preset, **keep)


def record_repeats(run_dir: Path, seed: int, repeats: int) -> None:
    """A resumed run's config.json: the largest number of repeats asked for so far."""
    cfg = results.load_config(run_dir)
    c = cfg["config"]
    c["repeats"] = max(int(c.get("repeats", 1)), repeats)
    c["repeat_seeds"] = repeat_seeds(seed, c["repeats"])
    results.atomic_write_json(run_dir / "config.json", cfg)


def record_tracing(run_dir: Path) -> None:
    """config.json says the run traces its steps (also when a resumed run starts to)."""
    cfg = results.load_config(run_dir)
    if not cfg["config"].get("trace_steps"):
        cfg["config"]["trace_steps"] = True
        results.atomic_write_json(run_dir / "config.json", cfg)


def measure_points(run: ServeRun, planned: Sequence[PlannedPoint], run_dir: Path, console: Console,
                   done: Collection[PointKey] = ()) -> Outcome:
    """Run every planned point (deduplicated by key; those in `done` are skipped: finished by
    the run being resumed) in a fresh worker, one after another, each written at once."""
    keep_run_budget(run, run_dir)
    if run.trace_steps:
        record_tracing(run_dir)
    seen: set[PointKey] = set()
    todo: list[PlannedPoint] = []
    for pp in planned:
        if pp.key not in seen:
            seen.add(pp.key)
            todo.append(pp)
    failures: list[str] = []
    interrupted = False
    user_error = None
    said: set[str] = set()                     # the attention line: once a run (process.progress_handler)
    with cons.progress("arrived {task.fields[arrived]}", "{task.fields[tps]:.1f} tok/s", con=console,
                       status=True, transient=False) as progress:
        for i, pp in enumerate(todo):
            if pp.key in done:
                progress.console.print(f"skip {pp.title}: finished earlier", markup=False, highlight=False)
                continue
            task = progress.add_task(f"[{i + 1}/{len(todo)}] {pp.title}", total=len(pp.workload),
                                     status="starting", arrived=0, tps=0.0)
            log_path = run_dir / "logs" / f"{results.point_name(pp.key)}.log"
            pdir = results.point_dir(run_dir, pp.key)
            trace.forget(pdir)
            part = trace.part_path(pdir) if run.trace_steps else None
            try:
                if pp.variant.is_endpoint:  # over HTTP from this process: there is nothing to build
                    out = measure_endpoint(run, pp.variant, pp.workload, progress_handler(progress, task))
                else:
                    out = run_worker(worker_spec(run, pp.variant, pp.workload, pp.shape, part), log_path,
                                     run.preset.threads, progress_handler(progress, task, said))
            except KeyboardInterrupt as e:
                interrupted = True
                out = getattr(e, "partial", None)
                if out is not None:
                    trace.publish(part)
                    results.write_point(run_dir, pp.key, *point_summary(out, pp, run))
                else:
                    trace.discard(part)
                progress.update(task, status="interrupted")
                break
            except WorkerFailed as e:
                trace.discard(part)
                progress.update(task, status="failed")
                if e.kind == "user":
                    user_error = str(e)
                    break
                failures.append(f"{pp.title}: {e} (log: {log_path})")
                progress.console.print(f"error: {failures[-1]}", markup=False, highlight=False)
                continue
            s, recs, extra = point_summary(out, pp, run)
            trace.publish(part)                 # before summary.json, the point's "done" marker
            results.write_point(run_dir, pp.key, s, recs, extra)
            progress.console.print(point_line({**extra, **s, "system": pp.variant.label, "dataset": pp.dataset,
                                               "repeat": pp.repeat}),
                                   markup=False, highlight=False)
    points = [s for s in results.load_points(run_dir) if PointKey.of(s) in seen]
    return Outcome(points, failures, interrupted, user_error)
