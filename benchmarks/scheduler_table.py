"""The scheduler comparison of docs/SCHEDULER.md from finished `serve` / `simulate` runs, cell by
cell (dllm_bench.report.scheduler): one table per setting (hardware, preset, token budget,
decoding), one row per (dataset, rate, system): the reference system's (the engine system that
runs the paper's phase scheduler, or --reference) steps, stalls, throughput, mean and p99 E2E
latency beside the other system's stalls and planned waits and its change (`Δ`, relative); then
the per-setting summary the doc's current results show (`dllm-bench report --docs` renders it).

    python benchmarks/scheduler_table.py results/runs/RUN [RUN ...] [--reference SYSTEM]

Columns: `stalled steps` = steps that left a running request out because its step did not fit
the token budget (`stalled req-steps`: how many request-steps that cost); `planned waits` =
request-steps a running request sat out because its look-ahead plan placed its next step later
(the deliberate staggering); `steps` = forwards run.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from dllm_bench.console import md_table
from dllm_bench.report import scheduler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--reference", default=None,
                    help="the system the changes are taken against (default: the one on the phase scheduler)")
    args = ap.parse_args()
    df = scheduler.point_rows(args.runs)
    if df.empty:
        raise SystemExit("error: no finished engine points in those runs")
    try:
        for title, t in scheduler.cell_tables(df, args.reference).items():
            print(f"\n{title}\n\n{md_table(t)}")
        print(f"\nper setting, over its cells\n\n{md_table(scheduler.summary(df))}")
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
