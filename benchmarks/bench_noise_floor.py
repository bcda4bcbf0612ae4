"""The validation's noise floor: how well does one measurement on this machine predict another?

`simulate --validate` scores the simulator against a measured run with fixed goals (throughput and
mean E2E within 10 %, p99 within 15 %). On a machine whose speed wanders, even a perfect
predictor of the workload would miss some cells, so a miss says little until it is set beside
the measurement's own reproducibility. Given several passes of the same validation (each a
measured run and the simulated run of its own calibration, the same workloads), this scores,
with the same rule (dllm_bench.simulate.validate.compare_frames, paired by workload seed):

* simulator: each pass's simulation against its own measured run;
* measured → measured: every pass's measured run used as the "prediction" of every other pass's
  (ordered pairs); the best a predictor that knows the workload exactly can expect, if it
  predicts one measurement;
* leave-one-out: the median over all *other* passes' repeats as the prediction of one pass; a
  predictor with many measurements behind it.

Passes are given as MEASURED:SIMULATED, each side a run id or a glob of run ids under the runs
root (one pass may be several runs, e.g. the rounds of `bench_validate_interleaved`). It reads
finished runs and starts nothing. With `--id` it also writes floor.md, floor.csv and floor.png
(the error distributions, one panel per metric) under the runs root.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dllm_bench import inputs, results
from dllm_bench.simulate import validate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("passes", nargs="+", metavar="MEASURED:SIMULATED",
                    help="one validation pass: its measured run(s) and simulated run(s), ids or globs under the runs root")
    ap.add_argument("--result-dir", default=None, help="the runs root [results/runs]")
    ap.add_argument("--id", default=None, help="also write floor.md/.csv/.png under the runs root in this directory")
    a = ap.parse_args()
    root = results.results_root(a.result_dir)
    try:
        passes = [_pass(spec, root) for spec in a.passes]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if len({n for n, *_ in passes}) < len(passes):
        print("error: a measured side is given twice", file=sys.stderr)
        return 2
    if len(passes) < 2:
        print("error: give at least two passes (the floor compares measurements with each other)", file=sys.stderr)
        return 2
    out = None
    if a.id:
        out = inputs.result_dir(a.result_dir) / a.id
        if out.exists():
            print(f"{out} exists: give another --id", file=sys.stderr)
            return 2

    try:
        cells = pd.concat(_scored(passes), ignore_index=True)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = _markdown(cells, passes)
    print(text)
    if out is not None:
        out.mkdir(parents=True)
        results.atomic_write_csv(out / "floor.csv", cells)
        results.atomic_write_bytes(out / "floor.md", text.encode())
        _plot(cells, out / "floor.png")
        print(f"{out}", file=sys.stderr)
    return 0


def _pass(spec: str, root: Path) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """(name, measured frame, simulated frame) of one MEASURED:SIMULATED argument."""
    if spec.count(":") != 1:
        raise ValueError(f"{spec!r}: expected MEASURED:SIMULATED")
    meas, sim = (_runs(side, root) for side in spec.split(":"))
    if any(results.load_config(d).get("config", {}).get("simulated") for d in meas):
        raise ValueError(f"{spec!r}: the measured side holds a simulated run")
    if not all(results.load_config(d).get("config", {}).get("simulated") for d in sim):
        raise ValueError(f"{spec!r}: the simulated side holds a measured run")
    return spec.split(":")[0], validate.measured_frame(meas), validate.measured_frame(sim)


def _runs(pattern: str, root: Path) -> list[Path]:
    found = sorted(d for d in root.glob(pattern) if d.is_dir() and results.load_points(d))
    if not found:
        raise ValueError(f"no finished run matches {pattern!r} under {root}")
    return found


def _scored(passes: list[tuple[str, pd.DataFrame, pd.DataFrame]]) -> list[pd.DataFrame]:
    """Every comparison as validate's cell rows, tagged with the predictor and the pass predicted."""
    out = [validate.compare_frames(sim, meas).assign(predictor="simulator", target=name)
           for name, meas, sim in passes]
    names = [n for n, *_ in passes]
    floor = validate.reproducibility([m for _, m, _ in passes])
    if floor.empty:
        raise ValueError("the passes' measured runs share no cell (dataset, system, rate) at the same workload seed")
    out.append(floor.assign(predictor="measured → measured", source=floor["source"].map(names.__getitem__),
                            target=floor["target"].map(names.__getitem__)))
    for name, meas, _ in passes:
        others = pd.concat([m for n, m, _ in passes if n != name], ignore_index=True)
        out.append(validate.compare_frames(others, meas).assign(predictor="leave-one-out", target=name))
    return out


def _markdown(cells: pd.DataFrame, passes: list) -> str:
    names = [n for n, *_ in passes]
    head = "| predictor | cells | " + " | ".join(f"{n} within goal / noise / missed" for n, _ in validate.METRICS.values()) + " |"
    lines = [head, "|---|---:|" + "---|" * len(validate.METRICS)]
    for pred, g in cells.groupby("predictor", sort=False):
        lines.append(f"| {pred} | {len(g)} | " + " | ".join(validate.shares(g)) + " |")
    text = (f"# Noise floor of the validation: {len(passes)} passes ({', '.join(f'`{n}`' for n in names)})\n\n"
            "Share of cells within the goal (throughput and mean E2E 10 %, p99 15 %) / missed but inside the "
            "measured min–max / missed, for the simulator and for measurements predicting each other.\n\n"
            + "\n".join(lines) + "\n\n")
    per = ["| system | " + " | ".join(f"{n}: simulator | measured → measured" for n, _ in validate.METRICS.values()) + " |",
           "|---|" + "---|---|" * len(validate.METRICS)]
    for system, g in cells.groupby("system", sort=True):
        row = []
        for m in validate.METRICS:
            for pred in ("simulator", "measured → measured"):
                e = g.loc[g["predictor"] == pred, f"{m}_err"].dropna()
                row.append(f"{e.mean():+.1%} ± {e.std():.1%}")
        per.append(f"| {system} | " + " | ".join(row) + " |")
    return text + ("Per system (every rate pooled), the error's mean (a bias) ± its standard deviation (the "
                   "scatter from pass to pass), for the simulator and for one measurement predicting another:\n\n"
                   + "\n".join(per) + "\n")


def _plot(cells: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(validate.METRICS), figsize=(4.2 * len(validate.METRICS), 3.6), sharey=True)
    for ax, (m, (name, goal)) in zip(axes, validate.METRICS.items(), strict=True):
        for pred, g in cells.groupby("predictor", sort=False):
            e = np.sort(np.abs(g[f"{m}_err"].dropna().to_numpy()))
            ax.step(e * 100, np.arange(1, len(e) + 1) / len(e), where="post", label=pred)
        ax.axvline(goal * 100, color="grey", ls="--", lw=1)
        ax.set_xlabel(f"|error| of {name}, %")
        ax.set_title(f"{name} (goal {goal:.0%})")
    axes[0].set_ylabel("share of cells")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
