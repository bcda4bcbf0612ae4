"""`make bench-validate-interleaved`: validation with a calibration shortly before every round.

The aim: the simulator's error on this CPU with the machine's state held as nearly constant as
the machine allows.

The user's flow (`calibrate`, then `serve`, then `simulate --validate`) measures the simulator
plus whatever the machine did between the calibration and the measurement; on this virtual
machine that is a change of state worth ~1.45x on a tiny request within minutes (docs/SIMULATE.md,
tiny section). Here each round is one workload seed at one rate: `calibrate` right before
`serve` of that point for every system, then `simulate` of the same point on that round's own
profile. The rounds' simulated and measured points are then compared as `--validate` compares
them (dllm_bench.simulate.validate, paired by workload seed), and, as the control, the same
measured rounds against one profile, the first round's: the user's flow on the same data.

With `--twin` every round serves its point a second time right after the first (`<round>-twin`),
and that second measurement is scored as a prediction of the first with the same rule: the
machine's short-term floor, a predictor as close in time to the measured round as the round's own
calibration, which knows the workload and the code exactly.

`--pause S` (default 30) leaves the machine idle for S seconds between a round's calibration and
its serve: on some machines the points served in the 10-15 s after the calibration's full load run
slower than the same points later (docs/SIMULATE.md, "A third machine").

Everything goes under one directory (`--result-dir`/`--id`): the profiles, the rounds' runs, and
validation.md / validation.csv for both comparisons.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
from cli_steps import run

from dllm_bench import inputs, results
from dllm_bench.simulate import hardware, validate

# The tiny section's calibration (docs/SIMULATE.md): more repeats and sizes than the default,
# since a tiny batch takes milliseconds.
TINY_CALIBRATE = "--repeats 7 --sizes 1,4,2,8,1,4"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--rps", default="4,32,12", help="rates, in the order the rounds take them")
    ap.add_argument("--systems", default="engine,llada,fast-dllm,dllm-cache,sparse-dllm")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=3, help="workload seeds 0..N-1 per rate")
    ap.add_argument("--calibrate-args", default=None,
                    help="extra `calibrate` options [tiny: the tiny section's '--repeats 7 --sizes 1,4,2,8,1,4'; "
                    "other presets: none]")
    ap.add_argument("--twin", action="store_true",
                    help="serve every round twice and score the second measurement against the first")
    ap.add_argument("--pause", type=float, default=30.0,
                    help="seconds of idle time between each round's calibration and its serve [30]")
    ap.add_argument("--id", default=f"interleaved-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    ap.add_argument("--result-dir", default=None)
    a = ap.parse_args()
    if a.pause < 0:
        ap.error(f"--pause must be >= 0, got {a.pause}")
    if a.calibrate_args is None:
        a.calibrate_args = TINY_CALIBRATE if a.preset == "tiny" else ""
    out = inputs.result_dir(a.result_dir) / a.id
    if out.exists():
        print(f"{out} exists: give another --id", file=sys.stderr)
        return 2
    rounds_dir = out / "rounds"
    logs = out / "logs"
    for d in (rounds_dir, logs):
        d.mkdir(parents=True, exist_ok=True)
    common = ["--preset", a.preset, "--systems", a.systems, "--num-prompts", str(a.num_prompts)]
    names = []
    t0 = time.perf_counter()
    rates = a.rps.split(",")
    for seed in range(a.seeds):
        for rps in rates:
            name = f"r{rps}-s{seed}"
            profile = out / f"{name}.json"
            point = ["--rps", rps, "--seed", str(seed), "--result-dir", str(rounds_dir)]
            run(["calibrate", "--preset", a.preset, "--systems", a.systems, "--name", name, "--out", str(profile),
                 *a.calibrate_args.split()], logs / f"{name}-calibrate.log")
            time.sleep(a.pause)
            run(["serve", *common, *point, "--run-id", name], logs / f"{name}-serve.log")
            if a.twin:
                run(["serve", *common, *point, "--run-id", f"{name}-twin"], logs / f"{name}-twin-serve.log")
            run(["simulate", *common, *point, "--hardware", str(profile), "--run-id", f"{name}-sim",
                 "--validate", name], logs / f"{name}-simulate.log")
            names.append(name)
            print(f"[{time.perf_counter() - t0:5.0f} s] round {name} done", file=sys.stderr, flush=True)

    sim_dirs = [rounds_dir / f"{n}-sim" for n in names]
    profiles = [out / f"{n}.json" for n in names]
    meas = validate.measured_frame([rounds_dir / n for n in names])
    interleaved = validate.compare_frames(pd.concat([results.metrics_frame(d) for d in sim_dirs], ignore_index=True), meas)
    control_dir = rounds_dir / "control-sim"
    run(["simulate", *common, "--rps", ",".join(rates), "--seed", "0", "--repeats", str(a.seeds),
         "--hardware", str(profiles[0]), "--result-dir", str(rounds_dir), "--run-id", control_dir.name],
        logs / "control-simulate.log")
    control = validate.compare_frames(results.metrics_frame(control_dir), meas)
    frames = [interleaved.assign(profile="per round"), control.assign(profile="first")]
    twin_text = ""
    if a.twin:
        twin = validate.compare_frames(validate.measured_frame([rounds_dir / f"{n}-twin" for n in names]), meas)
        frames.append(twin.assign(profile="twin"))
        twin_text = ("\n## The same rounds measured again right after them, as a prediction of the first "
                     "measurement\n\n" + validate.as_markdown(twin) + "\n" + _per_round_markdown(rounds_dir, names, a.systems.split(",")))
    text = (f"# Interleaved validation `{a.id}` ({a.preset})\n\n" + _rounds_markdown(profiles)
            + _round_errors_markdown(sim_dirs) +
            "## Each round simulated on the profile calibrated shortly before it\n\n" + validate.as_markdown(interleaved)
            + f"\n## Control: every round simulated on one profile (`{profiles[0].name}`)\n\n"
            + validate.as_markdown(control) + twin_text)
    results.atomic_write_csv(out / "validation.csv", pd.concat(frames))
    results.atomic_write_bytes(out / "validation.md", text.encode())
    print(text)
    print(f"{out} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


def _rounds_markdown(profiles: list[Path]) -> str:
    """Per round, what its calibration saw: the speed gauge of the state the profile describes and
    how late an idle sleep of 0.1 s returned, and each system's fitted host time per step and wake
    cost (the machine's state moves them)."""
    hws = [hardware.load(str(p)) for p in profiles]
    names = [k.split("/", 1)[1] for k in hws[0].host]
    lines = ["| round | GEMM gauge ms | sleep of 0.1 s late ms | " + " | ".join(f"{n} c_step / wake ms" for n in names)
             + " |", "|---|---|---|" + "---|" * len(names)]
    for p, hw in zip(profiles, hws, strict=True):
        g = validate.speed_reference(hw.fit)[0] * 1e3
        costs = [hw.host[f"{hw.impl}/{n}"] for n in names]
        steps = [f"{c.c_step * 1e3:.2f} / {c.wake_s * 1e3:.2f}" for c in costs]
        lines.append(f"| {p.stem} | {g:.4f} | {hw.overshoot(0.1) * 1e3:.2f} | " + " | ".join(steps) + " |")
    return "## Rounds: what each calibration saw\n\n" + "\n".join(lines) + "\n\n"


def _round_errors_markdown(sim_dirs: list[Path]) -> str:
    """Per round and system, the mean E2E error on the round's own profile and the point's machine
    speed by the gauge: errors that differ between the systems of one round are state changes
    within the round."""
    frames = [pd.read_csv(d / "validation.csv").assign(round=d.name.removesuffix("-sim")) for d in sim_dirs]
    df = pd.concat(frames, ignore_index=True)
    names = list(dict.fromkeys(df["system"]))
    lines = ["| round | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for rnd, g in df.groupby("round", sort=False):
        by = g.set_index("system")
        cells = [f"{by.at[n, 'mean_e2el_ms_err']:+.0%}" + (f" ({1 / by.at[n, 'speed']:.2f}×)"
                                                          if "speed" in by and pd.notna(by.at[n, "speed"]) else "")
                 if n in by.index else "–" for n in names]
        lines.append(f"| {rnd} | " + " | ".join(cells) + " |")
    return ("## Rounds: each system's mean E2E error on the round's own profile (machine speed vs the "
            "calibration by the gauge)\n\n" + "\n".join(lines) + "\n\n")


def _per_round_markdown(rounds_dir: Path, names: list[str], serve_order: list[str]) -> str:
    """Round by round (one workload seed, so no median over seeds smooths it), the simulation on the
    round's own profile and the round's second measurement, each against the first measurement."""
    rows = []
    for n in names:
        first = results.metrics_frame(rounds_dir / n).set_index("system")
        for kind, suffix in (("simulator", "-sim"), ("measured again", "-twin")):
            other = results.metrics_frame(rounds_dir / f"{n}{suffix}").set_index("system")
            for m in ("mean_e2el_ms", "p99_e2el_ms"):
                err = other[m] / first[m] - 1
                rows += [{"predictor": kind, "metric": m, "system": k, "err": e} for k, e in err.dropna().items()]
    df = pd.DataFrame(rows)
    lines = ["| metric | predictor | rounds × systems | median abs. error | 90th pct. abs. error | within the goal | "
             "mean error ± sd |", "|---|---|---:|---:|---:|---:|---|"]
    for (m, kind), g in df.groupby(["metric", "predictor"], sort=False):
        name, goal = validate.METRICS[m]
        a = g["err"].abs()
        lines.append(f"| {name} | {kind} | {len(g)} | {a.median():.1%} | {a.quantile(0.9):.1%} | "
                     f"{(a <= goal).mean():.0%} | {g['err'].mean():+.1%} ± {g['err'].std():.1%} |")
    # In serve's order: a machine still slow from the calibration's full load shows as errors that
    # shrink from the first system served to the last.
    mean = df[df["metric"] == "mean_e2el_ms"]
    order = [k for k in serve_order if k in set(mean["system"])]
    by = ["| system (serve's order) | simulator: median error | measured again: median error |", "|---|---:|---:|"]
    for k in order:
        med = mean[mean["system"] == k].groupby("predictor", sort=False)["err"].median()
        by.append(f"| {k} | {med.get('simulator', float('nan')):+.1%} | {med.get('measured again', float('nan')):+.1%} |")
    return ("### Round by round\n\n" + "\n".join(lines) + "\n\nMean E2E per system, over the rounds:\n\n"
            + "\n".join(by) + "\n")


if __name__ == "__main__":
    sys.exit(main())
