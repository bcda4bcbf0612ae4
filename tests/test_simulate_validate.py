"""`dllm-bench simulate --validate RUNS`: each simulated cell against the measured repeats, with
their min–max, its error, and "within measurement noise" when the simulated value lies inside
the measured min–max (dllm_bench.simulate.validate)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dllm_bench import results
from dllm_bench.simulate import validate

REPO = Path(__file__).resolve().parent.parent
METRICS = ("output_throughput", "mean_e2el_ms", "p99_e2el_ms")


def _run(root: Path, run_id: str, cells: dict, simulated: bool = False) -> Path:
    """A run with one point per (system, rps) cell of `cells`: {(system, rps): (tok/s, mean ms, p99 ms)}."""
    d = results.create_run("simulate" if simulated else "serve", {"simulated": simulated}, run_id=run_id, root=root)
    for (system, rps), vals in cells.items():
        s = dict(zip(METRICS, vals, strict=True), completed=4, interrupted=False)
        results.write_point(d, results.PointKey(system, rps, "livebench"), s, [{"request_id": "r0"}])
    return d


def test_each_cell_is_within_the_goal_within_noise_or_missed(tmp_path):
    sim = _run(tmp_path, "sim", {("engine", 4.0): (100.0, 1500.0, 5000.0), ("fast-dllm", 4.0): (50.0, 1.0, 1.0)},
               simulated=True)
    reps = [_run(tmp_path, f"m{i}", {("engine", 4.0): (tp, mean, p99), ("sparse-dllm", 4.0): (1.0, 1.0, 1.0)})
            for i, (tp, mean, p99) in enumerate([(98.0, 1000.0, 1000.0), (100.0, 1200.0, 1500.0), (103.0, 2000.0, 2000.0)])]
    df = validate.compare(sim, reps)
    assert list(df["system"]) == ["engine"]           # only cells both measured and simulated
    r = df.iloc[0]
    assert r["repeats"] == 3
    assert (r["output_throughput_meas"], r["output_throughput_min"], r["output_throughput_max"]) == (100.0, 98.0, 103.0)
    assert r["output_throughput_err"] == 0.0 and r["output_throughput_status"] == validate.GOAL
    assert math.isclose(r["mean_e2el_ms_err"], 1500 / 1200 - 1)                  # +25 %: goal missed ...
    assert r["mean_e2el_ms_status"] == validate.NOISE                          # ... but inside 1000–2000
    assert r["p99_e2el_ms_status"] == validate.MISSED                          # 5000 outside 1000–2000
    assert validate.counts(df)["mean E2E s"] == {validate.GOAL: 0, validate.NOISE: 1, validate.MISSED: 0}
    text = validate.as_markdown(df)
    assert "| livebench | engine | 4 | 3 | 100 (98–103) | 100 | +0% ✓ |" in text
    assert "1.2 (1–2) | 1.5 | +25% ≈" in text and "+233% ✗" in text
    # One repeat has no spread: the same +25 % is then simply missed.
    one = validate.compare(sim, reps[1:2]).iloc[0]
    assert one["mean_e2el_ms_status"] == validate.MISSED


def _seeded(root: Path, run_id: str, per_seed: dict, simulated: bool = False) -> Path:
    """One engine @ 4 rps cell repeated with workload seeds 0, 1, ...: {seed: (tok/s, mean ms, p99 ms)}."""
    d = results.create_run("simulate" if simulated else "serve", {"simulated": simulated}, run_id=run_id, root=root)
    for i, (seed, vals) in enumerate(sorted(per_seed.items())):
        s = dict(zip(METRICS, vals, strict=True), completed=4, interrupted=False, workload_seed=seed)
        results.write_point(d, results.PointKey("engine", 4.0, "livebench", i), s, [])
    return d


def test_repeats_with_other_workload_seeds_are_paired_by_seed(tmp_path):
    # serve's repeats run other workloads (seed + i): seed 1's workload is twice as fast on both sides.
    meas = _seeded(tmp_path, "meas", {0: (100.0, 1000.0, 1000.0), 1: (200.0, 500.0, 500.0), 2: (400.0, 1.0, 1.0)})
    sim = _seeded(tmp_path, "sim", {0: (110.0, 1000.0, 1000.0), 1: (190.0, 500.0, 500.0)}, simulated=True)
    r = validate.compare(sim, [meas]).iloc[0]
    assert (r["repeats"], r["seeds"]) == (2, 2)         # seed 2 was not simulated: left out of both sides
    assert (r["output_throughput_meas"], r["output_throughput_sim"]) == (150.0, 150.0)
    assert r["output_throughput_err"] == 0.0
    assert math.isclose(r["output_throughput_err_lo"], -0.05) and math.isclose(r["output_throughput_err_hi"], 0.10)
    assert "+0% [-5%…+10%] ✓" in validate.as_markdown(pd.DataFrame([r]))
    # One simulated seed against three measured runs of that same workload: the old comparison.
    reps = [_seeded(tmp_path, f"same{i}", {0: (tp, 1000.0, 1000.0)}) for i, tp in enumerate((90.0, 100.0, 130.0))]
    one = _seeded(tmp_path, "sim0", {0: (100.0, 1000.0, 1000.0)}, simulated=True)
    r = validate.compare(one, reps).iloc[0]
    assert (r["repeats"], r["seeds"], r["output_throughput_min"], r["output_throughput_max"]) == (3, 1, 90.0, 130.0)
    assert pd.isna(r.get("output_throughput_err_lo", math.nan))


def test_simulate_repeats_run_serves_workload_seeds(tmp_path):
    r = _cli(*SIM, "--result-dir", str(tmp_path), "--run-id", "rep", "--repeats", "2", "--seed", "3")
    assert r.returncode == 0, r.stderr
    df = results.metrics_frame(tmp_path / "rep")
    assert list(df["repeat"]) == [0, 1] and list(df["workload_seed"]) == [3, 4]
    lens = [[q["prompt_len"] for q in results.read_jsonl(p / "requests.jsonl")]
            for p in sorted((tmp_path / "rep" / "points").iterdir())]
    assert lens[0] != lens[1]                            # another workload per repeat, as serve's repeats


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dllm_bench.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})


SIM = ["simulate", "--preset", "tiny", "--hardware", "h100", "--systems", "engine", "--rps", "4",
       "--num-prompts", "4"]


def test_simulate_validate_writes_and_prints_the_table(tmp_path):
    r = _cli(*SIM, "--result-dir", str(tmp_path), "--run-id", "plain", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["points"][0]
    ds, tp, mean, p99 = p["dataset"], p["output_throughput"], p["mean_e2el_ms"], p["p99_e2el_ms"]
    for i, k in enumerate((0.9, 1.0, 1.3)):   # measured repeats around the simulated values
        d = results.create_run("serve", {}, run_id=f"rep{i}", root=tmp_path)
        results.write_point(d, results.PointKey("engine", 4.0, ds),
                            {"output_throughput": tp * k, "mean_e2el_ms": mean / k, "p99_e2el_ms": p99 * 3,
                             "completed": 4, "interrupted": False}, [])
    r = _cli(*SIM, "--result-dir", str(tmp_path), "--run-id", "sim", "--json", "--validate",
             f"rep0,rep1,{tmp_path / 'rep2'}")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)["validation"]
    assert len(v["measured_runs"]) == 3 and len(v["cells"]) == 1
    cell = v["cells"][0]
    assert cell["output_throughput_status"] == "goal" and cell["p99_e2el_ms_status"] == "missed"
    assert cell["repeats"] == 3
    assert "within measurement noise" in r.stderr and "| engine | 4 | 3 |" in r.stderr
    assert (tmp_path / "sim" / "validation.csv").is_file()
    assert "+0% ✓" in (tmp_path / "sim" / "validation.md").read_text()


@pytest.mark.parametrize("make, arg, msg", [
    (None, "nope", "no run 'nope'"),
    ("empty", "empty", "has no finished points"),
    ("simulated", "simulated", "is a simulated run"),
    (None, ",", "at least one measured run"),
])
def test_bad_validate_runs_are_one_line_exit_2_and_nothing_written(tmp_path, make, arg, msg):
    if make == "empty":
        results.create_run("serve", {}, run_id="empty", root=tmp_path)
    elif make == "simulated":
        _run(tmp_path, "simulated", {("engine", 4.0): (1.0, 1.0, 1.0)}, simulated=True)
    before = sorted(tmp_path.rglob("*"))
    r = _cli(*SIM, "--result-dir", str(tmp_path), "--validate", arg)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert sorted(tmp_path.rglob("*")) == before
