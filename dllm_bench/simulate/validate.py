"""Simulated vs measured (`dllm-bench simulate --validate RUNS`): for each (dataset, system, rps)
cell, the simulated value against the measured repeats (serve runs of the same workload, or the
repeats inside one run): the median, the repeats' min–max (dllm_bench.repeats.Spread), the signed
error against the median, whether the error meets its goal, and whether the simulated value lies
inside the measured min–max, i.e. within the measurement's own noise, where the error says more
about the machine than about the simulator.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.errors import UserError
from dllm_bench.repeats import Spread
from dllm_bench.simulate.fit import measured

# metric -> (table name, goal as a relative error), issue #13's goals.
METRICS = {"output_throughput": ("tok/s", 0.10), "mean_e2el_ms": ("mean E2E s", 0.10),
           "p99_e2el_ms": ("p99 E2E s", 0.15)}
KEYS = ["dataset", "system", "rps"]
GOAL, NOISE, MISSED = "goal", "within noise", "missed"


def measured_runs(values: Sequence[str], result_dir: Path | None, flag: str = "--validate") -> list[Path]:
    """`--validate` (or `--fit`) run ids (under the runs root) or run directories: finished,
    measured runs."""
    root = results.results_root(result_dir)
    out = []
    if not values:
        raise UserError(f"{flag} needs at least one measured run")
    for v in values:
        p = Path(v)
        d = p if p.is_dir() else root / v
        if not d.is_dir():
            raise UserError(f"{flag}: no run {v!r} (neither a directory nor a run id under {root})")
        points = results.load_points(d)
        if not points:
            raise UserError(f"{flag}: {d} has no finished points")
        if all(measured.foreign(s) for s in points):
            raise UserError(f"{flag}: {d} has no point a simulation can reproduce: each is {measured.foreign(points[0])}")
        if results.load_config(d).get("config", {}).get("simulated"):
            raise UserError(f"{flag}: {d} is a simulated run; give measured serve runs")
        out.append(d)
    return out


def check_cells(measured_dirs: Sequence[Path], datasets: Sequence[str], labels: Sequence[str],
                rps: Sequence[float]) -> None:
    """Refuse, before anything is simulated, a validation none of whose measured (dataset, system,
    rps) cells the simulation plans."""
    meas = measured_frame(measured_dirs)
    have = {(str(d), str(s), float(r)) for d, s, r in meas[KEYS].itertuples(index=False)}
    if not have & {(d, s, float(r)) for d in datasets for s in labels for r in rps}:
        cells = ", ".join(f"{d}/{s}@{results.fmt_rps(r)}" for d, s, r in sorted(have)[:6])
        raise UserError(f"--validate: no (dataset, system, rps) cell of the measured runs ({cells}) would be "
                        "simulated; give the same --dataset, --systems, --rps and --preset as those runs")


def compare(sim_dir: Path, measured_dirs: Sequence[Path], at_speed: pd.DataFrame | None = None,
            meas: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per cell measured and simulated: `repeats` (measured rows compared), `seeds`
    (workload seeds both sides ran), and per metric `<m>_sim` (median over the seeds),
    `<m>_meas` (median), `<m>_min`, `<m>_max`, `<m>_err` (sim / median - 1), `<m>_status` (goal |
    within noise | missed: the goal is checked first; "within noise" needs >= 2 repeats), and,
    with >= 2 seeds, `<m>_err_lo`/`_hi`: the range of the per-seed errors (same workload on both
    sides: the simulator's error without the workloads' spread). Repeats of serve use other
    workload seeds, so cells are paired by seed wherever both sides record it.

    `at_speed` (dllm_bench.simulate.run: each measured point simulated again with every cost
    scaled by the machine's speed during that point, read off the speed gauge) adds `speed` (the
    cell's median measured gauge / the calibration's: > 1 means the machine ran slower than when
    it was calibrated) and per metric `<m>_err_at_speed` / `<m>_status_at_speed`. `meas`: the
    measured runs' `measured_frame` when the caller has read it already."""
    meas = measured_frame(measured_dirs) if meas is None else meas
    df = compare_frames(results.metrics_frame(sim_dir), meas)
    if at_speed is None or at_speed.empty or df.empty:
        return df
    fast = compare_frames(at_speed, meas)
    if fast.empty:
        return df
    cols = {f"{m}_{k}": f"{m}_{k}_at_speed" for m in METRICS for k in ("err", "status")}
    fast = fast[[*KEYS, *cols]].rename(columns=cols)
    speed = at_speed.groupby(KEYS, as_index=False)["speed"].median()
    return df.merge(fast.merge(speed, on=KEYS, how="left"), on=KEYS, how="left")


def measured_frame(measured_dirs: Sequence[Path]) -> pd.DataFrame:
    return pd.concat([results.metrics_frame(d) for d in measured_dirs], ignore_index=True)


def compare_frames(sim: pd.DataFrame, meas: pd.DataFrame) -> pd.DataFrame:
    """`compare` on metrics frames (one row per point and repeat on each side)."""
    seeded = "workload_seed" in sim.columns and "workload_seed" in meas.columns
    rows = []
    for key, g in meas.groupby(KEYS, sort=True):
        s = sim[(sim["dataset"] == key[0]) & (sim["system"] == key[1]) & (sim["rps"] == key[2])]
        if s.empty:
            continue
        seeds: list = []
        if seeded:
            seeds = sorted(set(s["workload_seed"].dropna()) & set(g["workload_seed"].dropna()))
            if seeds:
                s, g = s[s["workload_seed"].isin(seeds)], g[g["workload_seed"].isin(seeds)]
        row = dict(zip(KEYS, key, strict=True), repeats=len(g), seeds=len(seeds))
        for m, (_, goal) in METRICS.items():
            sp = Spread.of(g[m]) if m in g else Spread.of([])
            vals = s[m].dropna() if m in s else pd.Series(dtype=float)
            v = float(vals.median()) if len(vals) else math.nan
            err = v / sp.median - 1 if sp.n and sp.median and not math.isnan(v) else math.nan
            row.update({f"{m}_sim": v, f"{m}_meas": sp.median, f"{m}_min": sp.lo, f"{m}_max": sp.hi,
                        f"{m}_err": err, f"{m}_status": _status(err, goal, v, sp)})
            if len(seeds) >= 2 and m in s and m in g:
                per = (s.groupby("workload_seed")[m].median() / g.groupby("workload_seed")[m].median() - 1).dropna()
                row.update({f"{m}_err_lo": float(per.min()), f"{m}_err_hi": float(per.max())})
        rows.append(row)
    return pd.DataFrame(rows)


def reproducibility(runs: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The measurement's own floor: every measured run's median taken as the "prediction" of every
    other run's, over the cells and workload seeds both ran (`compare_frames` rows with `source` and
    `target`, the runs' positions). A goal that one measurement of the same workloads misses against
    another is not a goal the simulator can be held to on that machine. Runs without workload seeds
    in common are not compared: other seeds are other workloads."""
    rows = [compare_frames(runs[i], runs[j]).assign(source=i, target=j)
            for i, j in itertools.permutations(range(len(runs)), 2)]
    rows = [df[df["seeds"] > 0] for df in rows if not df.empty]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def _status(err: float, goal: float, v: float, sp: Spread) -> str | None:
    if math.isnan(err):
        return None
    if abs(err) <= goal:
        return GOAL
    return NOISE if sp.n >= 2 and sp.lo <= v <= sp.hi else MISSED


def counts(df: pd.DataFrame, suffix: str = "") -> dict[str, dict[str, int]]:
    """Per metric: cells within the goal, within measurement noise (goal missed), missed;
    `suffix="_at_speed"` counts the comparison at the calibration's machine speed."""
    col = f"{{}}_status{suffix}"
    return {name: {st: int((df[col.format(m)] == st).sum()) if col.format(m) in df else 0 for st in (GOAL, NOISE, MISSED)}
            for m, (name, _) in METRICS.items()}


def shares(df: pd.DataFrame) -> list[str]:
    """Per metric, "goal / noise / missed" as shares of the cells: to set comparisons of different
    sizes side by side."""
    out = []
    for c in counts(df).values():
        n = sum(c.values()) or 1
        out.append(" / ".join(f"{100 * c[k] / n:.0f} %" for k in (GOAL, NOISE, MISSED)))
    return out


def _tally(c: dict[str, dict[str, int]]) -> str:
    return "; ".join(f"{name}: {x[GOAL]} within the goal, {x[NOISE]} within measurement noise, {x[MISSED]} missed"
                     for name, x in c.items())


def as_markdown(df: pd.DataFrame, floor: pd.DataFrame | None = None) -> str:
    """The table docs/SIMULATE.md shows: per metric the measured median (min–max over the
    repeats), the simulated value and its error, marked ✓ (goal met), ≈ (inside the measured
    min–max: within measurement noise) or ✗ (missed); with a `reproducibility` frame, the
    simulator's shares beside the measured runs' against each other."""
    mark = {GOAL: " ✓", NOISE: " ≈", MISSED: " ✗", None: ""}
    head = "| dataset | system | rps | n | " + " | ".join(f"{n} meas (min–max) | sim | err" for n, _ in METRICS.values())
    lines = [head + " |", "|---|---|---|---|" + "---|---|---|" * len(METRICS)]
    for _, r in df.iterrows():
        cells = []
        for m in METRICS:
            k = 1e-3 if m.endswith("_ms") else 1.0
            meas = f"{r[m + '_meas'] * k:.3g} ({r[m + '_min'] * k:.3g}–{r[m + '_max'] * k:.3g})"
            err = "–" if math.isnan(r[m + "_err"]) else f"{r[m + '_err']:+.0%}"
            if pd.notna(r.get(m + "_err_lo", math.nan)):
                err += f" [{r[m + '_err_lo']:+.0%}…{r[m + '_err_hi']:+.0%}]"
            cells.append(f"{meas} | {r[m + '_sim'] * k:.3g} | {err}{mark[r[m + '_status']]}")
        lines.append(f"| {r['dataset']} | {r['system']} | {results.fmt_rps(float(r['rps']))} | {r['repeats']} | "
                     + " | ".join(cells) + " |")
    legend = ("✓ within the goal (throughput and mean E2E 10 %, p99 15 %); ≈ goal missed but the simulated value "
              "lies inside the measured min–max (within measurement noise); ✗ missed; [lo…hi] the per-seed "
              "errors when both sides ran several workload seeds")
    text = "\n".join(lines) + f"\n\n{len(df)} cells. {_tally(counts(df))}.\n\n{legend}.\n"
    return text + _at_speed_markdown(df, mark) + _floor_markdown(df, floor)


def _floor_markdown(df: pd.DataFrame, floor: pd.DataFrame | None) -> str:
    if floor is None or floor.empty:
        return ""
    names = " | ".join(n for n, _ in METRICS.values())
    runs = len(set(floor["source"]) | set(floor["target"]))
    return (f"\n### The measured runs against each other\n\n{runs} measured runs ran the same workload seeds. "
            "Each run's median taken as the prediction of another's, over the same cells, is scored by the same "
            "rule: the floor the machine's own reproducibility sets (within the goal / within noise / missed):\n\n"
            f"| predictor | cells | {names} |\n|---|---:|" + "---|" * len(METRICS) + "\n"
            f"| simulator | {len(df)} | " + " | ".join(shares(df)) + " |\n"
            f"| measured → measured | {len(floor)} | " + " | ".join(shares(floor)) + " |\n")


def _at_speed_markdown(df: pd.DataFrame, mark: dict) -> str:
    """The same cells simulated at each measured point's machine speed (only when the measured
    points read the speed gauge)."""
    if "speed" not in df or df["speed"].isna().all():
        return ""
    lines = ["| dataset | system | rps | machine speed vs calibration | " + " | ".join(n for n, _ in METRICS.values()) + " |",
             "|---|---|---|---|" + "---|" * len(METRICS)]
    for _, r in df[df["speed"].notna()].iterrows():
        errs = [f"{r[m + '_err_at_speed']:+.0%}{mark[r[m + '_status_at_speed']]}"
                if pd.notna(r.get(m + "_err_at_speed", math.nan)) else "–" for m in METRICS]
        lines.append(f"| {r['dataset']} | {r['system']} | {results.fmt_rps(float(r['rps']))} | "
                     f"{1 / r['speed']:.2f}× | " + " | ".join(errs) + " |")
    return ("\n### At the machine's measured speed\n\nEach measured point read the calibration's speed gauge "
            "(one GEMM) before and after its replay; the speed column is the calibration's reading over the "
            "points' (> 1×: the machine ran faster than when it was calibrated). Errors of the same workloads "
            "simulated again with every cost scaled by each point's reading (first order: the gauge times one "
            "GEMM, the host work is scaled with it):\n\n" + "\n".join(lines)
            + f"\n\n{int(df['speed'].notna().sum())} cells. {_tally(counts(df, '_at_speed'))}.\n")


def write(sim_dir: Path, df: pd.DataFrame, measured_dirs: Sequence[Path], floor: pd.DataFrame | None = None,
          what: str = "") -> dict:
    """validation.csv and validation.md in the simulated run's directory; the JSON part. `what`:
    a line on what was simulated (the profile, its validation, each system's implementation)."""
    results.atomic_write_csv(sim_dir / "validation.csv", df)
    text = as_markdown(df, floor)
    runs = ", ".join(f"`{d.name}`" for d in measured_dirs)
    head = f"# Simulated `{sim_dir.name}` vs measured {runs}\n\n" + (f"{what}\n\n" if what else "")
    results.atomic_write_bytes(sim_dir / "validation.md", f"{head}{text}".encode())
    return {"measured_runs": [str(d) for d in measured_dirs], "counts": counts(df),
            "counts_at_measured_speed": counts(df, "_at_speed") if "speed" in df else None,
            "counts_measured_vs_measured": counts(floor) if floor is not None and not floor.empty else None,
            "cells": results._clean(df.to_dict(orient="records"))}
