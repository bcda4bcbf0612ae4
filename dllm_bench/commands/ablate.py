"""`dllm-bench ablate`: the paper's Fig. 8 ablation ladder (Sparse-dLLM -> + inference engine ->
+ phase-multiplexed scheduler -> + logit-aware budgeting) and the full engine under each cache
policy, on the same arrivals and memory budget (dllm_bench/ablate/ladder.py, docs/ABLATE.md).

Throughput is measured at saturation by default (`--rps inf`: every request arrives at t=0, so
a system's output tokens / makespan is its capacity, not the offered load). Each point runs in
a fresh worker process like `serve`; the run directory has serve's layout (kind "ablate") plus
plots/fig8_ablation.png and plots/cache_policies.png. Tables go to stderr; `--json` prints one
JSON document on stdout.
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


def ablate(*, datasets: str | None, num_prompts: int | None, model: str | None, memory_budget: str | None,
           seed: int, result_dir: Path | None, as_json: bool, threads: int | None, preset: str | None,
           rps: str, max_num_batched_tokens: int | None, max_num_logits: str | None, cache_rows: str,
           run_id: str | None, num_warmups: int, max_duration: float | None, no_profile_cache: bool) -> int:
    from dllm_bench import console as tt
    from dllm_bench import results
    from dllm_bench.ablate import ladder as ab
    from dllm_bench.ablate import tables as abt
    from dllm_bench.serve import points as bp
    from dllm_bench.serve.presets import preset_for
    from dllm_bench.systems.spec import parse_system
    from workloads.serving import describe

    result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
    ds_list = ab.parse_dataset_list(datasets)
    rows_mode = ab.parse_cache_rows(cache_rows)
    if num_prompts is not None and num_prompts < 1:
        raise UserError(f"--num-prompts must be >= 1, got {num_prompts}")
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    sp = preset_for(preset, model)
    st = ab.ablation_settings(sp.name, sp.num_prompts, max_num_batched_tokens, max_num_logits, num_prompts)
    n = st["num_prompts"]
    run = bp.resolve_bench_run(systems="sparse-dllm", dataset=",".join(ds_list), rps=rps, num_prompts=n,
                               model=model, preset=preset, memory_budget=memory_budget, seed=seed,
                               threads=threads, max_num_batched_tokens=st["max_num_batched_tokens"],
                               max_num_logits=st["max_num_logits"],
                               num_warmups=num_warmups, max_duration=max_duration,
                               no_profile_cache=no_profile_cache)
    if len(run.rps) != 1:
        raise UserError("--rps takes one rate for ablate (inf = saturation, the default)")
    rate = run.rps[0]
    run.preset = replace(run.preset, dataset=",".join(ds_list), num_prompts=n)  # describe() tells what ran
    p = run.preset
    rungs = ab.ladder(p.max_num_logits)
    crows = ab.cache_rows(p.max_num_logits) if rows_mode != "none" else []
    variants = {r.key: parse_system(r.spec) for r in rungs + crows}
    run.systems = list({v.label: v for v in variants.values()}.values())
    cfg_kw = dict(model_dir=str(run.model_dir), dtype=p.dtype, device=p.device, memory_budget=run.memory_budget,
                  max_model_len=p.max_model_len)
    eff = ab.effective_configs(rungs + crows, run.engine_defaults, run.baseline_defaults, **cfg_kw)
    eng = [e["config"] if e["system"] == "engine" else None for e in eff]
    problems = ab.check_ladder_configs(eng, rungs + crows, reference=eng[len(rungs) - 1])
    if problems:  # a programming error in the ladder, never the user's
        raise RuntimeError("ablation ladder is inconsistent: " + "; ".join(problems))

    con = tt.console()
    config = {
        "preset": p.to_dict(), "preset_line": p.describe(), "model_dir": str(run.model_dir), "model": run.model_info,
        "datasets": ds_list, "rps": rate, "seed": seed, "num_prompts": n, "memory_budget": run.memory_budget,
        "num_warmups": run.num_warmups, "max_duration": run.max_duration, "cache_rows_mode": rows_mode,
        "engine_defaults": run.engine_defaults, "baseline_defaults": run.baseline_defaults,
        "ladder": [{**r.to_dict(), "label": variants[r.key].label} for r in rungs],
        "cache_rows": [{**r.to_dict(), "label": variants[r.key].label} for r in crows],
        "effective_configs": {r.key: e for r, e in zip(rungs + crows, eff, strict=True)},
        "throughput_metric": ab.THROUGHPUT,
        "measurement": ("saturation: every request at t=0 (rps inf); throughput = output tokens / makespan"
                        if math.isinf(rate) else f"open loop at {rate:g} req/s (Poisson); throughput = "
                                                 "output tokens / makespan"),
        "workloads": {ds: describe(run.workloads[(ds, rate)]) for ds in ds_list},
    }
    root = results.results_root(result_dir)
    name = f"ablate-{Path(str(p.model)).name}-{'+'.join(ds_list)}"
    try:
        run_dir = results.create_run("ablate", config, name=name, run_id=run_id, root=root)
    except FileExistsError as e:
        raise UserError(str(e)) from None

    con.print(f"[bold]dllm-bench ablate[/bold] → {run_dir}", highlight=False)
    con.print(p.describe(), markup=False, highlight=False)
    con.print(f"{config['measurement']}; {n} prompts per dataset; datasets {', '.join(ds_list)}; seed {seed}",
              markup=False, highlight=False)
    for r in rungs + crows:
        con.print(f"  {r.group:>6} {r.title}: {variants[r.key].label}", markup=False, highlight=False)

    planned = []
    for i, ds in enumerate(ds_list):
        wl = run.workloads[(ds, rate)]
        shape = bp.shape_of(wl, p.block_length)
        rows = rungs + (crows if rows_mode == "all" or (rows_mode == "first" and i == 0) else [])
        for r in rows:
            planned.append(bp.PlannedPoint(ds, rate, variants[r.key], wl, shape,
                                           {"ablation_rung": r.key, "ablation_title": r.title}))
    res = bp.measure_points(run, planned, run_dir, con)
    if res["user_error"] and "max_num_logits=none" in res["user_error"]:
        res["user_error"] += (f" (the monolithic-logit rungs hold [token budget x vocab] logits: lower "
                              f"--max-num-batched-tokens (now {p.max_num_batched_tokens}) or raise --memory-budget)")
    points = res["points"]
    if res["user_error"] and not points:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing measured: leave no run behind
        raise UserError(res["user_error"])

    lt = abt.ladder_table(points, config["ladder"], ds_list)
    ct = abt.cache_table(points, config["cache_rows"], config["ladder"][0], ds_list) if crows else None
    tt.print_df(con, lt, "Ablation ladder (paper Fig. 8): output throughput, x vs Sparse-dLLM", abt.LADDER_FMT)
    if ct is not None and not ct.empty:
        tt.print_df(con, ct, "Full engine under each cache policy (same scheduler, budgets, arrivals)", abt.CACHE_FMT)
    # The effective configs the workers built (after profiling): differences besides the switch?
    by_key = {(s.get("dataset"), s["system"]): s.get("engine_config") for s in points}
    checks = {}
    for ds in ds_list:
        got = [by_key.get((ds, variants[r.key].label)) for r in rungs + crows]
        ref = got[len(rungs) - 1]
        probs = ab.check_ladder_configs(got, rungs + crows, reference=ref)
        checks[ds] = probs
        for pr in probs:
            con.print(f"config check ({ds}): {pr}", markup=False, highlight=False)
    plots = []
    if not lt["x_vs_baseline"].isna().all():
        plots.append(str(abt.plot_ablation(lt, run_dir / "plots" / "fig8_ablation.png")))
    if ct is not None and not ct.empty and not ct["x_vs_baseline"].isna().all():
        plots.append(str(abt.plot_cache_policies(ct, run_dir / "plots" / "cache_policies.png")))
    doc = {"run_id": run_dir.name, "run_dir": str(run_dir), "preset": p.to_dict(), "preset_line": p.describe(),
           "measurement": config["measurement"], "interrupted": res["interrupted"], "failures": res["failures"],
           "ladder": lt.to_dict(orient="records"), "cache_rows": [] if ct is None else ct.to_dict(orient="records"),
           "config_checks": checks, "plots": plots, "points": points}
    results.atomic_write_json(run_dir / "ablation.json", {k: v for k, v in doc.items() if k != "points"})
    con.print(f"plots: {', '.join(plots) or 'none'}", markup=False, highlight=False)
    con.print(f"results: {run_dir}", markup=False, highlight=False)
    if res["interrupted"]:
        con.print("interrupted: finished points are kept", markup=False, highlight=False)
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

    @app.command("ablate")
    def ablate_cmd(
        datasets: str | None = typer.Option(None, "--datasets", "--dataset",
                                            help="comma list of livebench, osc, burstgpt (default: all three)"),
        num_prompts: int | None = typer.Option(None, "--num-prompts",
                                               help="requests per dataset (default: cpu-default: 8, fewer than serve's 16; other presets: the preset's)"),
        model: str | None = typer.Option(None, "--model", help="model preset or LLaDA checkpoint dir (default: preset)"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV, e.g. 1GiB (default: preset)"),
        seed: int = typer.Option(0, "--seed", help="workload seed"),
        result_dir: Path | None = typer.Option(None, "--result-dir", help="runs root (default results/runs, or $DLLM_BENCH_RESULTS_DIR)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
        threads: int | None = typer.Option(None, "--threads", help="torch threads of every system process (default: preset)"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET})"),
        rps: str = typer.Option("inf", "--rps", help="one arrival rate; inf (default) = all requests at t=0 (saturation)"),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens",
                                                          help="engine token budget of every rung (default: cpu-default: 384, else preset)"),
        max_num_logits: str | None = typer.Option(None, "--max-num-logits",
                                                  help="logit budget of the last rung (default: cpu-default: 96, else preset)"),
        cache_rows: str = typer.Option("first", "--cache-rows",
                                       help="cache-policy rows on: all datasets | first dataset | none"),
        run_id: str | None = typer.Option(None, "--run-id", help="run directory name"),
        num_warmups: int = typer.Option(1, "--num-warmups", help="unmeasured warm-up requests per system"),
        max_duration: float | None = typer.Option(None, "--max-duration", help="abort a point after this many seconds"),
        no_profile_cache: bool = typer.Option(False, "--no-profile-cache", help="re-measure KV pools and static batches"),
    ) -> None:
        """Ablation (paper Fig. 8): Sparse-dLLM -> +engine -> +phase scheduler -> +logit budget, and cache policies."""
        code = ablate(datasets=datasets, num_prompts=num_prompts, model=model, memory_budget=memory_budget, seed=seed,
                      result_dir=result_dir, as_json=as_json, threads=threads, preset=preset, rps=rps,
                      max_num_batched_tokens=max_num_batched_tokens, max_num_logits=max_num_logits,
                      cache_rows=cache_rows, run_id=run_id, num_warmups=num_warmups, max_duration=max_duration,
                      no_profile_cache=no_profile_cache)
        if code:
            sys.exit(code)
