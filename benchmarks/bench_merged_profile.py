"""Does a merged profile predict a held-out pass better than that pass's own calibration?

Given several passes of the user's validation flow (`make bench-validate`: a calibration, then a
measured `serve` run), each pass is predicted twice, with `simulate --validate`:

* **own**: on the profile calibrated for it (the user's flow);
* **merged, held out**: on `calibrate --merge` of every *other* pass's profile, so the pass it
  predicts contributed nothing to the profile.

Passes are MEASURED:PROFILE (a run id under the runs root and a profile name or file). Every
profile, simulated run and log goes under one directory (`--id`); the comparison goes to
merged.md / merged.csv there and to stdout. Simulations only: seconds per pass on cpu-default.
"""
from __future__ import annotations

import argparse
import sys
import time

import pandas as pd
from cli_steps import run

from dllm_bench import inputs, results
from dllm_bench.simulate import validate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("passes", nargs="+", metavar="MEASURED:PROFILE")
    ap.add_argument("--simulate-args", default="--rps 0.5 --repeats 3",
                    help="`simulate` options that reproduce the measured runs' workloads [make bench-validate's]")
    ap.add_argument("--id", default=f"merged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    ap.add_argument("--result-dir", default=None)
    a = ap.parse_args()
    passes = [p.split(":") for p in a.passes]
    if len(passes) < 3 or any(len(p) != 2 for p in passes):
        print("error: give at least three passes as MEASURED:PROFILE (a held-out merge needs two others)",
              file=sys.stderr)
        return 2
    root = inputs.result_dir(a.result_dir)
    out = root / a.id
    if out.exists():
        print(f"{out} exists: give another --id", file=sys.stderr)
        return 2
    runs, logs = out / "runs", out / "logs"
    for d in (runs, logs):
        d.mkdir(parents=True)
    frames = []
    for i, (meas, profile) in enumerate(passes):
        merged = out / f"merged-without-{meas}.json"
        others = ",".join(p for j, (_, p) in enumerate(passes) if j != i)
        run(["calibrate", "--merge", others, "--name", merged.stem, "--out", str(merged)], logs / f"{merged.stem}.log")
        for label, hw in (("own", profile), ("merged, held out", str(merged))):
            run_id = f"{meas}-{'own' if label == 'own' else 'merged'}"
            run(["simulate", "--hardware", hw, *a.simulate_args.split(), "--result-dir", str(runs),
                 "--run-id", run_id, "--validate", str(root / meas)], logs / f"{run_id}.log")
            frames.append(pd.read_csv(runs / run_id / "validation.csv").assign(profile=label, target=meas))
        print(f"pass {meas} done", file=sys.stderr, flush=True)
    cells = pd.concat(frames, ignore_index=True)
    text = _markdown(cells, [m for m, _ in passes])
    results.atomic_write_csv(out / "merged.csv", cells)
    results.atomic_write_bytes(out / "merged.md", text.encode())
    print(text)
    print(out, file=sys.stderr)
    return 0


def _markdown(cells: pd.DataFrame, names: list[str]) -> str:
    metrics = list(validate.METRICS.items())
    lines = ["| profile | cells | " + " | ".join(n for _, (n, _) in metrics) + " |",
             "|---|---:|" + "---|" * len(metrics)]
    for label, g in cells.groupby("profile", sort=False):
        lines.append(f"| {label} | {len(g)} | " + " | ".join(validate.shares(g)) + " |")
    per = ["| system | " + " | ".join(f"{n}: own | merged" for _, (n, _) in metrics) + " |",
           "|---|" + "---|---|" * len(metrics)]
    for system, g in cells.groupby("system", sort=True):
        row = []
        for m, _ in metrics:
            for label in ("own", "merged, held out"):
                e = g.loc[g["profile"] == label, f"{m}_err"].dropna()
                row.append(f"{e.mean():+.1%} ± {e.std():.1%}")
        per.append(f"| {system} | " + " | ".join(row) + " |")
    return (f"# Own calibration vs the median of the other calibrations: {len(names)} passes "
            f"({', '.join(f'`{n}`' for n in names)})\n\nShare of cells within the goal / within noise / missed:\n\n"
            + "\n".join(lines) + "\n\nPer system, the error's mean ± standard deviation over the passes:\n\n"
            + "\n".join(per) + "\n")


if __name__ == "__main__":
    sys.exit(main())
