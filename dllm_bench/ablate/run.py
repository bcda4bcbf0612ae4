"""One `dllm-bench ablate` run (docs/ABLATE.md): the ladder's rungs and the cache-policy rows
(dllm_bench.ablate.ladder) as planned points on every dataset's workload, measured by the point
loop (dllm_bench.serve.points.measure_points), then the tables and figures
(dllm_bench.ablate.tables) and a check that consecutive rungs differ only in their switch.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dllm_bench import console as cons
from dllm_bench import results
from dllm_bench.ablate import ladder as ab
from dllm_bench.ablate import tables as abt
from dllm_bench.checkpoints.load import load_shape
from dllm_bench.errors import UserError
from dllm_bench.repeats import aggregate_points, repeat_seeds
from dllm_bench.serve.options import ServeOptions, check_counts, resolve_run
from dllm_bench.serve.points import PlannedPoint, measure_points, record_repeats, resume_id
from dllm_bench.serve.presets import preset_for
from dllm_bench.serve.workload import repeat_workloads, shape_of
from dllm_bench.systems.families import supports
from dllm_bench.systems.spec import ENGINE, parse_system
from workloads.serving import describe


def ablate(opts: ServeOptions, *, datasets: str | None, cache_rows: str, result_dir: Path | None,
           run_id: str | None, resume: bool, as_json: bool) -> int:
    """The ablation ladder and cache rows, measured, tabulated and plotted; returns the exit code.
    `opts`: the serving options ablate exposes (its rate defaults to inf: saturation)."""
    ds_list = ab.parse_dataset_list(datasets)
    rows_mode = ab.parse_cache_rows(cache_rows)
    seed = opts.seed
    check_counts(opts.num_prompts, seed, opts.repeats)
    # A checkpoint dir on a CUDA device takes the GPU preset, as in serve (preset_for).
    sp = preset_for(opts.preset, opts.model, device=opts.device or "auto")
    st = ab.ablation_settings(sp.name, sp.num_prompts, opts.max_num_batched_tokens, opts.max_num_logits,
                              opts.num_prompts)
    n = st["num_prompts"]
    # A baseline rung with no version for the model's family (systems.families) stays in the
    # tables, unmeasured (x vs it: n/a); the engine's rungs all run.
    family = load_shape(sp.model).model_type
    base = ab.BASELINE
    # The preset is pinned to the one the ladder was planned with.
    run = resolve_run(replace(opts, systems=base if supports(base, family) else ENGINE, dataset=",".join(ds_list),
                              num_prompts=n, preset=sp.name,
                              max_num_batched_tokens=st["max_num_batched_tokens"],
                              max_num_logits=st["max_num_logits"]))
    if len(run.rps) != 1:
        raise UserError("--rps takes one rate for ablate (inf = saturation, the default)")
    rate = run.rps[0]
    run.preset = replace(run.preset, dataset=",".join(ds_list), num_prompts=n)  # describe() tells what ran
    p = run.preset
    rungs = ab.ladder(p.max_num_logits)
    beyond = ab.beyond_rungs(p.max_num_logits)
    crows = ab.cache_rows(p.max_num_logits) if rows_mode != "none" else []
    variants = {r.key: parse_system(r.spec) for r in rungs + beyond + crows}
    measured = {k for k, v in variants.items() if supports(v.name, family)}
    run.systems = list({v.label: v for k, v in variants.items() if k in measured}.values())
    eff = ab.effective_configs(rungs + beyond + crows, run.engine_defaults, run.baseline_defaults,
                               model_dir=str(run.model_dir), dtype=p.dtype, device=p.device,
                               memory_budget=run.memory_budget, max_model_len=p.max_model_len)
    eng = [e["config"] if e["system"] == ENGINE else None for e in eff]
    problems = ab.check_ladder_configs(eng, rungs + beyond + crows, reference=eng[len(rungs) - 1])
    if problems:  # a programming error in the ladder, never the user's
        raise RuntimeError("ablation ladder is inconsistent: " + "; ".join(problems))

    con = cons.console()
    config = {
        **run.describe(), "datasets": ds_list, "rps": rate, "num_prompts": n, "cache_rows_mode": rows_mode,
        "ladder": [{**r.to_dict(), "label": variants[r.key].label} for r in rungs],
        "beyond": [{**r.to_dict(), "label": variants[r.key].label} for r in beyond],
        "cache_rows": [{**r.to_dict(), "label": variants[r.key].label} for r in crows],
        "effective_configs": {r.key: e for r, e in zip(rungs + beyond + crows, eff, strict=True)},
        "throughput_metric": ab.THROUGHPUT, "measurement": run.measurement(rate),
        "workloads": {ds: describe(run.workloads[(ds, rate)]) for ds in ds_list},
        "repeats": run.repeats, "repeat_seeds": repeat_seeds(seed, run.repeats), "fingerprint": run.fingerprint(),
    }
    root = results.results_root(result_dir)
    if resume:
        run_id = resume_id("ablate", run.fingerprint(), root, run_id)
    run_dir = results.create_run("ablate", config, name=f"ablate-{Path(str(p.model)).name}-{'+'.join(ds_list)}",
                                 run_id=run_id, root=root, resume=resume)
    if resume:
        record_repeats(run_dir, seed, run.repeats)
    con.print(f"[bold]dllm-bench ablate[/bold] → {run_dir}", highlight=False)
    con.print(p.describe(), markup=False, highlight=False)
    con.print(f"{config['measurement']}; {n} prompts per dataset; datasets {', '.join(ds_list)}; seed {seed}"
              + (f"; {run.repeats} repeats (seeds {seed}..{seed + run.repeats - 1})" if run.repeats > 1 else ""),
              markup=False, highlight=False)
    for r in rungs + beyond + crows:
        off = "" if r.key in measured else f" (not measured: it has no {family} version)"
        con.print(f"  {r.group:>6} {r.title}: {variants[r.key].label}{off}", markup=False, highlight=False)

    planned = []
    for rep, rep_seed in enumerate(repeat_seeds(seed, run.repeats)):  # repeat-major: a whole ladder first
        wls = repeat_workloads(run, rep)
        for i, ds in enumerate(ds_list):
            wl = wls[(ds, rate)]
            shape = shape_of(wl, p.block_length)
            rows = rungs + beyond + (crows if rows_mode == "all" or (rows_mode == "first" and i == 0) else [])
            planned += [PlannedPoint(ds, rate, variants[r.key], wl, shape,
                                     {"ablation_rung": r.key, "ablation_title": r.title}, repeat=rep, seed=rep_seed)
                        for r in rows if r.key in measured]
    res = measure_points(run, planned, run_dir, con, done=results.finished_points(run_dir) if resume else set())
    if res.user_error and "max_num_logits=none" in res.user_error:
        res.user_error += (f" (the monolithic-logit rungs hold [token budget x vocab] logits: lower "
                           f"--max-num-batched-tokens (now {p.max_num_batched_tokens}) or raise --memory-budget)")
    res.give_up_if_empty(run_dir, fresh=not resume)
    points = aggregate_points(res.points)

    lt = abt.ladder_table(points, config["ladder"] + config["beyond"], ds_list)
    ct = abt.cache_table(points, config["cache_rows"], config["ladder"][0], ds_list) if crows else None
    reps = f", median [min–max] of {run.repeats} repeats" if run.repeats > 1 else ""
    cons.print_df(con, abt.ladder_display(lt), f"Ablation ladder (paper Fig. 8): output throughput of every rung, "
                  f"x vs Sparse-dLLM{reps}", abt.LADDER_FMT)
    if ct is not None and not ct.empty:
        cons.print_df(con, ct, "Full engine under each cache policy (same scheduler, budgets, arrivals)",
                      abt.CACHE_FMT)
    # The effective configs the workers built (after profiling): differences besides the switch?
    by_key = {(s.get("dataset"), s["system"]): s.get("engine_config") for s in points}
    checks = {}
    for ds in ds_list:
        got = [by_key.get((ds, variants[r.key].label)) for r in rungs + beyond + crows]
        checks[ds] = ab.check_ladder_configs(got, rungs + beyond + crows, reference=got[len(rungs) - 1])
        for pr in checks[ds]:
            con.print(f"config check ({ds}): {pr}", markup=False, highlight=False)
    plots = []
    if not lt["x_vs_baseline"].isna().all():
        plots.append(str(abt.plot_ablation(lt, run_dir / "plots" / "fig8_ablation.png")))
    if ct is not None and not ct.empty and not ct["x_vs_baseline"].isna().all():
        plots.append(str(abt.plot_cache_policies(ct, run_dir / "plots" / "cache_policies.png")))
    doc = {"run_id": run_dir.name, "run_dir": str(run_dir), "preset": p.to_dict(), "preset_line": p.describe(),
           "measurement": config["measurement"], "interrupted": res.interrupted, "failures": res.failures,
           "ladder": lt.to_dict(orient="records"), "cache_rows": [] if ct is None else ct.to_dict(orient="records"),
           "config_checks": checks, "plots": plots, "repeats": run.repeats, "points": points,
           "repeat_points": res.points}
    results.atomic_write_json(run_dir / "ablation.json", {k: v for k, v in doc.items()
                                                         if k not in ("points", "repeat_points")})
    con.print(f"plots: {', '.join(plots) or 'none'}", markup=False, highlight=False)
    return res.finish(con, run_dir, doc, as_json, resumable=True)
