"""The simulator against a measured CPU run: the committed serve run (tests/data/cpu-*, made by
`make validate-data` on an idle machine) replayed on the calibration taken there right before it.
Each point takes exactly the steps its trace recorded (the work, not the time), and each system's
output tok/s is within 15 % and its mean E2EL within 20 % of the measured median, compared as
`simulate --validate` compares them (per workload seed, medians over the repeats). No timing:
the replay runs on the virtual clock."""
from __future__ import annotations

import pandas as pd
import pytest

from dllm_bench import results
from dllm_bench.simulate import hardware, validate
from dllm_bench.simulate.fit import measured, replay
from tests.test_simulate_fit import REPO

# The newest committed run (`make validate-data` names it by its date).
CPU_RUN = sorted((REPO / "tests" / "data").glob("cpu-20*"))[-1]
# Goals of the CPU check (issue #55): throughput within 15 %, mean E2EL within 20 %.
TOKS_GOAL, E2EL_GOAL = 0.15, 0.20
TRACED = ("requests", "refresh", "query_rows", "logit_rows")


@pytest.fixture(scope="module")
def replays():
    points = measured.load([CPU_RUN])
    hw = hardware.load(str(CPU_RUN / "calibrate.json"))
    return [replay.replay(p, hw) for p in points]


def test_the_run_is_a_cpu_run_of_the_engine_and_a_baseline_with_repeats_and_traces(replays):
    cfg = results.load_config(CPU_RUN)["config"]
    assert cfg["preset"]["device"] == "cpu" and cfg["repeats"] >= 2
    assert hardware.load(str(CPU_RUN / "calibrate.json")).kind == "cpu"
    systems = {r.point.system for r in replays}
    assert "engine" in systems and len(systems) >= 2
    assert all(r.point.steps for r in replays)                       # every point traced its steps


def test_each_point_is_replayed_with_the_steps_it_took(replays):
    """The simulated schedule is the engine's and the baseline's own: step for step the same
    requests, Refreshes, query rows and logit rows as the measured trace (exact counters)."""
    for r in replays:
        sim = [{"requests": fw.n_seq, "refresh": fw.refresh, "query_rows": fw.query_tokens, "logit_rows": fw.rows}
               for fw in r.forwards]
        meas = [{k: s[k] for k in TRACED} for s in r.point.steps]
        assert sim == meas, r.point.key


def test_each_system_is_simulated_within_the_goals(replays):
    rows = [{"dataset": r.point.dataset, "system": r.point.label, "rps": r.point.rps,
             "workload_seed": _seed(r.point), **r.summary} for r in replays]
    cells = validate.compare_frames(pd.DataFrame(rows), results.metrics_frame(CPU_RUN))
    assert len(cells) == len({r.point.label for r in replays}) and (cells["seeds"] >= 2).all()
    for c in cells.itertuples():
        why = (c.system, f"tok/s {c.output_throughput_err:+.1%}, mean E2EL {c.mean_e2el_ms_err:+.1%}",
               _step_ratios([r for r in replays if r.point.label == c.system]))
        assert abs(c.output_throughput_err) <= TOKS_GOAL and abs(c.mean_e2el_ms_err) <= E2EL_GOAL, why


def _step_ratios(reps: list[replay.Replay]) -> dict[str, str]:
    """Simulated over measured step time by kind of step (all Refresh, mixed, all Reuse): where a
    miss comes from, said by the failure."""
    sums: dict[str, list[float]] = {}
    for r in reps:
        for fw, cost, step in zip(r.forwards, r.costs, r.point.steps, strict=True):
            kind = "refresh" if fw.refresh == fw.n_seq else "mixed" if fw.refresh else "reuse"
            acc = sums.setdefault(kind, [0.0, 0.0])
            acc[0] += cost
            acc[1] += step["wall_ms"] / 1e3
    return {k: f"{sim / meas:.2f}x" for k, (sim, meas) in sums.items()}


def _seed(point: measured.MeasuredPoint) -> int:
    s = next(s for s in results.load_points(point.run_dir) if s["_point"] == point.name)
    return int(s["workload_seed"])
