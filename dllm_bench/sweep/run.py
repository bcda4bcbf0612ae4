"""One `dllm-bench sweep --vary input-len|output-len` run (docs/ABLATE.md): a fixed-length
`random` workload per planned length (dllm_bench.sweep.lengths.plan_sweep), every system on each
through the point loop (dllm_bench.serve.points.measure_points), then the Fig. 7 table and plot.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dllm_bench import console as cons
from dllm_bench import results
from dllm_bench.ablate.ladder import ABLATION_PROMPTS
from dllm_bench.checkpoints.load import load_shape
from dllm_bench.errors import UserError
from dllm_bench.repeats import aggregate_points, repeat_seeds
from dllm_bench.serve.options import ServeOptions, check_counts, check_gen_length, resolve_run
from dllm_bench.serve.points import PlannedPoint, measure_points, record_repeats, resume_id
from dllm_bench.serve.presets import preset_for
from dllm_bench.serve.workload import shape_of
from dllm_bench.sweep import lengths as sw
from dllm_bench.sweep.schedulers import with_schedulers
from dllm_bench.systems.families import supports
from dllm_bench.systems.spec import parse_systems
from workloads.serving import describe


def sweep(opts: ServeOptions, *, vary: str, points: str | None, fixed_len: int | None, result_dir: Path | None,
          run_id: str | None, resume: bool, as_json: bool, schedulers: str | None = None) -> int:
    """Every (length, system) point measured, tabulated and plotted; returns the exit code.
    `opts`: the serving options sweep exposes (its rate defaults to inf: saturation); its
    --gen-length is the fixed output length of an input-length sweep; `schedulers`: --scheduler
    (dllm_bench.sweep.schedulers)."""
    vary = sw.parse_vary(vary)
    seed, num_prompts, gen_length = opts.seed, opts.num_prompts, opts.gen_length
    check_counts(num_prompts, seed, opts.repeats)
    # A checkpoint dir on a CUDA device takes the GPU preset, as in serve (preset_for).
    sp = preset_for(opts.preset, opts.model, device=opts.device or "auto")
    if gen_length is not None:  # one output length for every request: the fixed side of an input sweep
        check_gen_length(gen_length, sp.block_length)
        if vary == "output-len":
            raise UserError("--gen-length fixes the output length that --vary output-len sweeps (use --points)")
        if fixed_len is not None and fixed_len != gen_length:
            raise UserError(f"--gen-length {gen_length} and --fixed-len {fixed_len} both set the output length")
        fixed_len = gen_length
    plan = sw.plan_sweep(vary, length_scale=sp.length_scale, block_length=sp.block_length, device=sp.device,
                         points=points, fixed=fixed_len)
    n = num_prompts if num_prompts is not None else ABLATION_PROMPTS.get(sp.name, sp.num_prompts)
    # The preset is pinned to the one the lengths were planned with;
    # the point workloads carry their own lengths, so gen_length is theirs, not the run's.
    systems = parse_systems(with_schedulers(opts.systems or sw.DEFAULT_SYSTEMS, schedulers))
    # A default system with no version for the model's family (systems.families) stays a column,
    # unmeasured (ratios vs it: n/a); one named in --systems is refused by resolve_run.
    family = load_shape(sp.model).model_type
    off = [] if opts.systems else [v for v in systems if not supports(v.name, family)]
    run = resolve_run(replace(opts, systems=",".join(v.label for v in systems if v not in off), dataset="random",
                              num_prompts=n, preset=sp.name, gen_length=None))
    if len(run.rps) != 1:
        raise UserError("--rps takes one rate for sweep (inf = saturation, the default)")
    rate = run.rps[0]
    run.preset = replace(run.preset, dataset="random", num_prompts=n)  # describe() tells what ran
    p = run.preset
    reference = sw.reference_label(run.systems + off)
    mml = p.max_model_len or run.model_info["max_sequence_length"]
    too_long = [pt for pt in plan.points if pt[0] + pt[1] > mml]
    if too_long:
        raise UserError(f"sweep points {too_long} exceed the model's {mml} tokens")
    workloads = {plan.label(pt): sw.point_workload(run, pt, n, rate, seed) for pt in plan.points}
    run.workloads = {(lab, rate): wl for lab, wl in workloads.items()}
    labels = [v.label for v in run.systems + off]
    config = {
        **run.describe(), "vary": vary, "plan": plan.to_dict(), "systems": [v.to_dict() for v in run.systems],
        "systems_labels": labels, "reference": reference, "rps": rate, "num_prompts": n,
        "throughput_metric": sw.THROUGHPUT, "measurement": run.measurement(rate),
        "workloads": {lab: describe(wl) for lab, wl in workloads.items()},
        "repeats": run.repeats, "repeat_seeds": repeat_seeds(seed, run.repeats),
        "fingerprint": {**run.fingerprint(), "plan": plan.to_dict(), "systems": labels},
    }
    root = results.results_root(result_dir)
    if resume:
        run_id = resume_id("sweep", config["fingerprint"], root, run_id)
    run_dir = results.create_run("sweep", config, name=f"sweep-{vary}-{Path(str(p.model)).name}",
                                 run_id=run_id, root=root, resume=resume)
    if resume:
        record_repeats(run_dir, seed, run.repeats)
    con = cons.console()
    con.print(f"[bold]dllm-bench sweep --vary {vary}[/bold] → {run_dir}", highlight=False)
    con.print(p.describe(), markup=False, highlight=False)
    con.print(f"{plan.rule}; points {plan.values}; {n} prompts per point; {config['measurement']}; "
              f"systems {', '.join(labels)} (ratios vs {reference})"
              + "".join(f"; {v.label} not measured: it has no {family} version" for v in off),
              markup=False, highlight=False)

    planned = []
    for rep, rep_seed in enumerate(repeat_seeds(seed, run.repeats)):  # repeat-major: a whole sweep first
        wls = workloads if rep == 0 else {plan.label(pt): sw.point_workload(run, pt, n, rate, rep_seed)
                                          for pt in plan.points}
        for pt, paper in zip(plan.points, plan.paper_points, strict=True):
            lab = plan.label(pt)
            wl = wls[lab]
            shape = shape_of(wl, p.block_length)  # a baseline's static batch: max fit for THIS point
            planned += [PlannedPoint(lab, rate, v, wl, shape, {"sweep_vary": vary, "sweep_input_len": pt[0],
                                                               "sweep_output_len": pt[1], "paper_len": paper},
                                     repeat=rep, seed=rep_seed)
                        for v in run.systems]
    res = measure_points(run, planned, run_dir, con, done=results.finished_points(run_dir) if resume else set())
    res.give_up_if_empty(run_dir, fresh=not resume)
    points = aggregate_points(res.points)
    df = sw.sweep_table(points, plan, labels, reference)
    reps = f", median [min–max] of {run.repeats} repeats" if run.repeats > 1 else ""
    shown = sw.sweep_display(df, labels, reference)
    cons.print_df(con, shown, f"Sensitivity ({vary}): output throughput and x vs {reference} (paper Fig. 7){reps}",
                  sw.table_formats(shown))
    plots = []
    if any(c.startswith("x ") and df[c].notna().any() for c in df.columns):
        plots.append(str(sw.plot_fig7(df, plan, run_dir / "plots" / f"fig7_{vary}.png", reference)))
    doc = {"run_id": run_dir.name, "run_dir": str(run_dir), "vary": vary, "plan": plan.to_dict(),
           "reference": reference, "preset": p.to_dict(), "measurement": config["measurement"],
           "interrupted": res.interrupted, "failures": res.failures, "table": df.to_dict(orient="records"),
           "plots": plots, "repeats": run.repeats, "points": points, "repeat_points": res.points}
    results.atomic_write_json(run_dir / "sweep.json", {k: v for k, v in doc.items()
                                                      if k not in ("points", "repeat_points")})
    con.print(f"plots: {', '.join(plots) or 'none'}", markup=False, highlight=False)
    return res.finish(con, run_dir, doc, as_json, resumable=True)
