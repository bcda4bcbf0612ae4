"""The scheduler comparison of docs/SCHEDULER.md from finished `serve` / `simulate` runs: one
table per (hardware, preset, token budget), one row per (dataset, rate, system): the reference
system's (the paper's phase scheduler, `engine`) steps, stalls, throughput, mean and p99 E2E
latency beside the other system's stalls and planned waits and its change in throughput and
latency (`Δ`, relative). Repeated points: median [min–max] over the repeats.

    python benchmarks/scheduler_table.py results/runs/RUN [RUN ...] [--reference engine]

Columns: `stalled steps` = steps that left a running request out because its step did not fit
the token budget (and `stalled req-steps` how many request-steps that cost); `planned waits` =
request-steps a running request sat out because its look-ahead plan placed its next step later
(the deliberate staggering); `steps` = forwards run.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from dllm_bench import results
from dllm_bench.console import md_table

METRICS = {"tok/s": ("output_throughput", 1.0), "mean E2EL s": ("mean_e2el_ms", 1e-3),
           "p99 E2EL s": ("p99_e2el_ms", 1e-3)}
COUNTS = {"stalled steps": "stalled_steps", "stalled req-steps": "stalled_requests",
          "planned waits": "deferred_requests", "steps": "steps"}


def _machine(run_dir: Path) -> str:
    cfg = results.load_config(run_dir)["config"]
    hw = cfg.get("hardware")
    return f"{hw['name']} (simulated)" if isinstance(hw, dict) else "this CPU (measured)"


def point_rows(run_dirs: list[Path]) -> pd.DataFrame:
    rows = []
    for d in run_dirs:
        machine, preset = _machine(d), results.load_config(d)["config"].get("preset", {}).get("name", "")
        for p in results.load_points(d):
            if p.get("system_name") not in (None, "engine") or p.get("interrupted"):
                continue
            st = p.get("stats") or {}
            tokens = (p.get("engine_config") or {}).get("max_num_batched_tokens")
            rows.append({"machine": machine, "preset": preset, "token budget": tokens, "dataset": p["dataset"], "rps": p["rps"],
                         "system": p["system"], **{k: (p.get(m) or 0) * s for k, (m, s) in METRICS.items()},
                         **{k: st.get(c, 0) for k, c in COUNTS.items()}})
    return pd.DataFrame(rows)


def _cell(v: pd.Series, fmt: str) -> str:
    med = fmt.format(v.median())
    return med if len(v) == 1 or v.min() == v.max() else f"{med} [{fmt.format(v.min())}–{fmt.format(v.max())}]"


def _delta(s: pd.Series, r: pd.Series) -> str:
    return f"{100 * (s.median() / r.median() - 1):+.2f}%" if len(r) and r.median() else "-"


def tables(df: pd.DataFrame, reference: str) -> dict[str, pd.DataFrame]:
    """Per setting (machine, preset, token budget): one row per (dataset, rate, system other than
    the reference), the reference's figures beside that system's and the change."""
    out: dict[str, pd.DataFrame] = {}
    for (machine, preset, tokens), g in df.groupby(["machine", "preset", "token budget"], sort=False):
        rows = []
        for (ds, rps), h in g.groupby(["dataset", "rps"], sort=True):
            ref = h[h["system"] == reference]
            for system, s in h[h["system"] != reference].groupby("system", sort=False):
                rows.append({
                    "dataset": ds, "rps": rps, "system": system, "repeats": len(s),
                    "steps": _cell(ref["steps"], "{:.0f}"),
                    "stalled steps (ref)": _cell(ref["stalled steps"], "{:.0f}"),
                    "stalled req-steps (ref)": _cell(ref["stalled req-steps"], "{:.0f}"),
                    "stalled steps": _cell(s["stalled steps"], "{:.0f}"),
                    "planned waits": _cell(s["planned waits"], "{:.0f}"),
                    **{f"{k} (ref)": _cell(ref[k], "{:.4g}") for k in METRICS},
                    **{f"Δ {k}": _delta(s[k], ref[k]) for k in METRICS}, "Δ steps": _delta(s["steps"], ref["steps"])})
        t = pd.DataFrame(rows)
        others = list(t["system"].unique()) if len(t) else []
        if len(others) == 1:                     # one system against the reference: name it once
            t = t.drop(columns="system")
        if len(t) and (t["repeats"] == 1).all():
            t = t.drop(columns="repeats")
        out[f"{machine}, preset {preset}, token budget {tokens}: {reference} (ref) vs {', '.join(others)}"] = t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--reference", default="engine", help="the system the deltas are taken against")
    args = ap.parse_args()
    df = point_rows(args.runs)
    if df.empty:
        raise SystemExit("error: no finished engine points in those runs")
    for title, t in tables(df, args.reference).items():
        print(f"\n{title}\n\n{md_table(t)}")


if __name__ == "__main__":
    main()
