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
from dllm_bench.simulate import drift, validate
from dllm_bench.systems.build import TIMED, WARM_UP

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


def test_reproducibility_scores_measured_runs_of_the_same_workloads_against_each_other(tmp_path):
    runs = [validate.measured_frame([_seeded(tmp_path, f"m{i}", {0: (tp, 1000.0 * k, 1000.0), 1: (tp, 1000.0, 1000.0)})])
            for i, (tp, k) in enumerate([(100.0, 1.0), (104.0, 1.0), (130.0, 1.5)])]
    floor = validate.reproducibility(runs)
    assert len(floor) == 6 and set(zip(floor["source"], floor["target"], strict=True)) == {
        (0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)}
    assert set(floor["seeds"]) == {2}
    by = floor.set_index(["source", "target"])
    assert math.isclose(by.at[(0, 1), "output_throughput_err"], 100 / 104 - 1)
    # Runs 0 and 1 agree on everything; run 2 is 30 % faster and, on seed 0, 1.5x slower per request.
    assert validate.counts(floor)["tok/s"] == {validate.GOAL: 2, validate.NOISE: 0, validate.MISSED: 4}
    assert validate.counts(floor)["p99 E2E s"][validate.GOAL] == 6
    assert validate.shares(floor)[0] == "33 % / 0 % / 67 %"
    # Other workload seeds are other workloads: not compared; one run has no floor.
    other = validate.measured_frame([_seeded(tmp_path, "other", {5: (100.0, 1000.0, 1000.0)})])
    assert validate.reproducibility([runs[0], other]).empty and validate.reproducibility(runs[:1]).empty
    sim = validate.compare_frames(runs[0], runs[1])
    assert "against each other" not in validate.as_markdown(sim)
    text = validate.as_markdown(sim, floor)
    assert "3 measured runs" in text and "| measured → measured | 6 | 33 % / 0 % / 67 % |" in text


def _gauged(root: Path, run_id: str, reps: list, preset: str = "tiny") -> Path:
    """One engine @ 4 rps cell, workload seeds 0, 1, ...: [(tok/s, mean ms, speed-gauge seconds)]."""
    d = results.create_run("serve", {}, run_id=run_id, root=root)
    for i, (tp, mean, gauge) in enumerate(reps):
        s = {"output_throughput": tp, "mean_e2el_ms": mean, "p99_e2el_ms": mean, "completed": 4,
             "interrupted": False, "speed_gauge_s": gauge, "preset": preset, "workload_seed": i}
        results.write_point(d, results.PointKey("engine", 4.0, "livebench", i), s, [])
    return d


def test_measured_speeds_and_the_comparison_at_the_measured_speed(tmp_path):
    meas = _gauged(tmp_path, "meas", [(125.0, 800.0, 0.8), (120.0, 850.0, 0.9)])
    frame = validate.measured_frame([meas])
    sp = drift.measured_speeds(frame, 1.0, "tiny")
    assert list(sp["workload_seed"]) == [0, 1] and list(sp["speed"]) == [0.8, 0.9]
    assert drift.measured_speeds(frame, 1.0, "cpu-default").empty       # another preset's gauge
    assert drift.measured_speeds(frame, None, "tiny").empty             # a profile without a gauge
    plain = _run(tmp_path, "plain", {("engine", 4.0): (1.0, 1.0, 1.0)})
    assert drift.measured_speeds(validate.measured_frame([plain]), 1.0, None).empty
    assert drift.speed_reference({"preset": "tiny", "speed_gauge_s": {"operators": 0.5}}) == (0.5, "tiny")
    assert drift.speed_reference({}) == (None, None)
    # The plain simulation misses (the machine ran faster than calibrated); the simulation at each
    # point's measured speed matches it.
    sim = _seeded(tmp_path, "sim", {0: (100.0, 1000.0, 1000.0), 1: (100.0, 1000.0, 1000.0)}, simulated=True)
    at = pd.DataFrame([{"dataset": "livebench", "system": "engine", "rps": 4.0, "workload_seed": 0, "speed": 0.8,
                        "output_throughput": 125.0, "mean_e2el_ms": 800.0, "p99_e2el_ms": 800.0},
                       {"dataset": "livebench", "system": "engine", "rps": 4.0, "workload_seed": 1, "speed": 0.9,
                        "output_throughput": 120.0, "mean_e2el_ms": 850.0, "p99_e2el_ms": 850.0}])
    r = validate.compare(sim, [meas], at).iloc[0]
    assert r["output_throughput_status"] == validate.MISSED and r["mean_e2el_ms_status"] == validate.MISSED
    assert math.isclose(r["speed"], 0.85)
    for m in METRICS:
        assert abs(r[m + "_err_at_speed"]) < 1e-12 and r[m + "_status_at_speed"] == validate.GOAL
    text = validate.as_markdown(pd.DataFrame([r]))
    assert "| livebench | engine | 4 | 1.18× | +0% ✓ | +0% ✓ | +0% ✓ |" in text
    assert validate.counts(pd.DataFrame([r]), "_at_speed")["tok/s"][validate.GOAL] == 1
    assert "measured speed" not in validate.as_markdown(validate.compare(sim, [meas]))


def test_simulate_validate_simulates_each_gauged_point_again_at_its_speed(tmp_path):
    hw = json.loads((REPO / "dllm_bench/simulate/hardware/h100.json").read_text())
    # the H100's rooflines alone: per-call and per-point costs would make a tiny request wait for
    # another at twice the cost, which this test needs it not to
    hw["fit"] = {**hw.get("fit", {}), "preset": "tiny", "speed_gauge_s": {"operators": 1e-3}}
    hw["host"], hw["efficiency"] = {}, {"u_c": 1.0, "u_m": 1.0, "u_attn": 0.6, "c_op": 0.0}
    (tmp_path / "h.json").write_text(json.dumps(hw))
    args = [a if a != "h100" else str(tmp_path / "h.json") for a in SIM]
    r = _cli(*args, "--result-dir", str(tmp_path), "--run-id", "plain", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["points"][0]
    # Measured on a machine twice as slow as the profile (gauge 2 ms vs 1 ms): each request took
    # twice as long (on the H100 profile a tiny request never waits for another).
    d = results.create_run("serve", {}, run_id="slow", root=tmp_path)
    results.write_point(d, results.PointKey(ENGINE, 4.0, p["dataset"]),
                        {"output_throughput": p["output_throughput"], "mean_e2el_ms": 2 * p["mean_e2el_ms"],
                         "p99_e2el_ms": 2 * p["p99_e2el_ms"], "completed": 4, "interrupted": False,
                         "speed_gauge_s": 2e-3, "preset": "tiny", "workload_seed": 0}, [])
    r = _cli(*args, "--result-dir", str(tmp_path), "--run-id", "sim", "--json", "--validate", "slow")
    assert r.returncode == 0, r.stderr
    cell = json.loads(r.stdout)["validation"]["cells"][0]
    assert cell["speed"] == 2.0 and math.isclose(cell["mean_e2el_ms_err"], -0.5, abs_tol=1e-6)
    assert abs(cell["mean_e2el_ms_err_at_speed"]) < 1e-6 and abs(cell["p99_e2el_ms_err_at_speed"]) < 1e-6
    assert "simulated again at their machine speed" in r.stderr and "0.50× |" in r.stderr


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


# A measured engine ran with no step overhead in its cache=auto rule (nothing measures one), and
# --validate replays it so: the plain simulation names the same engine.
ENGINE = "engine:overhead_rows=0"
SIM = ["simulate", "--preset", "tiny", "--hardware", "h100", "--systems", ENGINE, "--rps", "4",
       "--num-prompts", "4"]


def test_simulate_validate_writes_and_prints_the_table(tmp_path):
    r = _cli(*SIM, "--result-dir", str(tmp_path), "--run-id", "plain", "--json")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)["points"][0]
    ds, tp, mean, p99 = p["dataset"], p["output_throughput"], p["mean_e2el_ms"], p["p99_e2el_ms"]
    for i, k in enumerate((0.95, 1.0, 1.3)):   # measured runs of the same workload around the simulated values
        # made by today's serve: its engine's CUDA graphs captured at warm-up and kept by their
        # timings, as simulated
        d = results.create_run("serve", {"graph_capture": WARM_UP, "graph_keep": TIMED}, run_id=f"rep{i}",
                               root=tmp_path)
        results.write_point(d, results.PointKey(ENGINE, 4.0, ds),
                            {"output_throughput": tp * k, "mean_e2el_ms": mean / k, "p99_e2el_ms": p99 * 3,
                             "completed": 4, "interrupted": False, "workload_seed": p["workload_seed"]}, [])
    r = _cli(*SIM, "--result-dir", str(tmp_path), "--run-id", "sim", "--json", "--validate",
             f"rep0,rep1,{tmp_path / 'rep2'}")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)["validation"]
    assert len(v["measured_runs"]) == 3 and len(v["cells"]) == 1
    cell = v["cells"][0]
    assert cell["output_throughput_status"] == "goal" and cell["p99_e2el_ms_status"] == "missed"
    assert cell["repeats"] == 3
    assert "within measurement noise" in r.stderr and f"| {ENGINE} | 4 | 3 |" in r.stderr
    assert (tmp_path / "sim" / "validation.csv").is_file()
    assert "+0% ✓" in (tmp_path / "sim" / "validation.md").read_text()
    # The three runs ran one workload: scored against each other, only 0.95 and 1.0 agree within 10 %.
    assert v["counts_measured_vs_measured"]["tok/s"] == {"goal": 2, "within noise": 0, "missed": 4}
    assert "| measured → measured | 6 | 33 % / 0 % / 67 % |" in r.stderr
    assert "The measured runs against each other" in (tmp_path / "sim" / "validation.md").read_text()


@pytest.mark.parametrize("make, arg, msg", [
    (None, "nope", "no run 'nope'"),
    ("empty", "empty", "has no finished points"),
    ("simulated", "simulated", "is a simulated run"),
    (None, ",", "at least one measured run"),
])
def test_bad_validate_runs_are_one_line_exit_2_and_nothing_written(tmp_path, make, arg, msg, cli_in_process):
    if make == "empty":
        results.create_run("serve", {}, run_id="empty", root=tmp_path)
    elif make == "simulated":
        _run(tmp_path, "simulated", {("engine", 4.0): (1.0, 1.0, 1.0)}, simulated=True)
    before = sorted(tmp_path.rglob("*"))
    r = cli_in_process(*SIM, "--result-dir", str(tmp_path), "--validate", arg)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and msg in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert sorted(tmp_path.rglob("*")) == before
