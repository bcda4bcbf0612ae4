"""`dllm-bench sweep --vary input-len|output-len`: the paper's Fig. 7 sensitivity sweeps — the
engine's saturation throughput relative to Sparse-dLLM per prompt length (output fixed) or per
output length (prompt fixed); ranges scale with the preset (dllm_bench/sweep/lengths.py, docs/ABLATE.md).

Each (point, system) runs in a fresh serve worker on a fixed-length `random` workload with every
request at t=0; run directory of kind "sweep" (serve's layout + plots/fig7_<vary>.png). Tables
go to stderr; `--json` prints one JSON document on stdout.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import typer

from dllm_bench import inputs
from dllm_bench.errors import UserError


def sweep(*, vary: str, points: str | None, fixed_len: int | None, systems: str | None, num_prompts: int | None,
          model: str | None, preset: str | None, memory_budget: str | None, seed: int, threads: int | None,
          rps: str, result_dir: Path | None, run_id: str | None, as_json: bool, num_warmups: int,
          max_duration: float | None, no_profile_cache: bool) -> int:
    from dllm_bench import console as tt
    from dllm_bench import results
    from dllm_bench.ablate import ladder as ab
    from dllm_bench.serve import points as bp
    from dllm_bench.serve.presets import preset_for
    from dllm_bench.sweep import lengths as sw
    from workloads.serving import describe

    result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
    vary = sw.parse_vary(vary)
    if num_prompts is not None and num_prompts < 1:
        raise UserError(f"--num-prompts must be >= 1, got {num_prompts}")
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    sp = preset_for(preset, model)
    plan = sw.plan_sweep(vary, length_scale=sp.length_scale, block_length=sp.block_length, device=sp.device,
                         points=points, fixed=fixed_len)
    n = num_prompts if num_prompts is not None else ab.ABLATION_PROMPTS.get(sp.name, sp.num_prompts)
    run = bp.resolve_bench_run(systems=systems or sw.DEFAULT_SYSTEMS, dataset="random", rps=rps, num_prompts=n,
                               model=model, preset=preset, memory_budget=memory_budget, seed=seed,
                               threads=threads, num_warmups=num_warmups, max_duration=max_duration,
                               no_profile_cache=no_profile_cache)
    if len(run.rps) != 1:
        raise UserError("--rps takes one rate for sweep (inf = saturation, the default)")
    rate = run.rps[0]
    run.preset = replace(run.preset, dataset="random", num_prompts=n)  # describe() tells what ran
    p = run.preset
    reference = sw.reference_label(run.systems)
    mml = p.max_model_len or run.model_info["max_sequence_length"]
    too_long = [pt for pt in plan.points if pt[0] + pt[1] > mml]
    if too_long:
        raise UserError(f"sweep points {too_long} exceed the model's {mml} tokens")
    workloads = {plan.label(pt): sw.point_workload(run, pt, n, rate, seed) for pt in plan.points}
    run.workloads = {(lab, rate): wl for lab, wl in workloads.items()}
    labels = [v.label for v in run.systems]
    config = {
        "preset": p.to_dict(), "preset_line": p.describe(), "model_dir": str(run.model_dir), "model": run.model_info,
        "vary": vary, "plan": plan.to_dict(), "systems": [v.to_dict() for v in run.systems],
        "systems_labels": labels, "reference": reference, "rps": rate, "seed": seed, "num_prompts": n,
        "memory_budget": run.memory_budget, "num_warmups": run.num_warmups, "max_duration": run.max_duration,
        "engine_defaults": run.engine_defaults, "baseline_defaults": run.baseline_defaults,
        "throughput_metric": sw.THROUGHPUT,
        "measurement": ("saturation: every request at t=0 (rps inf); throughput = output tokens / makespan"
                        if math.isinf(rate) else f"open loop at {rate:g} req/s"),
        "workloads": {lab: describe(wl) for lab, wl in workloads.items()},
    }
    root = results.results_root(result_dir)
    try:
        run_dir = results.create_run("sweep", config, name=f"sweep-{vary}-{Path(str(p.model)).name}",
                                     run_id=run_id, root=root)
    except FileExistsError as e:
        raise UserError(str(e)) from None
    con = tt.console()
    con.print(f"[bold]dllm-bench sweep --vary {vary}[/bold] → {run_dir}", highlight=False)
    con.print(p.describe(), markup=False, highlight=False)
    con.print(f"{plan.rule}; points {plan.values}; {n} prompts per point; {config['measurement']}; "
              f"systems {', '.join(labels)} (ratios vs {reference})", markup=False, highlight=False)

    planned = []
    for pt, paper in zip(plan.points, plan.paper_points, strict=True):
        lab = plan.label(pt)
        wl = workloads[lab]
        shape = bp.shape_of(wl, p.block_length)  # a baseline's static batch: max fit for THIS point
        for v in run.systems:
            planned.append(bp.PlannedPoint(lab, rate, v, wl, shape, {
                "sweep_vary": vary, "sweep_input_len": pt[0], "sweep_output_len": pt[1], "paper_len": paper}))
    res = bp.measure_points(run, planned, run_dir, con)
    pts = res["points"]
    if res["user_error"] and not pts:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise UserError(res["user_error"])
    df = sw.sweep_table(pts, plan, labels, reference)
    tt.print_df(con, df, f"Sensitivity ({vary}): output throughput and x vs {reference} (paper Fig. 7)",
                sw.table_formats(df))
    plots = []
    if any(c.startswith("x ") and df[c].notna().any() for c in df.columns):
        plots.append(str(sw.plot_fig7(df, plan, run_dir / "plots" / f"fig7_{vary}.png", reference)))
    doc = {"run_id": run_dir.name, "run_dir": str(run_dir), "vary": vary, "plan": plan.to_dict(),
           "reference": reference, "preset": p.to_dict(), "measurement": config["measurement"],
           "interrupted": res["interrupted"], "failures": res["failures"], "table": df.to_dict(orient="records"),
           "plots": plots, "points": pts}
    results.atomic_write_json(run_dir / "sweep.json", {k: v for k, v in doc.items() if k != "points"})
    con.print(f"plots: {', '.join(plots) or 'none'}", markup=False, highlight=False)
    con.print(f"results: {run_dir}", markup=False, highlight=False)
    if as_json:
        sys.stdout.write(json.dumps(results._clean(doc), default=results._default, allow_nan=False) + "\n")
        sys.stdout.flush()
    if res["user_error"]:
        raise UserError(res["user_error"])
    if res["interrupted"]:
        return 130
    return 1 if res["failures"] else 0


def register(app: typer.Typer) -> None:
    from dllm_bench.serve.presets import DEFAULT_PRESET, PRESETS

    @app.command("sweep")
    def sweep_cmd(
        vary: str = typer.Option(..., "--vary", help="input-len (prompt length, output fixed) | output-len (output length, prompt fixed)"),
        points: str | None = typer.Option(None, "--points",
                                          help="lengths to sweep, tokens as sent, comma list (default: the paper's 100-600 / 128-512 scaled by the preset)"),
        fixed_len: int | None = typer.Option(None, "--fixed-len", help="the other length, tokens (default: paper 256 output / 300 input, scaled)"),
        systems: str | None = typer.Option(None, "--systems", help="systems (serve's spec syntax) (default: engine,sparse-dllm)"),
        num_prompts: int | None = typer.Option(None, "--num-prompts", help="requests per point (default: cpu-default: 8, else the preset's)"),
        model: str | None = typer.Option(None, "--model", help="model preset or LLaDA checkpoint dir (default: preset)"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET})"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV (default: preset)"),
        seed: int = typer.Option(0, "--seed", help="workload seed (prompt ids)"),
        threads: int | None = typer.Option(None, "--threads", help="torch threads of every system process (default: preset)"),
        rps: str = typer.Option("inf", "--rps", help="one arrival rate; inf (default) = all requests at t=0 (saturation)"),
        result_dir: Path | None = typer.Option(None, "--result-dir", help="runs root (default results/runs, or $DLLM_BENCH_RESULTS_DIR)"),
        run_id: str | None = typer.Option(None, "--run-id", help="run directory name"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
        num_warmups: int = typer.Option(1, "--num-warmups", help="unmeasured warm-up requests per system"),
        max_duration: float | None = typer.Option(None, "--max-duration", help="abort a point after this many seconds"),
        no_profile_cache: bool = typer.Option(False, "--no-profile-cache", help="re-measure KV pools and static batches"),
    ) -> None:
        """Sensitivity sweeps (paper Fig. 7): engine throughput relative to Sparse-dLLM vs input or output length."""
        code = sweep(vary=vary, points=points, fixed_len=fixed_len, systems=systems, num_prompts=num_prompts,
                     model=model, preset=preset, memory_budget=memory_budget, seed=seed, threads=threads, rps=rps,
                     result_dir=result_dir, run_id=run_id, as_json=as_json, num_warmups=num_warmups,
                     max_duration=max_duration, no_profile_cache=no_profile_cache)
        if code:
            sys.exit(code)
