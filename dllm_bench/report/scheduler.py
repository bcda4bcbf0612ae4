"""The scheduler comparison of docs/SCHEDULER.md from finished `serve` / `simulate` runs: the
paper's phase scheduler (the reference: the engine system whose scheduler is `phase`) against
the other engine systems of the same runs, e.g. `scheduler=lookahead`. A setting is (machine,
preset, token budget, decoding). `cell_tables`: one row per (dataset, rate, system), the
reference's steps, stalls and latencies beside the other's stalls, planned waits and changes
(`benchmarks/scheduler_table.py` prints them). `summary`: one row per setting, over its cells
(the doc's current-results table). Repeats: median [min–max]; a change is of the medians.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.console import md_table
from engine.decoding import FIXED

METRICS = {"tok/s": ("output_throughput", 1.0), "mean E2EL s": ("mean_e2el_ms", 1e-3),
           "p99 E2EL s": ("p99_e2el_ms", 1e-3)}
COUNTS = {"stalled steps": "stalled_steps", "stalled req-steps": "stalled_requests",
          "planned waits": "deferred_requests", "steps": "steps"}
SETTING = ["machine", "preset", "token budget", "decoding"]
REFERENCE = "phase"


def _machine(cfg: dict) -> str:
    hw = cfg.get("hardware")
    return f"{hw['name']} (simulated)" if isinstance(hw, dict) else "this CPU (measured)"


def point_rows(run_dirs: list[Path]) -> pd.DataFrame:
    """Every finished engine point of the runs, one row each (other systems are not scheduled by
    the engine's schedulers)."""
    rows = []
    for d in run_dirs:
        cfg = results.load_config(d)["config"]
        machine, preset = _machine(cfg), (cfg.get("preset") or {}).get("name", "")
        for p in results.load_points(d):
            if p.get("system_name") not in (None, "engine") or p.get("interrupted"):
                continue
            st, ec = p.get("stats") or {}, p.get("engine_config") or {}
            rows.append({"machine": machine, "preset": preset, "token budget": ec.get("max_num_batched_tokens"),
                         "decoding": p.get("decoding") or FIXED, "dataset": p["dataset"], "rps": p["rps"],
                         "system": p["system"], "scheduler": ec.get("scheduler", REFERENCE),
                         **{k: (p.get(m) or 0) * s for k, (m, s) in METRICS.items()},
                         **{k: st.get(c, 0) for k, c in COUNTS.items()}})
    return pd.DataFrame(rows)


def _cell(v: pd.Series, fmt: str) -> str:
    med = fmt.format(v.median())
    return med if len(v) == 1 or v.min() == v.max() else f"{med} [{fmt.format(v.min())}–{fmt.format(v.max())}]"


def _change(s: pd.Series, r: pd.Series) -> float | None:
    return s.median() / r.median() - 1 if len(r) and r.median() else None


def _pct(v: float | None, space: str = "") -> str:
    # Rounded first, so a change that rounds to zero reads +0.00 whatever its sign.
    return "-" if v is None else f"{round(100 * v, 2) + 0.0:+.2f}{space}%"


def _pairs(df: pd.DataFrame, reference: str | None):
    """Per setting, (dataset, rate) and system other than the reference: (setting, dataset, rate,
    system, reference's points, that system's points). The reference is the system named, or the
    one engine system of the setting that runs the phase scheduler."""
    for setting, g in df.groupby(SETTING, sort=False, dropna=False):
        if reference is None:
            ref_systems = g.loc[g["scheduler"] == REFERENCE, "system"].unique()
            if len(ref_systems) != 1:
                raise ValueError(f"{setting}: {len(ref_systems)} systems run the {REFERENCE} scheduler, "
                                 "so none is the reference (pass one)")
            ref_name = ref_systems[0]
        else:
            ref_name = reference
        for (ds, rps), h in g.groupby(["dataset", "rps"], sort=True):
            ref = h[h["system"] == ref_name]
            for system, s in h[h["system"] != ref_name].groupby("system", sort=False):
                yield setting, ref_name, ds, rps, system, ref, s


def _title(setting: tuple, ref: str, others: list[str]) -> str:
    machine, preset, tokens, decoding = setting
    return f"{machine}, preset {preset}, token budget {tokens}, {decoding}: {ref} (ref) vs {', '.join(others)}"


def cell_tables(df: pd.DataFrame, reference: str | None = None) -> dict[str, pd.DataFrame]:
    """Per setting: one row per (dataset, rate, system other than the reference), the reference's
    figures beside that system's and the change."""
    rows: dict[tuple, list[dict]] = {}
    for setting, ref_name, ds, rps, system, ref, s in _pairs(df, reference):
        rows.setdefault((setting, ref_name), []).append({
            "dataset": ds, "rps": rps, "system": system, "repeats": len(s),
            "steps": _cell(ref["steps"], "{:.0f}"),
            "stalled steps (ref)": _cell(ref["stalled steps"], "{:.0f}"),
            "stalled req-steps (ref)": _cell(ref["stalled req-steps"], "{:.0f}"),
            "stalled steps": _cell(s["stalled steps"], "{:.0f}"),
            "planned waits": _cell(s["planned waits"], "{:.0f}"),
            **{f"{k} (ref)": _cell(ref[k], "{:.4g}") for k in METRICS},
            **{f"Δ {k}": _pct(_change(s[k], ref[k])) for k in METRICS}, "Δ steps": _pct(_change(s["steps"], ref["steps"]))})
    out = {}
    for (setting, ref_name), r in rows.items():
        t = pd.DataFrame(r)
        others = list(t["system"].unique())
        if len(others) == 1:                     # one system against the reference: name it once
            t = t.drop(columns="system")
        if (t["repeats"] == 1).all():
            t = t.drop(columns="repeats")
        out[_title(setting, ref_name, others)] = t
    return out


def _span(values: list[float | None]) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    lo, hi = _pct(min(v), " "), _pct(max(v), " ")
    return lo if lo == hi else f"{lo[:-2]} … {hi}"


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (setting, system other than the phase scheduler's), over the setting's cells:
    the reference's most stalled steps in a cell (and that cell's share of its steps), the other's
    most stalled steps and planned waits, and the range of its changes in latency and throughput."""
    cells: dict[tuple, list[dict]] = {}
    for setting, _ref, _ds, _rps, system, ref, s in _pairs(df, None):
        cells.setdefault((setting, system), []).append({
            "stalled": ref["stalled steps"].median(), "steps": ref["steps"].median(),
            "other stalled": s["stalled steps"].max(), "waits": s["planned waits"].max(),
            "scheduler": s["scheduler"].iloc[0],
            **{k: _change(s[k], ref[k]) for k in METRICS}})
    other = {x["scheduler"] for c in cells.values() for x in c}
    other = other.pop() if len(other) == 1 else "other"       # name the compared scheduler when there is one
    rows = []
    for ((machine, _preset, tokens, decoding), system), c in cells.items():
        top = max(c, key=lambda x: x["stalled"])
        share = top["stalled"] / top["steps"] if top["steps"] else 0.0
        rows.append({"setting": f"{machine.replace(' (simulated)', '')}, {tokens:,}, {decoding}", "system": system,
                     "cells": len(c),
                     f"{REFERENCE}: most stalled steps (share of the cell's steps)":
                         f"{top['stalled']:,.0f} ({100 * share:.2f} %)",
                     f"{other}: most stalled steps": f"{max(x['other stalled'] for x in c):,.0f}",
                     f"{other}: most planned waits": f"{max(x['waits'] for x in c):,.0f}",
                     "Δ mean E2EL": _span([x["mean E2EL s"] for x in c]), "Δ p99 E2EL": _span([x["p99 E2EL s"] for x in c]),
                     "Δ tok/s": _span([x["tok/s"] for x in c])})
    out = pd.DataFrame(rows)
    if len(out) and out["system"].nunique() == 1:
        out = out.drop(columns="system")
    return out


def summary_markdown(run_dirs: list[Path]) -> str:
    df = point_rows(run_dirs)
    if df.empty:
        raise ValueError("the runs have no finished engine points")
    return md_table(summary(df), as_text=True)


def scheduler_line(doc: dict) -> str:
    """One run's setting in a line: where it ran, the systems, the workload and the budgets."""
    cfg = doc.get("config") or {}
    hw = cfg.get("hardware")
    where = f"**simulated** on {hw.get('name')} ({cfg.get('validation_label', '?')})" if isinstance(hw, dict) else "measured"
    p, eng = cfg.get("preset") or {}, cfg.get("engine_defaults") or {}
    spb = (cfg.get("steps_per_block") or {}).get("source")
    systems = ", ".join(s["label"] for s in cfg.get("systems") or [])
    rates = ", ".join(f"{float(r):g}" for r in cfg.get("rps") or [])   # "inf" as JSON keeps it
    workload = f"{cfg.get('num_prompts', 0):,} requests per point on {', '.join(cfg.get('datasets') or [])} at {rates} req/s"
    engine = (f"preset {p.get('name', '?')}, {p.get('dtype', '?')}, {'CUDA graphs' if eng.get('cuda_graphs') else 'eager'}, "
              f"token budget {eng.get('max_num_batched_tokens', 0):,}, logit budget {eng.get('max_num_logits', 0):,}, "
              f"decoding {cfg.get('decoding', 'fixed')}"
              + (f" ({spb} steps per block)" if spb else ""))
    repeats = f"; {cfg['repeats']} repeats" if (cfg.get("repeats") or 1) > 1 else ""
    return f"{where}; {systems}; {engine}; {workload}{repeats}"
