"""Measuring benchmark points through serve's machinery, shared by `dllm-bench ablate` and
`dllm-bench sweep`: the options resolved by serve's own checks (resolve_bench_run), then every
planned (dataset label, rps, system) point in a fresh serve worker (dllm_bench/serve/process.py),
each written at once in serve's layout (results.write_point, metrics.csv, summary.json).

Reusing serve's resolution and worker keeps an ablate/sweep point comparable with a serve point:
same workload builder, same memory-budget profiling, same process isolation.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class PlannedPoint:
    dataset: str                   # the point's dataset label (a serve dataset, or a sweep label)
    rps: float
    variant: Any                   # dllm_bench.systems.spec.SystemVariant
    workload: list                 # [workloads.serving.ServingRequest]
    shape: Any                     # dllm_bench.systems.build.WorkloadShape
    extra: dict = field(default_factory=dict)  # merged into the point's summary.json

    @property
    def key(self):
        from dllm_bench.results import PointKey

        return PointKey(self.variant.label, float(self.rps), self.dataset)


def shape_of(workload: Sequence, block_length: int):
    """The worst request of one workload (what a baseline's static batch is profiled for)."""
    from dllm_bench.systems.build import WorkloadShape

    return WorkloadShape(max_prompt_len=max(r.prompt_len for r in workload),
                         max_gen_length=max(r.gen_length for r in workload), block_length=block_length, steps=None)


def point_line(s: Mapping[str, Any]) -> str:
    """One finished point as a progress-console line (throughput = ablation.THROUGHPUT's metric)."""
    def f(v, d=2):
        return "n/a" if v is None else f"{v:.{d}f}"
    flags = " INTERRUPTED" if s.get("interrupted") else " TIMED OUT" if s.get("timed_out") else ""
    batch = f" [B={s['max_batch_size']}]" if s.get("is_baseline") and s.get("max_batch_size") else ""
    return (f"{s['system']}{batch} ({s.get('dataset')}): {s.get('completed')}/{s.get('num_prompts', '?')} done in "
            f"{f(s.get('duration_s'), 1)} s, {f(s.get('output_throughput'))} tok/s{flags}")


def measure_points(run, planned: Sequence[PlannedPoint], run_dir: Path, console,
                   on_point: Callable[[dict], None] | None = None) -> dict:
    """Run every planned point (deduplicated by key) in a fresh serve worker, one after another,
    each written at once with results.write_point (serve's layout and point summary).

    Returns {"points": [summaries of this run's planned points], "failures": [...],
    "interrupted": bool, "user_error": str | None}. A worker's user error (e.g. a budget too
    small for a rung) stops the run; an internal failure is recorded and the run goes on."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dllm_bench import results
    from dllm_bench.serve.process import WorkerFailed, progress_handler, run_worker, worker_spec
    from dllm_bench.serve.run import point_summary

    seen: set = set()
    todo = []
    for pp in planned:
        if pp.key not in seen:
            seen.add(pp.key)
            todo.append(pp)
    failures: list[str] = []
    interrupted = False
    user_error = None
    threads = run.preset.threads
    progress = Progress(TextColumn("{task.description}"), TextColumn("[dim]{task.fields[status]}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=False)
    with progress:
        for i, pp in enumerate(todo):
            v = pp.variant
            task = progress.add_task(f"[{i + 1}/{len(todo)}] {pp.dataset}: {v.label}", total=len(pp.workload),
                                     status="starting")

            spec = worker_spec(run, v, pp.workload, pp.shape)
            log_path = run_dir / "logs" / f"{results.point_name(pp.key)}.log"
            try:
                out = run_worker(spec, log_path, threads, progress_handler(progress, task))
            except KeyboardInterrupt as e:
                interrupted = True
                out = getattr(e, "partial", None)
                if out is not None:
                    s, recs, extra = point_summary(out, v, pp.rps, run, pp.workload)
                    results.write_point(run_dir, pp.key, s, recs, {**extra, **_config_extra(out), **pp.extra})
                progress.update(task, status="interrupted")
                break
            except WorkerFailed as e:
                progress.update(task, status="failed")
                if e.kind == "user":
                    user_error = f"{v.label} ({pp.dataset}): {e}"
                    break
                failures.append(f"{v.label} ({pp.dataset}): {e} (log: {log_path})")
                progress.console.print(f"error: {failures[-1]}", markup=False, highlight=False)
                continue
            s, recs, extra = point_summary(out, v, pp.rps, run, pp.workload)
            full = {**extra, **_config_extra(out), **pp.extra}
            results.write_point(run_dir, pp.key, s, recs, full)
            line = point_line({**full, **s, "system": v.label, "dataset": pp.dataset})
            progress.console.print(line, markup=False, highlight=False)
            if on_point:
                on_point({**full, **s})
    wanted = {(k.system, float(k.rps), k.dataset) for k in seen}
    points = [s for s in results.load_points(run_dir)
              if (s["system"], float(s["rps"]), s.get("dataset", "")) in wanted]
    return {"points": points, "failures": failures, "interrupted": interrupted, "user_error": user_error}


def _config_extra(out: Mapping) -> dict:
    """The built engine's effective EngineConfig (after profiling) for the point summary."""
    cfg = (out.get("info") or {}).get("engine_config")
    return {"engine_config": cfg} if cfg else {}


def resolve_bench_run(*, systems: str, dataset: str, rps: str = "inf", num_prompts: int | None = None,
                      model: str | None = None, preset: str | None = None, memory_budget: str | None = None,
                      seed: int = 0, threads: int | None = None, max_num_batched_tokens: int | None = None,
                      max_num_logits: str | None = None, num_warmups: int = 1, max_duration: float | None = None,
                      no_profile_cache: bool = False):
    """A ServeRun through serve's own option checks and workload building (rps default inf =
    every request at t=0: saturation throughput)."""
    from dllm_bench.commands.serve import resolve_run

    return resolve_run(
        rps=rps, systems=systems, dataset=dataset, dataset_path=None, num_prompts=num_prompts, duration=None,
        burstiness=1.0, arrivals=None, time_scale=1.0, burstgpt_model=None, memory_budget=memory_budget,
        model=model, preset=preset, max_num_batched_tokens=max_num_batched_tokens, max_num_logits=max_num_logits,
        max_num_seqs=None, retention=None, length_scale=None, gen_cap=None, block_length=None,
        max_prompt_len=None, threads=threads, dtype=None, device=None, seed=seed, max_duration=max_duration,
        num_warmups=num_warmups, no_profile_cache=no_profile_cache)
