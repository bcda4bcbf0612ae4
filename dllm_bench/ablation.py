"""`dllm-bench ablate` (paper §6.6, Fig. 8): the engine's components switched on one at a time
over the same arrival sequence and memory budget, plus the full engine under each cache policy.

The ladder (each rung = the previous one with ONE component switched; docs/ABLATE.md):

  0 baseline    `sparse-dllm`: Sparse-dLLM, a request-level static batch (the paper's baseline)
  1 +engine     `engine:scheduler=request,max_num_logits=none,cache=sparse,selection=head`:
                continuous batching over packed varlen batches, head-centric dense KV cache, but
                a request-level scheduler (every step charged the whole canvas) and monolithic
                full-sequence logits
  2 +scheduler  `scheduler=phase`: the phase-multiplexed scheduler (Reuse steps cost their block)
  3 +logits     `max_num_logits=<L>`: logit-aware activation budgeting. The profiler gives the
                memory it frees to the KV pool, so the pool grows as a consequence; the configs
                still differ only in max_num_logits.

Cache-policy rows (the full engine, rung 3, with only cache/selection switched): `cache=none`
(exact LLaDA: every step recomputes the canvas), `cache=dual` (Fast-dLLM's dual cache),
`cache=sparse,selection=head` (= rung 3, measured once) and `cache=sparse,selection=uniform`.

Points run through the serve machinery (dllm_bench/serve_run.py, serve_process.py): one fresh
`dllm_bench.serve_worker` process per (dataset, system), each replaying exactly the same
workload under exactly the same memory budget; results in the serve layout (results.write_point,
metrics.csv, summary.json) under a run of kind "ablate". `measure_points` is shared with
`dllm-bench sweep`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dllm_bench.errors import UserError

DATASETS = ("livebench", "osc", "burstgpt")
THROUGHPUT = "output_throughput"   # tok/s: the paper's Fig. 8 "relative throughput"
# Knob order of every engine rung, so equal configurations get equal labels (one point).
KNOB_ORDER = ("scheduler", "max_num_logits", "cache", "selection")

# The ladder's engine token/logit budgets per serve preset. Rungs 1-2 materialize monolithic
# [query tokens x vocab] logits; at cpu-default's serve token budget (1024) that alone is
# ~0.5 GB of float32 at LLaDA's vocabulary and the monolithic profile does not fit the 1 GiB
# budget (1.5 GB activation peak), so the ladder runs every engine rung at a token budget the
# monolithic rungs can hold (384: ~0.6 GB peak) with the preset's logits:tokens ratio (1:4).
# Presets not listed use their serve values. `--max-num-batched-tokens/--max-num-logits` override.
ABLATION_ENGINE = {
    "cpu-default": {"max_num_batched_tokens": 384, "max_num_logits": 96},
}
# Fewer prompts than `serve` (16) on the CPU preset: 3 datasets x up to 7 systems must fit in
# about ten minutes on 2 cores. Presets not listed use their serve num_prompts.
ABLATION_PROMPTS = {"cpu-default": 8}


@dataclass(frozen=True)
class Rung:
    key: str                       # baseline | engine | scheduler | logits | cache-none | ...
    title: str                     # row name in tables and figures
    spec: str                      # --systems spec text (dllm_bench.systems grammar)
    switched: tuple[str, ...]      # EngineConfig fields switched vs the rung it is compared with
    group: str = "ladder"          # ladder | cache
    note: str = ""

    def to_dict(self) -> dict:
        return {"key": self.key, "title": self.title, "spec": self.spec, "switched": list(self.switched),
                "group": self.group, "note": self.note}


def _engine_spec(**knobs: Any) -> str:
    def fmt(v: Any) -> str:
        return "none" if v is None else str(v)
    order = [k for k in KNOB_ORDER if k in knobs] + [k for k in knobs if k not in KNOB_ORDER]
    return "engine:" + ",".join(f"{k}={fmt(knobs[k])}" for k in order)


def ladder(max_num_logits: int) -> list[Rung]:
    """The paper's Fig. 8 ladder: baseline, then one component switched on per rung."""
    if max_num_logits is None or max_num_logits < 1:
        raise UserError("the logit-budget rung needs a logit budget (--max-num-logits N, not none)")
    base = dict(scheduler="request", max_num_logits=None, cache="sparse", selection="head")
    return [
        Rung("baseline", "Sparse-dLLM (baseline)", "sparse-dllm", (),
             note="request-level static batch, uniform sparse cache (retention = the engine's)"),
        Rung("engine", "+ inference engine", _engine_spec(**base), (),
             note="continuous batching over packed varlen batches, head-centric dense KV, "
                  "request-level scheduling, monolithic logits"),
        Rung("scheduler", "+ phase-multiplexed scheduler", _engine_spec(**{**base, "scheduler": "phase"}),
             ("scheduler",), note="Reuse steps are charged their block, Refresh steps their canvas"),
        Rung("logits", "+ logit-aware budgeting",
             _engine_spec(**{**base, "scheduler": "phase", "max_num_logits": max_num_logits}),
             ("max_num_logits",), note=f"at most {max_num_logits} logit rows per step; the freed "
                                        "activation memory goes to the KV pool"),
    ]


def cache_rows(max_num_logits: int) -> list[Rung]:
    """The full engine (rung 3) under each cache policy; only cache/selection differ."""
    full = dict(scheduler="phase", max_num_logits=max_num_logits)
    return [
        Rung("cache-none", "cache=none (exact LLaDA)", _engine_spec(**full, cache="none", selection="head"),
             ("cache",), "cache", "no KV cache: every step runs the whole canvas"),
        Rung("cache-dual", "cache=dual (Fast-dLLM)", _engine_spec(**full, cache="dual", selection="head"),
             ("cache",), "cache", "prefix+suffix KV stored at each block's Refresh, reused dense"),
        Rung("cache-sparse-head", "cache=sparse, head (dLLM-Serve)",
             _engine_spec(**full, cache="sparse", selection="head"), (), "cache",
             "the full engine (= the logit-budget rung)"),
        Rung("cache-sparse-uniform", "cache=sparse, uniform (Sparse-dLLM selection)",
             _engine_spec(**full, cache="sparse", selection="uniform"), ("selection",), "cache",
             "one token set for all heads of a layer"),
    ]


CACHE_ROW_CHOICES = ("all", "first", "none")


def parse_cache_rows(text: str) -> str:
    t = str(text).strip().lower()
    if t not in CACHE_ROW_CHOICES:
        raise UserError(f"--cache-rows must be one of {', '.join(CACHE_ROW_CHOICES)}, got {text!r}")
    return t


def parse_dataset_list(text: str | None, allowed: Sequence[str] = DATASETS) -> list[str]:
    out = [t.strip() for t in str(text or ",".join(allowed)).split(",") if t.strip()]
    if not out:
        raise UserError("--datasets is empty")
    for d in out:
        if d not in allowed:
            raise UserError(f"unknown dataset {d!r}; choose from {', '.join(allowed)}")
    if len(set(out)) != len(out):
        raise UserError("--datasets lists a dataset twice")
    return out


# ---------------------------------------------------------------- effective configurations
def effective_engine_config(variant, engine_defaults: Mapping[str, Any], *, model_dir: str = "",
                            dtype: str = "float32", device: str = "cpu", memory_budget: int | None = None,
                            max_model_len: int | None = None):
    """The EngineConfig the worker builds for an engine variant (dllm_bench.systems' rule:
    run-wide defaults, then the variant's knobs; serving is greedy, sampling=False), before the
    profiler sets kv_pool_tokens."""
    from dllm_bench.systems import engine_knobs
    from engine.config import EngineConfig

    return EngineConfig(model=str(model_dir), dtype=dtype, device=device, sampling=False,
                        memory_budget=memory_budget, max_model_len=max_model_len,
                        **engine_knobs(variant, engine_defaults))


def effective_configs(rungs: Sequence[Rung], engine_defaults: Mapping[str, Any],
                      baseline_defaults: Mapping[str, Mapping[str, Any]] | None = None, **kw) -> list[dict]:
    """Per rung: {"system": ..., "config": dict}. Engine rungs: EngineConfig.to_dict();
    baselines: the policy knobs they are built with (dllm_bench.systems.baseline_knobs)."""
    from dllm_bench.systems import baseline_knobs, parse_system

    out = []
    for r in rungs:
        v = parse_system(r.spec)
        if v.is_baseline:
            out.append({"system": v.name, "config": baseline_knobs(v, baseline_defaults or {})})
        else:
            out.append({"system": "engine", "config": effective_engine_config(v, engine_defaults, **kw).to_dict()})
    return out


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any], ignore: Iterable[str] = ()) -> set[str]:
    """Fields whose values differ between two config dicts (missing = None)."""
    ign = set(ignore)
    return {k for k in set(a) | set(b) if k not in ign and a.get(k) != b.get(k)}


# Set by the profiler from the budget, not by the rung: differs as a consequence of the switch.
CONSEQUENTIAL = ("kv_pool_tokens",)


def check_ladder_configs(configs: Sequence[Mapping[str, Any] | None], rungs: Sequence[Rung],
                         reference: Mapping[str, Any] | None = None) -> list[str]:
    """Problems (empty = fine): each engine rung must differ from the rung before it (ladder) or
    from `reference` (cache rows: the full engine) in exactly its `switched` fields, ignoring
    CONSEQUENTIAL ones. `configs[i]` is rung i's EngineConfig dict (None: baseline/not run)."""
    problems = []
    prev = None
    for cfg, r in zip(configs, rungs, strict=True):
        other = reference if r.group == "cache" else prev
        if cfg is not None and other is not None:
            d = config_diff(other, cfg, CONSEQUENTIAL)
            if d != set(r.switched):
                problems.append(f"{r.title}: differs in {sorted(d) or 'nothing'}, expected {sorted(r.switched) or 'nothing'}")
        if r.group == "ladder":
            prev = cfg
    return problems


# ---------------------------------------------------------------- measuring points (serve's machinery)
@dataclass
class PlannedPoint:
    dataset: str                   # the point's dataset label (a serve dataset, or a sweep label)
    rps: float
    variant: Any                   # dllm_bench.systems.SystemVariant
    workload: list                 # [workloads.serving.ServingRequest]
    shape: Any                     # dllm_bench.system_build.WorkloadShape
    extra: dict = field(default_factory=dict)  # merged into the point's summary.json

    @property
    def key(self):
        from dllm_bench.results import PointKey

        return PointKey(self.variant.label, float(self.rps), self.dataset)


def shape_of(workload: Sequence, block_length: int):
    """The worst request of one workload (what a baseline's static batch is profiled for)."""
    from dllm_bench.system_build import WorkloadShape

    return WorkloadShape(max_prompt_len=max(r.prompt_len for r in workload),
                         max_gen_length=max(r.gen_length for r in workload), block_length=block_length, steps=None)


def _fmt_rps(rps: float) -> str:
    return "inf" if math.isinf(rps) else format(rps, "g")


def point_line(s: Mapping[str, Any]) -> str:
    def f(v, d=2):
        return "n/a" if v is None else f"{v:.{d}f}"
    flags = " INTERRUPTED" if s.get("interrupted") else " TIMED OUT" if s.get("timed_out") else ""
    batch = f" [B={s['max_batch_size']}]" if s.get("is_baseline") and s.get("max_batch_size") else ""
    return (f"{s['system']}{batch} ({s.get('dataset')}): {s.get('completed')}/{s.get('num_prompts', '?')} done in "
            f"{f(s.get('duration_s'), 1)} s, {f(s.get(THROUGHPUT))} tok/s{flags}")


def measure_points(run, planned: Sequence[PlannedPoint], run_dir: Path, console,
                   on_point: Callable[[dict], None] | None = None) -> dict:
    """Run every planned point (deduplicated by key) in a fresh serve worker, one after another,
    each written at once with results.write_point (serve's layout and point summary).

    Returns {"points": [summaries of this run's planned points], "failures": [...],
    "interrupted": bool, "user_error": str | None}. A worker's user error (e.g. a budget too
    small for a rung) stops the run; an internal failure is recorded and the run goes on."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dllm_bench import results
    from dllm_bench.serve_process import WorkerFailed, run_worker, worker_spec
    from dllm_bench.serve_run import point_summary

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

            def on_event(ev: dict, task=task) -> None:
                e = ev.get("event")
                if e == "status":
                    progress.update(task, status=ev.get("message", ""))
                elif e == "built":
                    info = ev.get("info", {})
                    b = info.get("max_batch_size")
                    progress.update(task, status=f"B={b}" if b else f"KV pool {info.get('kv_pool_tokens')} tok")
                elif e == "progress":
                    progress.update(task, completed=ev.get("finished", 0))
                elif e == "done":
                    progress.update(task, status="done")

            spec = worker_spec(run, v, pp.workload, pp.shape)
            log_path = run_dir / "logs" / f"{results.point_name(pp.key)}.log"
            try:
                out = run_worker(spec, log_path, threads, on_event)
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


# ---------------------------------------------------------------- tables
def _index(points: Iterable[Mapping]) -> dict[tuple[str, str], Mapping]:
    return {(p.get("dataset", ""), p["system"]): p for p in points}


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def ladder_table(points: Iterable[Mapping], rungs: Sequence[Rung | Mapping], datasets: Sequence[str]):
    """One row per (dataset, rung): throughput, x vs the baseline rung, delta vs the rung before."""
    import pandas as pd

    idx = _index(points)
    rows = []
    for ds in datasets:
        base = prev = None
        for i, r in enumerate(rungs):
            r = r if isinstance(r, Mapping) else r.to_dict()
            label = _rung_label(r)
            p = idx.get((ds, label))
            tp = _num(p.get(THROUGHPUT)) if p else None
            if i == 0:
                base = tp
            x = tp / base if tp is not None and base else None
            row = {"dataset": ds, "rung": r["title"], "system": label,
                   "throughput_tok_s": tp, "x_vs_baseline": x,
                   "delta_x_vs_prev": (x - prev) if x is not None and prev is not None else None,
                   "pct_vs_prev": (100 * (x / prev - 1)) if x is not None and prev else None,
                   "kv_pool_tokens": p.get("kv_pool_tokens") if p else None,
                   "max_batch_size": p.get("max_batch_size") if p and p.get("is_baseline") else None,
                   "completed": p.get("completed") if p else None}
            rows.append(row)
            prev = x
    return pd.DataFrame(rows)


def cache_table(points: Iterable[Mapping], rows_: Sequence[Rung | Mapping], baseline: Rung | Mapping,
                datasets: Sequence[str]):
    """One row per (dataset, cache policy) that was measured: throughput, x vs the baseline and
    vs the full engine (sparse head), and the work per output token (FLOP proxies)."""
    import pandas as pd

    idx = _index(points)
    base_label = _rung_label(baseline)
    out = []
    for ds in datasets:
        base = idx.get((ds, base_label))
        btp = _num(base.get(THROUGHPUT)) if base else None
        rs = [r if isinstance(r, Mapping) else r.to_dict() for r in rows_]
        if not any(idx.get((ds, _rung_label(r))) for r in rs if r["key"] != "cache-sparse-head"):
            continue  # only the full engine (a ladder rung) ran here: no cache-policy rows
        full = next((idx.get((ds, _rung_label(r))) for r in rs if r["key"] == "cache-sparse-head"), None)
        ftp = _num(full.get(THROUGHPUT)) if full else None
        for r in rs:
            p = idx.get((ds, _rung_label(r)))
            if p is None:
                continue
            tp = _num(p.get(THROUGHPUT))
            st = p.get("stats") or {}
            out_tok = p.get("total_output_tokens") or 0
            qt = p.get("query_tokens", st.get("query_tokens"))

            def per_tok(v, n=out_tok):
                v = _num(v)
                return v / n if v is not None and n else None
            out.append({"dataset": ds, "cache policy": r["title"], "system": _rung_label(r),
                        "throughput_tok_s": tp,
                        "x_vs_baseline": tp / btp if tp is not None and btp else None,
                        "x_vs_full_engine": tp / ftp if tp is not None and ftp else None,
                        "query_tokens_per_out_tok": per_tok(qt),
                        "refresh_steps_per_out_tok": per_tok(st.get("refresh_request_steps")),
                        "reuse_steps_per_out_tok": per_tok(st.get("reuse_request_steps")),
                        "kv_pool_tokens": p.get("kv_pool_tokens")})
    return pd.DataFrame(out)


def _rung_label(r: Rung | Mapping) -> str:
    """The system label of a rung (stored in an ablate run's config.json; else parsed)."""
    from dllm_bench.systems import parse_system

    d = r if isinstance(r, Mapping) else r.to_dict()
    return d.get("label") or parse_system(d["spec"]).label


def fmt_table(df, floats: Mapping[str, str] | None = None) -> Any:
    """A copy with numbers formatted for a terminal/Markdown table (None -> '-')."""
    floats = dict(floats or {})
    out = df.copy()
    for c in out.columns:
        fmt = floats.get(c)
        if fmt is None:
            out[c] = out[c].map(lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
        else:
            out[c] = out[c].map(lambda v, fmt=fmt: "-" if _num(v) is None else fmt.format(float(v)))
    return out


LADDER_FMT = {"throughput_tok_s": "{:.2f}", "x_vs_baseline": "{:.2f}x", "delta_x_vs_prev": "{:+.2f}x",
              "pct_vs_prev": "{:+.1f}%", "kv_pool_tokens": "{:.0f}", "max_batch_size": "{:.0f}", "completed": "{:.0f}"}
CACHE_FMT = {"throughput_tok_s": "{:.2f}", "x_vs_baseline": "{:.2f}x", "x_vs_full_engine": "{:.2f}x",
             "query_tokens_per_out_tok": "{:.1f}", "refresh_steps_per_out_tok": "{:.3f}",
             "reuse_steps_per_out_tok": "{:.3f}", "kv_pool_tokens": "{:.0f}"}


# ---------------------------------------------------------------- figures
def plot_ablation(ladder_df, path: Path, title: str = "Ablation: relative throughput (vs Sparse-dLLM)") -> Path:
    """Paper Fig. 8: per dataset, one bar per rung (throughput / baseline's), value labels."""
    return _grouped_bars(ladder_df, "rung", "x_vs_baseline", path, title, "Relative throughput (x Sparse-dLLM)")


def plot_cache_policies(cache_df, path: Path,
                        title: str = "Full engine under each cache policy (same scheduler and budget)") -> Path:
    return _grouped_bars(cache_df, "cache policy", "x_vs_baseline", path, title, "Relative throughput (x Sparse-dLLM)")


def _grouped_bars(df, series_col: str, value_col: str, path: Path, title: str, ylabel: str) -> Path:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dllm_bench.results import atomic_write_bytes

    datasets = list(dict.fromkeys(df["dataset"])) or [""]
    series = list(dict.fromkeys(df[series_col]))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(6.5, 2.2 * len(datasets) + 0.3 * len(series)), 4.2))
    cmap = plt.get_cmap("tab10")
    top = 1.0
    for j, s in enumerate(series):
        ys = []
        for ds in datasets:
            v = df[(df["dataset"] == ds) & (df[series_col] == s)][value_col]
            y = _num(v.iloc[0]) if len(v) else None
            ys.append(float("nan") if y is None else y)
            top = max(top, y or 0)
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(datasets))]
        rects = ax.bar(xs, ys, width, label=s, color=cmap(j % 10))
        ax.bar_label(rects, fmt="%.2f×", fontsize=7, padding=2, rotation=90 if len(series) > 4 else 0)
    ax.axhline(1.0, color="red", linestyle="--", linewidth=1.0)
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, top * 1.3)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)


# ---------------------------------------------------------------- a finished run, as tables
def run_tables(run_dir: Path) -> dict:
    """Ladder and cache tables of an ablate run dir (what `report` renders)."""
    from dllm_bench import results

    cfg = results.load_config(run_dir)["config"]
    pts = results.load_points(run_dir)
    datasets = cfg.get("datasets") or list(dict.fromkeys(p.get("dataset", "") for p in pts))
    rungs = cfg.get("ladder") or []
    crows = cfg.get("cache_rows") or []
    lt = ladder_table(pts, rungs, datasets) if rungs else None
    ct = cache_table(pts, crows, rungs[0], datasets) if crows and rungs else None
    return {"config": cfg, "points": pts, "ladder": lt, "cache": ct, "datasets": datasets}


# ---------------------------------------------------------------- the run (serve's resolution)
def ablation_settings(preset_name: str, serve_num_prompts: int, max_num_batched_tokens: int | None = None,
                      max_num_logits: str | None = None, num_prompts: int | None = None) -> dict:
    """The ladder's token budget, logit budget (CLI text: 'none' allowed) and prompts per
    dataset: the flags when given, else ABLATION_ENGINE / ABLATION_PROMPTS for the preset, else
    None (= the serve preset's value)."""
    d = ABLATION_ENGINE.get(preset_name, {})
    return {"max_num_batched_tokens": max_num_batched_tokens if max_num_batched_tokens is not None
            else d.get("max_num_batched_tokens"),
            "max_num_logits": max_num_logits if max_num_logits is not None
            else (str(d["max_num_logits"]) if "max_num_logits" in d else None),
            "num_prompts": num_prompts if num_prompts is not None else ABLATION_PROMPTS.get(preset_name, serve_num_prompts)}


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


def console():
    from rich.console import Console

    c = Console(stderr=True)
    return c if c.is_terminal else Console(stderr=True, width=180)


TERMINAL_NAMES = {"throughput_tok_s": "tok/s", "x_vs_baseline": "x baseline", "delta_x_vs_prev": "Δx prev",
                  "pct_vs_prev": "Δ% prev", "kv_pool_tokens": "KV pool tok", "max_batch_size": "B",
                  "x_vs_full_engine": "x full engine", "query_tokens_per_out_tok": "query tok/out tok",
                  "refresh_steps_per_out_tok": "refresh/out tok", "reuse_steps_per_out_tok": "reuse/out tok"}


def print_df(con, df, title: str, floats: Mapping[str, str] | None = None, drop: Sequence[str] = ("system",)) -> None:
    """A DataFrame as a Rich table on the console (long system labels dropped: they are
    printed once at the start of the run)."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    f = fmt_table(df.drop(columns=[c for c in drop if c in df.columns]), floats)
    f = f.rename(columns=TERMINAL_NAMES)
    for c in f.columns:
        t.add_column(str(c), justify="left" if f[c].dtype == object and c in ("dataset", "rung", "system",
                                                                                "cache policy") else "right")
    for _, row in f.iterrows():
        t.add_row(*[str(v) for v in row.tolist()])
    con.print(t)
