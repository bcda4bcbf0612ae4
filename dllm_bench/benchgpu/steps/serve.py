"""Steps `serve-full` and `serve-22g`: `dllm-bench serve` with fixed decoding (so every timing
is the real model's: LLaDA-8B-Instruct's, Dream-7B's), one run directory each under runs/, every point with its per-step
trace (`--trace-steps`, where this build has it) and a --max-duration that bounds a slow point.

serve-full: the paper preset at saturation on the whole GPU, the engine's default and its dual
and sparse caches against Fast-dLLM and Sparse-dLLM at their largest static batch (each system
that has a version for the model's family: `Bench.full_systems`, `small_systems`). serve-22g:
the RTX 4090's 22 GiB, where a baseline fits a batch of a few, at saturation and at 1.0 req/s.
"""
from __future__ import annotations

from collections.abc import Sequence

from dllm_bench.benchgpu import estimate as est
from dllm_bench.benchgpu.derive import trace_stats
from dllm_bench.benchgpu.record import OK, Bench, StepRecord
from dllm_bench.benchgpu.subcommand import run_cli
from dllm_bench.results import fmt_rps, load_points
from engine.decoding import FIXED

TRACE_FILE = "steps.jsonl"
POINT_FIELDS = ("system", "is_baseline", "max_batch_size", "completed", "num_prompts", "unfinished", "timed_out",
                "output_throughput", "mean_e2el_ms", "p99_e2el_ms", "mean_ttft_ms", "p99_ttft_ms", "duration_s",
                "total_output_tokens", "forwards", "query_tokens", "logits_rows", "mean_batch_size")


def small_rates(bench: Bench) -> tuple[str, ...]:
    return ("inf", bench.scale.rate)


def estimate_full(bench: Bench) -> float:
    return est.serve_s(bench.costs, bench.scale, "full", bench.full_systems, ("inf",), bench.scale.full_prompts)


def estimate_small(bench: Bench) -> float:
    return est.serve_s(bench.costs, bench.scale, "small", bench.small_systems, small_rates(bench), bench.small_prompts)


def run_full(bench: Bench, rec: StepRecord) -> None:
    _serve(bench, rec, "serve-full", "full", bench.full_systems, ("inf",), bench.scale.full_prompts,
           bench.scale.full_budget)


def run_small(bench: Bench, rec: StepRecord) -> None:
    _serve(bench, rec, "serve-22g", "small", bench.small_systems, small_rates(bench), bench.small_prompts,
           bench.scale.small_budget)


def _trim(point: dict, run_dir, bench: Bench) -> dict:
    """What the summary reads of a point summary, with its trace's figures."""
    row = {k: point.get(k) for k in POINT_FIELDS}
    row["rps"] = fmt_rps(point["rps"])
    cfg = point.get("engine_config") or {}
    row["cache"], row["cuda_graphs"] = cfg.get("cache"), cfg.get("cuda_graphs")
    pdir = run_dir / "points" / point["_point"]
    row["point_dir"] = bench.rel(pdir)
    trace = pdir / TRACE_FILE
    row["trace"] = bench.rel(trace) if trace.is_file() else None
    row["trace_stats"] = trace_stats(trace) if trace.is_file() else None
    return row


def _serve(bench: Bench, rec: StepRecord, run_id: str, regime: str, systems: Sequence[str], rates: Sequence[str],
           prompts: int, budget: str | None) -> None:
    c, scale = bench.costs, bench.scale
    replays = [est.replay_s(c, scale, regime, s, prompts, r) for s in systems for r in rates]
    cap = est.point_cap(c, max(replays))
    args = ["serve", "--preset", scale.serve_preset, "--model", bench.model_arg(), "--device", scale.device,
            "--rps", ",".join(rates), "--num-prompts", str(prompts), "--systems", ",".join(systems),
            "--decoding", FIXED, "--no-projection", "--max-duration", f"{cap:.0f}",
            "--result-dir", str(bench.out / "runs"), "--run-id", run_id]
    if budget is not None:
        args += ["--memory-budget", budget]
    traced = bench.commands.has_flag("serve", "--trace-steps")
    if traced:
        args.append("--trace-steps")
    timeout = c.process_s + len(replays) * (2 * c.load_s + cap) + 60
    outcome = run_cli(args, bench.log(run_id), timeout_s=timeout)
    run_dir = bench.out / "runs" / run_id
    rec.outputs += [bench.rel(outcome.log)] + ([bench.rel(run_dir)] if run_dir.is_dir() else [])
    points = [_trim(p, run_dir, bench) for p in load_points(run_dir)] if (run_dir / "points").is_dir() else []
    rec.data = {"regime": regime, "budget": budget, "prompts": prompts, "rates": list(rates), "systems": list(systems),
                "max_duration_s": round(cap), "traced": traced, "points": points}
    expected = len(systems) * len(rates)
    line = f"{len(points)}/{expected} points, {prompts} requests each"
    if not traced:
        line += "; no per-step traces (this build's serve has no --trace-steps)"
    if not outcome.ok or len(points) < expected:
        rec.fail(f"{line}; serve {outcome.reason()}")
    else:
        rec.status, rec.detail = OK, line
