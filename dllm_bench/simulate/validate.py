"""Simulated vs measured: the error of each (dataset, system, rps) cell against the median of
the measured repeats (serve runs of the same workload), with the repeats' spread beside it so
an error can be read against the measurement's own noise."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from dllm_bench.results import metrics_frame

METRICS = {"output_throughput": ("tok/s", 0.10), "mean_e2el_ms": ("mean E2E", 0.10), "p99_e2el_ms": ("p99 E2E", 0.15)}


def compare(sim_dir: Path, measured_dirs: Sequence[Path]) -> pd.DataFrame:
    """One row per (dataset, system, rps): simulated value, measured median and min-max spread,
    signed relative error and whether it meets its goal (10 % throughput and mean, 15 % p99)."""

    sim = metrics_frame(sim_dir)
    meas = pd.concat([metrics_frame(d).assign(repeat=i) for i, d in enumerate(measured_dirs)], ignore_index=True)
    keys = ["dataset", "system", "rps"]
    rows = []
    for key, g in meas.groupby(keys, sort=False):
        s = sim[(sim["dataset"] == key[0]) & (sim["system"] == key[1]) & (sim["rps"] == key[2])]
        if s.empty:
            continue
        row = dict(zip(keys, key, strict=True), repeats=len(g))
        for m, (_, goal) in METRICS.items():
            med, v = float(g[m].median()), float(s[m].iloc[0])
            row[f"{m}_sim"], row[f"{m}_meas"] = v, med
            row[f"{m}_spread"] = (float(g[m].max()) - float(g[m].min())) / med if med else None
            row[f"{m}_err"] = (v - med) / med if med else None
            row[f"{m}_ok"] = row[f"{m}_err"] is not None and abs(row[f"{m}_err"]) <= goal
        rows.append(row)
    return pd.DataFrame(rows)


def as_markdown(df: pd.DataFrame) -> str:
    """The table docs/SIMULATE.md shows: measured median (spread), simulated, error per metric."""
    lines = ["| system | rps | " + " | ".join(f"{n} meas (spread) | sim | err" for n, _ in METRICS.values()) + " |",
             "|---|---|" + "---|---|---|" * len(METRICS)]
    for _, r in df.iterrows():
        cells = []
        for m in METRICS:
            scale = 1e-3 if m.endswith("_ms") else 1.0
            cells.append(f"{r[m + '_meas'] * scale:.3g} (±{r[m + '_spread'] / 2:.0%}) | {r[m + '_sim'] * scale:.3g} | "
                         f"{r[m + '_err']:+.0%}{'' if r[m + '_ok'] else ' ✗'}")
        lines.append(f"| {r['system']} | {r['rps']:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
