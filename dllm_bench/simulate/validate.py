"""Simulated vs measured (`dllm-bench simulate --validate RUNS`): for each (dataset, system, rps)
cell, the simulated value against the measured repeats (serve runs of the same workload, or the
repeats inside one run): the median, the repeats' min–max (dllm_bench.repeats.Spread), the signed
error against the median, whether the error meets its goal, and whether the simulated value lies
inside the measured min–max, i.e. within the measurement's own noise, where the error says more
about the machine than about the simulator.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.errors import UserError
from dllm_bench.repeats import Spread

# metric -> (table name, goal as a relative error), issue #13's goals.
METRICS = {"output_throughput": ("tok/s", 0.10), "mean_e2el_ms": ("mean E2E s", 0.10),
           "p99_e2el_ms": ("p99 E2E s", 0.15)}
KEYS = ["dataset", "system", "rps"]
GOAL, NOISE, MISSED = "goal", "within noise", "missed"


def measured_runs(values: Sequence[str], result_dir: Path | None) -> list[Path]:
    """`--validate` run ids (under the runs root) or run directories: finished, measured runs."""
    root = results.results_root(result_dir)
    out = []
    for v in values:
        p = Path(v)
        d = p if p.is_dir() else root / v
        if not d.is_dir():
            raise UserError(f"--validate: no run {v!r} (neither a directory nor a run id under {root})")
        if not results.load_points(d):
            raise UserError(f"--validate: {d} has no finished points")
        if results.load_config(d).get("config", {}).get("simulated"):
            raise UserError(f"--validate: {d} is a simulated run; give measured serve runs")
        out.append(d)
    return out


def compare(sim_dir: Path, measured_dirs: Sequence[Path]) -> pd.DataFrame:
    """One row per cell measured and simulated: `repeats` (measured rows compared), `seeds`
    (workload seeds both sides ran), and per metric `<m>_sim` (median over the seeds),
    `<m>_meas` (median), `<m>_min`, `<m>_max`, `<m>_err` (sim / median - 1), `<m>_status` (goal |
    within noise | missed: the goal is checked first; "within noise" needs >= 2 repeats), and,
    with >= 2 seeds, `<m>_err_lo`/`_hi`: the range of the per-seed errors (same workload on both
    sides: the simulator's error without the workloads' spread). Repeats of serve use other
    workload seeds, so cells are paired by seed wherever both sides record it."""

    sim = results.metrics_frame(sim_dir)
    meas = pd.concat([results.metrics_frame(d) for d in measured_dirs], ignore_index=True)
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


def _status(err: float, goal: float, v: float, sp: Spread) -> str | None:
    if math.isnan(err):
        return None
    if abs(err) <= goal:
        return GOAL
    return NOISE if sp.n >= 2 and sp.lo <= v <= sp.hi else MISSED


def counts(df: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Per metric: cells within the goal, within measurement noise (goal missed), missed."""
    return {name: {st: int((df[f"{m}_status"] == st).sum()) if not df.empty else 0 for st in (GOAL, NOISE, MISSED)}
            for m, (name, _) in METRICS.items()}


def as_markdown(df: pd.DataFrame) -> str:
    """The table docs/SIMULATE.md shows: per metric the measured median (min–max over the
    repeats), the simulated value and its error, marked ✓ (goal met), ≈ (inside the measured
    min–max: within measurement noise) or ✗ (missed)."""
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
    tally = "; ".join(f"{name}: {c[GOAL]} within the goal, {c[NOISE]} within measurement noise, {c[MISSED]} missed"
                      for name, c in counts(df).items())
    legend = ("✓ within the goal (throughput and mean E2E 10 %, p99 15 %); ≈ goal missed but the simulated value "
              "lies inside the measured min–max (within measurement noise); ✗ missed; [lo…hi] the per-seed "
              "errors when both sides ran several workload seeds")
    return "\n".join(lines) + f"\n\n{len(df)} cells. {tally}.\n\n{legend}.\n"


def write(sim_dir: Path, df: pd.DataFrame, measured_dirs: Sequence[Path]) -> dict:
    """validation.csv and validation.md in the simulated run's directory; the JSON part."""
    results.atomic_write_csv(sim_dir / "validation.csv", df)
    text = as_markdown(df)
    runs = ", ".join(f"`{d.name}`" for d in measured_dirs)
    results.atomic_write_bytes(sim_dir / "validation.md",
                               f"# Simulated `{sim_dir.name}` vs measured {runs}\n\n{text}".encode())
    return {"measured_runs": [str(d) for d in measured_dirs], "counts": counts(df),
            "cells": results._clean(df.to_dict(orient="records"))}
