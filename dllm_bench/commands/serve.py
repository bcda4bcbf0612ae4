"""`dllm-bench serve`: open-loop serving benchmark of the engine against the baselines, like
`vllm bench serve` (docs/SERVE.md).

The workload is built once per (dataset, rps) from the seed; every system then replays exactly
that arrival sequence against exactly the same memory budget, one system after another in wall
clock time, each in a fresh process pinned to the same torch thread count
(dllm_bench/serve_worker.py). Each finished point is persisted at once (results.write_point),
so Ctrl-C keeps what finished and `--resume` skips it. Rich progress, summaries and tables go to
stderr; `--json` prints one JSON document on stdout.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import typer

from dllm_bench.errors import UserError

DATASET_CHOICES = ("livebench", "osc", "burstgpt", "random")
ARRIVALS = ("poisson", "gamma", "trace")
INTERRUPT_GRACE_S = 30.0  # after Ctrl-C, how long a worker may take to write its partial result


# ---------------------------------------------------------------- option parsing
def parse_rps_list(text: str) -> list[float]:
    """`0.5`, `0.1,0.25,0.5,1.0`, `inf` -> floats > 0 (inf = all requests at t=0)."""
    out: list[float] = []
    for tok in (t.strip() for t in str(text).split(",")):
        if not tok:
            continue
        try:
            v = float(tok)
        except ValueError:
            raise UserError(f"--rps: expected numbers > 0 or 'inf' (comma separated), got {tok!r}") from None
        if math.isnan(v) or v <= 0:
            raise UserError(f"--rps must be > 0 (or inf for all requests at t=0), got {tok}")
        if v in out:
            raise UserError(f"--rps lists {tok} twice")
        out.append(v)
    if not out:
        raise UserError("--rps is empty")
    return out


def parse_datasets(text: str) -> list[str]:
    out = [t.strip() for t in str(text).split(",") if t.strip()]
    if not out:
        raise UserError("--dataset is empty")
    for d in out:
        if d not in DATASET_CHOICES + ("custom",):
            raise UserError(f"unknown dataset {d!r}; choose from {', '.join(DATASET_CHOICES)} "
                            "(or a file with --dataset-path)")
    if len(set(out)) != len(out):
        raise UserError("--dataset lists a dataset twice")
    return out


def parse_optional_int(text: str | None, what: str) -> int | None:
    """For knobs where 'none' means unbounded (e.g. --max-num-logits none = monolithic)."""
    if text is None:
        return None
    if str(text).strip().lower() in ("none", "null"):
        return None
    try:
        v = int(str(text))
    except ValueError:
        raise UserError(f"{what}: expected a positive integer or 'none', got {text!r}") from None
    if v < 1:
        raise UserError(f"{what} must be >= 1 (or 'none'), got {v}")
    return v


def _fmt_rps(rps: float) -> str:
    return "inf" if math.isinf(rps) else format(rps, "g")


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


def _model_info(model_dir: Path, dtype: str) -> dict:
    from engine.models.llada import LLaDAConfig

    try:
        cfg = LLaDAConfig.from_pretrained(model_dir)
    except (OSError, ValueError) as e:
        raise UserError(f"model {model_dir}: {e}") from None
    d, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    per_block = 2 * d + 2 * d * d + 2 * d * kv + 3 * d * cfg.mlp_hidden_size
    n_params = 2 * cfg.padded_vocab * d + cfg.n_layers * per_block + d
    size = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    return {"vocab_size": cfg.vocab_size, "padded_vocab": cfg.padded_vocab, "d_model": d,
            "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.kv_heads,
            "head_dim": cfg.head_dim, "mlp_hidden_size": cfg.mlp_hidden_size,
            "max_sequence_length": cfg.max_sequence_length, "n_params": n_params,
            "weights_bytes": n_params * size,
            "special_ids": sorted({i for i in (cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id,
                                               cfg.bos_token_id) if i is not None})}


def _special_ids(model_info: dict) -> list[int]:
    from dllm_bench.tokenizer_build import special_token_ids

    ids = set(model_info["special_ids"])
    ids |= {i for i in special_token_ids(model_info["vocab_size"]).values() if i < model_info["vocab_size"]}
    return sorted(ids)


def _tokenizer(model_dir: Path):
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def build_workloads(run: ServeRun) -> None:
    """The seeded workload of every (dataset, rps) point; ValueError -> UserError."""
    from workloads.serving import build_workload

    p = run.preset
    tokenize = None
    if run.dataset_path and not str(run.dataset_path).lower().endswith(".csv"):
        tokenize = _tokenizer(run.model_dir)
    special = _special_ids(run.model_info)
    rps_list = [math.inf] if run.arrivals == "trace" else run.rps
    if run.arrivals == "trace":
        run.rps = []  # filled with each trace's offered rate below
    for ds in run.datasets:
        for rps in rps_list:
            try:
                wl = build_workload(
                    ds, num_prompts=run.num_prompts, duration=run.duration, rps=rps,
                    burstiness=run.burstiness, arrivals=run.arrivals, seed=run.seed,
                    vocab_size=run.model_info["vocab_size"], special_ids=special,
                    length_scale=p.length_scale, block_length=p.block_length, gen_cap=p.gen_cap,
                    max_prompt_len=p.max_prompt_len, dataset_path=run.dataset_path,
                    time_scale=run.time_scale, model_filter=run.burstgpt_model, tokenize=tokenize)
            except ValueError as e:
                raise UserError(str(e)) from None
            if not wl:
                raise UserError(f"the {ds} workload has no requests (raise --duration or --num-prompts)")
            if run.arrivals == "trace":
                from workloads.serving import describe

                # A trace has no configured rate: its point is keyed by the offered rate.
                offered = describe(wl).get("offered_rps") or math.inf
                rps = round(offered, 6) if math.isfinite(offered) else math.inf
                if rps not in run.rps:
                    run.rps.append(rps)
            run.workloads[(ds, rps)] = wl


def workload_shape(run: ServeRun):
    from dllm_bench.systems import WorkloadShape

    reqs = [r for wl in run.workloads.values() for r in wl]
    return WorkloadShape(max_prompt_len=max(r.prompt_len for r in reqs),
                         max_gen_length=max(r.gen_length for r in reqs),
                         block_length=run.preset.block_length, steps=None)


# ---------------------------------------------------------------- one point in a worker
class WorkerFailed(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _worker_spec(run: ServeRun, variant, workload, shape) -> dict:
    p = run.preset
    return {
        "variant": variant.to_dict(), "model_dir": str(run.model_dir), "dtype": p.dtype,
        "device": p.device, "memory_budget": run.memory_budget, "threads": p.threads,
        "engine_defaults": run.engine_defaults, "baseline_defaults": run.baseline_defaults,
        "max_model_len": p.max_model_len, "shape": shape.__dict__,
        "sampling": {"block_length": p.block_length, "steps": "gen_length"},
        "workload": [{"request_id": r.request_id, "prompt_ids": r.prompt_ids, "gen_length": r.gen_length,
                      "arrival": r.arrival} for r in workload],
        "max_duration": run.max_duration, "num_warmups": run.num_warmups, "use_cache": run.use_cache,
    }


def run_worker(spec: dict, log_path: Path, threads: int, on_event) -> dict:
    """Run one point in a fresh `python -m dllm_bench.serve_worker` process; return its output.

    on_event(dict) gets every JSON line the worker prints. Ctrl-C is forwarded to the worker
    (its own session, so the terminal's SIGINT reaches only us), which stops serving, writes its
    partial result, and exits; the KeyboardInterrupt is re-raised after that, with the partial
    result attached as `.partial` (None if there was none)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dllm-serve-") as tmp, open(log_path, "w") as log:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        proc = subprocess.Popen([sys.executable, "-m", "dllm_bench.serve_worker", str(spec_path), str(out_path)],
                                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                                env=env, start_new_session=True)
        events: queue.Queue = queue.Queue()

        def reader() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                events.put(line)
            events.put(None)
        th = threading.Thread(target=reader, daemon=True)
        th.start()
        error: dict | None = None
        interrupted = False
        deadline = math.inf

        def pump(timeout: float) -> bool:
            """Handle queued lines; False once the worker's stdout is closed."""
            nonlocal error
            try:
                line = events.get(timeout=timeout)
            except queue.Empty:
                return True
            if line is None:
                return False
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                log.write(line)
                return True
            if ev.get("event") == "error":
                error = ev
            on_event(ev)
            return True

        try:
            while pump(0.2):
                pass
        except KeyboardInterrupt:
            interrupted = True
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            try:
                while time.monotonic() < deadline and pump(0.2):
                    pass
            except KeyboardInterrupt:  # a second Ctrl-C: stop now
                pass
        finally:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()) if interrupted else None)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                proc.kill()
                proc.wait()
        out = None
        if out_path.exists():
            out = json.loads(out_path.read_text(encoding="utf-8"))
        if interrupted:
            exc = KeyboardInterrupt()
            exc.partial = out  # type: ignore[attr-defined]
            raise exc
        if proc.returncode == 0 and out is not None:
            return out
        if error is not None:
            raise WorkerFailed(error.get("kind", "internal"), error.get("message", "worker failed"))
        raise WorkerFailed("internal", f"worker exited with code {proc.returncode} (log: {log_path})")


# ---------------------------------------------------------------- results
def _display_label(summary: dict) -> str:
    label = summary["system"]
    if summary.get("is_baseline"):
        b = summary.get("max_batch_size")
        kind = summary.get("scenario_kind", "")
        label += f" [B={b} {'max-fit' if kind == 'max-fit' else 'fixed'}]"
    if summary.get("interrupted"):
        label += " (interrupted)"
    return label


def _point_summary(out: dict, variant, rps: float, run: ServeRun, workload) -> tuple[dict, list, dict]:
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
    def f(v, scale=1.0, d=2):
        return "n/a" if v is None else f"{v * scale:.{d}f}"
    flags = " INTERRUPTED" if s.get("interrupted") else " TIMED OUT" if s.get("timed_out") else ""
    return (f"{_display_label(s)} @ {_fmt_rps(s['rps'])} rps ({s.get('dataset')}): "
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


# ---------------------------------------------------------------- the command
def serve(run: ServeRun, *, result_dir: Path | None, run_id: str | None, resume: bool,
          as_json: bool) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dllm_bench import results
    from dllm_bench.results import PointKey
    from dllm_bench.summary_print import print_comparison, print_summary
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
        "workloads": {f"{ds}@{_fmt_rps(r)}": describe(wl) for (ds, r), wl in run.workloads.items()},
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
                  f"{', '.join(_fmt_rps(r) for r in run.rps)}; datasets: {', '.join(run.datasets)}; "
                  f"arrivals {run.arrivals}" + (f" (burstiness {run.burstiness:g})" if run.arrivals == "gamma" else "")
                  + f"; seed {run.seed}", markup=False, highlight=False)
    for (ds, r), wl in run.workloads.items():
        d = describe(wl)
        console.print(f"workload {ds} @ {_fmt_rps(r)} rps: {d['num_requests']} requests over "
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
                progress.console.print(f"skip {v.label} @ {_fmt_rps(rps)} rps ({ds}): finished earlier",
                                       markup=False, highlight=False)
                continue
            task = progress.add_task(f"{v.label} @ {_fmt_rps(rps)} rps", total=len(wl), status="starting",
                                     arrived=0, tps=0.0)

            def on_event(ev: dict, task=task) -> None:
                e = ev.get("event")
                if e == "status":
                    progress.update(task, status=ev.get("message", ""))
                elif e == "built":
                    info = ev.get("info", {})
                    b = info.get("max_batch_size")
                    progress.update(task, status=f"B={b}" if b else f"KV pool {info.get('kv_pool_tokens')} tok")
                elif e == "progress":
                    progress.update(task, completed=ev.get("finished", 0), arrived=ev.get("arrived", 0),
                                    tps=float(ev.get("tps") or 0.0))
                elif e == "done":
                    progress.update(task, status="done")
            spec = _worker_spec(run, v, wl, shape)
            log_path = run_dir / "logs" / f"{results.point_name(key)}.log"
            try:
                out = run_worker(spec, log_path, p.threads, on_event)
            except KeyboardInterrupt as e:
                interrupted = True
                out = getattr(e, "partial", None)
                if out is not None:
                    s, recs, extra = _point_summary(out, v, rps, run, wl)
                    results.write_point(run_dir, key, s, recs, extra)
                progress.update(task, status="interrupted")
                break
            except WorkerFailed as e:
                progress.update(task, status="failed")
                if e.kind == "user":
                    user_error = str(e)
                    break
                failures.append(f"{v.label} @ {_fmt_rps(rps)} rps ({ds}): {e} (log: {log_path})")
                progress.console.print(f"error: {failures[-1]}", markup=False, highlight=False)
                continue
            s, recs, extra = _point_summary(out, v, rps, run, wl)
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
                             title=f"{c['dataset']} @ {_fmt_rps(c['rps'])} rps — vs best baseline")
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


def resolve_run(*, rps: str | None, systems: str | None, dataset: str | None, dataset_path: Path | None,
                num_prompts: int | None, duration: float | None, burstiness: float, arrivals: str | None,
                time_scale: float, burstgpt_model: str | None, memory_budget: str | None, model: str | None,
                preset: str | None, max_num_batched_tokens: int | None, max_num_logits: str | None,
                max_num_seqs: int | None, retention: float | None, length_scale: float | None,
                gen_cap: int | None, block_length: int | None, max_prompt_len: int | None,
                threads: int | None, dtype: str | None, device: str | None, seed: int,
                max_duration: float | None, num_warmups: int, no_profile_cache: bool) -> ServeRun:
    """Every option checked (cheap ones first) and the workloads built: any problem is a
    UserError before a run directory exists."""
    from dllm_bench.presets import resolve_model
    from dllm_bench.serve_presets import preset_for
    from dllm_bench.systems import parse_systems
    from dllm_bench.units import parse_size

    variants = parse_systems(systems)
    sp = preset_for(preset, model)
    rps_list = parse_rps_list(rps if rps is not None else sp.rps)
    datasets = parse_datasets(dataset if dataset is not None else sp.dataset)
    arrivals = arrivals or ("gamma" if burstiness != 1.0 else "poisson")
    if arrivals not in ARRIVALS:
        raise UserError(f"--arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if not (burstiness > 0):
        raise UserError(f"--burstiness must be > 0 (1 = Poisson, < 1 burstier), got {burstiness}")
    if arrivals == "poisson" and burstiness != 1.0:
        raise UserError("--burstiness applies to gamma arrivals (poisson is burstiness 1); use --arrivals gamma")
    if dataset_path is not None:
        if not dataset_path.is_file():
            raise UserError(f"--dataset-path: no such file: {dataset_path}")
        if len(datasets) > 1:
            raise UserError("--dataset-path replays one file: give a single --dataset (its label)")
    elif "custom" in datasets:
        raise UserError("--dataset custom needs --dataset-path (a BurstGPT CSV or a JSONL file)")
    if arrivals == "trace":
        if dataset_path is None:
            raise UserError("--arrivals trace replays the timestamps of --dataset-path (a BurstGPT CSV or JSONL)")
        if rps is not None:
            raise UserError("--rps does not apply to --arrivals trace (use --time-scale to speed it up)")
    if num_prompts is not None and num_prompts < 1:
        raise UserError(f"--num-prompts must be >= 1, got {num_prompts}")
    if duration is not None and not (duration > 0 and math.isfinite(duration)):
        raise UserError(f"--duration must be a number of seconds > 0, got {duration}")
    if duration is not None and num_prompts is None and any(math.isinf(r) for r in rps_list) and arrivals != "trace":
        raise UserError("--rps inf sends everything at t=0: bound it with --num-prompts, not --duration")
    if max_duration is not None and not max_duration > 0:
        raise UserError(f"--max-duration must be > 0 seconds, got {max_duration}")
    if not time_scale > 0:
        raise UserError(f"--time-scale must be > 0, got {time_scale}")
    if num_warmups < 0:
        raise UserError(f"--num-warmups must be >= 0, got {num_warmups}")
    over: dict[str, Any] = {}
    for k, v in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs),
                 ("gen_cap", gen_cap), ("block_length", block_length), ("max_prompt_len", max_prompt_len),
                 ("threads", threads)):
        if v is not None:
            if v < 1:
                raise UserError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
            over[k] = v
    if max_num_logits is not None:
        over["max_num_logits"] = parse_optional_int(max_num_logits, "--max-num-logits")
    if retention is not None:
        if not 0 < retention <= 1:
            raise UserError(f"--retention must be in (0, 1], got {retention}")
        over["retention"] = retention
    if length_scale is not None:
        if not (length_scale > 0 and math.isfinite(length_scale)):
            raise UserError(f"--length-scale must be > 0, got {length_scale}")
        over["length_scale"] = length_scale
    if dtype is not None:
        if dtype not in ("float32", "float64", "bfloat16", "float16"):
            raise UserError(f"--dtype must be float32, float64, bfloat16 or float16, got {dtype!r}")
        over["dtype"] = dtype
    if device is not None:
        over["device"] = device
    if memory_budget is not None:
        over["memory_budget"] = None if memory_budget.strip().lower() in ("none", "auto") else memory_budget
    sp = replace(sp, **over)
    if sp.gen_cap < sp.block_length:
        raise UserError(f"--gen-cap {sp.gen_cap} is smaller than one block ({sp.block_length} tokens)")
    budget = parse_size(sp.memory_budget, "--memory-budget") if sp.memory_budget else None
    if sp.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"--device {sp.device}: CUDA is not available here (use --device cpu)")
    elif sp.device != "cpu":
        raise UserError(f"--device must be cpu or cuda[:N], got {sp.device!r}")
    if budget is None and not sp.device.startswith("cuda"):
        raise UserError("a --memory-budget is needed on CPU (e.g. --memory-budget 1GiB)")
    model_dir = resolve_model(sp.model)
    info = _model_info(model_dir, sp.dtype)
    if budget is not None and budget <= info["weights_bytes"]:
        from dllm_bench.units import format_size

        raise UserError(f"--memory-budget {format_size(budget)} does not even hold the weights "
                        f"({format_size(info['weights_bytes'])} in {sp.dtype})")
    if num_prompts is None and duration is None:
        num_prompts = sp.num_prompts
    run = ServeRun(
        preset=sp, model_dir=model_dir, model_info=info, systems=variants, datasets=datasets,
        rps=rps_list, arrivals=arrivals, burstiness=burstiness, seed=seed, num_prompts=num_prompts,
        duration=duration, dataset_path=str(dataset_path) if dataset_path else None,
        time_scale=time_scale, burstgpt_model=burstgpt_model, memory_budget=budget,
        max_duration=max_duration, num_warmups=num_warmups, use_cache=not no_profile_cache)
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    build_workloads(run)
    return run


def register(app: typer.Typer) -> None:
    from dllm_bench.serve_presets import DEFAULT_PRESET, PRESETS

    @app.command("serve")
    def serve_cmd(
        rps: str | None = typer.Option(None, "--rps", "--request-rate",
                                       help="arrival rate(s), req/s: 0.5, or a sweep 0.1,0.25,0.5,1.0; inf = all at t=0 [preset: 0.5]"),
        systems: str | None = typer.Option(None, "--systems",
                                           help="systems and variants: engine,fast-dllm,dllm-cache,sparse-dllm (default), "
                                                "llada; variants name[:k=v,...] e.g. 'engine:cache=dual,fast-dllm:batch=1'"),
        dataset: str | None = typer.Option(None, "--dataset", "--dataset-name",
                                           help="livebench | osc | burstgpt | random, or a list livebench,osc,burstgpt"),
        dataset_path: Path | None = typer.Option(None, "--dataset-path", help="replay a BurstGPT CSV or a JSONL file"),
        num_prompts: int | None = typer.Option(None, "--num-prompts", help="requests per point [preset]"),
        duration: float | None = typer.Option(None, "--duration", help="bound arrivals by time (s) instead of count"),
        burstiness: float = typer.Option(1.0, "--burstiness", help="gamma shape: 1 = Poisson, < 1 burstier"),
        arrivals: str | None = typer.Option(None, "--arrivals", help="poisson | gamma | trace (default: poisson, gamma if --burstiness != 1)"),
        time_scale: float = typer.Option(1.0, "--time-scale", help="trace replay speed-up (60 = a minute per second)"),
        burstgpt_model: str | None = typer.Option(None, "--burstgpt-model", help="BurstGPT CSV rows of one model: ChatGPT | GPT-4"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV, e.g. 1GiB, 512MiB, 2.5GB [preset]"),
        model: str | None = typer.Option(None, "--model", help="model preset (dllm-bench models list) or LLaDA checkpoint dir [preset]"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET}, or the one for --model)"),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens", help="engine token budget per step"),
        max_num_logits: str | None = typer.Option(None, "--max-num-logits", help="engine logit budget (rows per step), or none"),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="engine max concurrent requests"),
        retention: float | None = typer.Option(None, "--retention", help="sparse KV retention (engine and sparse-dllm keep_ratio)"),
        length_scale: float | None = typer.Option(None, "--length-scale", help="multiply dataset token counts (CPU runs: 0.125)"),
        gen_cap: int | None = typer.Option(None, "--gen-cap", help="max gen_length in tokens"),
        block_length: int | None = typer.Option(None, "--block-length", help="diffusion block length"),
        max_prompt_len: int | None = typer.Option(None, "--max-prompt-len", help="cut prompts to this many tokens"),
        threads: int | None = typer.Option(None, "--threads", help="torch threads of every system process [preset]"),
        dtype: str | None = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 | float64 [preset]"),
        device: str | None = typer.Option(None, "--device", help="cpu | cuda [preset]"),
        seed: int = typer.Option(0, "--seed", help="workload seed (arrivals, lengths, prompt ids)"),
        max_duration: float | None = typer.Option(None, "--max-duration", help="abort a point after this many seconds (unfinished requests are counted)"),
        num_warmups: int = typer.Option(1, "--num-warmups", help="unmeasured warm-up requests per system"),
        result_dir: Path | None = typer.Option(None, "--result-dir", help="runs root (default results/runs, or $DLLM_BENCH_RESULTS_DIR)"),
        run_id: str | None = typer.Option(None, "--run-id", help="name of the run directory (default: timestamp-name)"),
        resume: bool = typer.Option(False, "--resume", help="continue a run (--run-id, default the latest): skip finished points"),
        no_profile_cache: bool = typer.Option(False, "--no-profile-cache", help="re-measure KV pools and static batches"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document (summaries, ratios, run dir) on stdout"),
    ) -> None:
        """Open-loop serving benchmark: every system replays the same arrivals under the same memory budget."""
        run = resolve_run(
            rps=rps, systems=systems, dataset=dataset, dataset_path=dataset_path, num_prompts=num_prompts,
            duration=duration, burstiness=burstiness, arrivals=arrivals, time_scale=time_scale,
            burstgpt_model=burstgpt_model, memory_budget=memory_budget, model=model, preset=preset,
            max_num_batched_tokens=max_num_batched_tokens, max_num_logits=max_num_logits,
            max_num_seqs=max_num_seqs, retention=retention, length_scale=length_scale, gen_cap=gen_cap,
            block_length=block_length, max_prompt_len=max_prompt_len, threads=threads, dtype=dtype,
            device=device, seed=seed, max_duration=max_duration, num_warmups=num_warmups,
            no_profile_cache=no_profile_cache)
        code = serve(run, result_dir=result_dir, run_id=run_id, resume=resume, as_json=as_json)
        if code:
            sys.exit(code)  # not typer.Exit: with standalone_mode=False click returns its code unused
