"""Checks of the paper replay beyond each cell's error: how much the verdict depends on the one
point the scalar is fitted on (leave-one-out over dLLM-Serve's four published throughputs), and
whether the simulated systems rank as the published ones do (Table 4, per dataset and scenario)."""
from __future__ import annotations

from itertools import combinations

import pandas as pd

from dllm_bench.simulate.hardware import load
from dllm_bench.simulate.paper.published import ENGINE_POINTS, TRACE, point_label
from dllm_bench.simulate.paper.setting import DEFAULT, Declared, fit_u, run, scaled, workload
from dllm_bench.simulate.paper.tables import rel_err

SHORT = {"dLLM-Serve": "Serve", "Fast-dLLM": "Fast", "Sparse-dLLM": "Sparse", "dLLM-Cache": "Cache"}


def holdout(declared: Declared = DEFAULT) -> pd.DataFrame:
    """One row per point the scalar is fitted on: u, and the throughput error at every other
    dLLM-Serve point predicted with it ("fit" in the fitted point's own column)."""
    wls = {ds: workload(ds, TRACE[ds], declared=declared) for ds in TRACE}
    rows = []
    for fit in ENGINE_POINTS:
        u = fit_u(declared, fit, wls[fit[1]])
        row: dict = {"fitted on": point_label(fit), "u": u}
        for (gpu, ds), pub in ENGINE_POINTS.items():
            row[point_label((gpu, ds))] = "fit" if (gpu, ds) == fit else rel_err(
                run(scaled(load(gpu), u), "engine", wls[ds])["output_throughput"], pub)
        rows.append(row)
    return pd.DataFrame(rows)


def holdout_summary(df: pd.DataFrame) -> str:
    errs = pd.to_numeric(df[[point_label(p) for p in ENGINE_POINTS]].stack(), errors="coerce").dropna()
    return (f"u {df.u.min():.3f}-{df.u.max():.3f} over the {len(df)} fits; held-out errors "
            f"{errs.min():+.0%} … {errs.max():+.0%}, within 10 %: {(errs.abs() <= 0.10).sum()} of {len(errs)}")


def _order(tputs: dict[str, float]) -> str:
    return " > ".join(SHORT[s] for s in sorted(tputs, key=lambda s: -tputs[s]))


def _cells(g: pd.DataFrame, scen: str) -> dict[str, pd.Series]:
    """Each system's row in scenario `scen`; a system without one (the engine; a baseline
    without a declared batch) contributes its own scenario, or batch 1."""
    cells = {}
    for system, sg in g.groupby("system", sort=False):
        own = sg.scenario == scen
        cells[system] = sg[own if own.any() else sg.scenario.isin(("batch 1", "engine"))].iloc[0]
    return cells


def ordering(t4: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and baseline scenario: the four systems ranked by throughput, published and
    simulated, and how many of the six pairs the simulation orders as the paper does."""
    rows = []
    for ds, g in t4.groupby("dataset", sort=False):
        for scen in (s for s in ("batch 1", "max-fit", "declared") if (g.scenario == s).any()):
            cells = _cells(g, scen)
            row = dict(dataset=ds, scenario=scen, paper=_order({s: c.tput_paper for s, c in cells.items()}),
                       simulated="a batch does not fit the memory", pairs=None)
            if not any(pd.isna(c.tput_sim) or c.get("fits") == "no" for c in cells.values()):   # "no": an OOM
                agree = sum((cells[a].tput_paper - cells[b].tput_paper) * (cells[a].tput_sim - cells[b].tput_sim) > 0
                            for a, b in combinations(cells, 2))
                row |= dict(simulated=_order({s: c.tput_sim for s, c in cells.items()}),
                            pairs=f"{agree}/{len(cells) * (len(cells) - 1) // 2}")
            rows.append(row)
    return pd.DataFrame(rows)
