"""`--repeats N`: every point run N times with workload seeds seed, seed+1, ...; each repeat
written in its own point directory, the aggregate (median, min–max) in summary.json; --resume
with a larger N runs only the missing repeats and leaves the finished ones untouched."""
import json

import pytest

from dllm_bench import results
from dllm_bench.repeats import aggregate_points, cell, compare
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.serve.run import serve
from tests.results_helpers import load_metrics
from tests.test_serve import RUN_DEFAULTS

ONE = {**RUN_DEFAULTS, "systems": "engine", "num_prompts": 2, "rps": "inf"}


def _files(point_dir):
    return {f.name: (f.stat().st_mtime_ns, f.read_bytes()) for f in sorted(point_dir.iterdir())}


@pytest.mark.slow
def test_repeats_write_every_repeat_and_the_aggregate_and_resume_runs_only_the_missing(tmp_path):
    run = resolve_run(ServeOptions(**{**ONE, "repeats": 2}))
    assert serve(run, result_dir=tmp_path, run_id="rep", resume=False, as_json=False) == 0
    run_dir = tmp_path / "rep"
    pdirs = sorted(p.name for p in (run_dir / "points").iterdir())
    assert pdirs == ["livebench__engine__rpsinf", "livebench__engine__rpsinf__r1"]
    pts = results.load_points(run_dir)
    assert [(p["repeat"], p["workload_seed"]) for p in pts] == [(0, 0), (1, 1)]
    assert all(p["completed"] == 2 for p in pts)
    summary = json.loads((run_dir / "summary.json").read_text())
    (agg,) = summary["aggregate"]
    tps = sorted(p["output_throughput"] for p in pts)
    assert agg["repeats"] == 2 and agg["seeds"] == [0, 1]
    assert (agg["output_throughput_min"], agg["output_throughput_max"]) == (tps[0], tps[1])
    assert agg["output_throughput"] == pytest.approx(sum(tps) / 2)          # the median of two
    assert agg["mean_batch_size"] >= 1 and "mean_batch_size_min" in agg
    assert len(load_metrics(run_dir)) == 2                          # metrics.csv: a row per repeat

    before = {d: _files(run_dir / "points" / d) for d in pdirs}
    run3 = resolve_run(ServeOptions(**{**ONE, "repeats": 3}))
    assert serve(run3, result_dir=tmp_path, run_id="rep", resume=True, as_json=False) == 0
    assert {d: _files(run_dir / "points" / d) for d in pdirs} == before     # finished repeats untouched
    pts = results.load_points(run_dir)
    assert [(p["repeat"], p["workload_seed"]) for p in pts] == [(0, 0), (1, 1), (2, 2)]
    (agg,) = json.loads((run_dir / "summary.json").read_text())["aggregate"]
    assert agg["repeats"] == 3
    assert results.load_config(run_dir)["config"]["repeats"] == 3
    # Repeat i replays the workload of seed + i: a different one from repeat 0.
    reqs = results.read_jsonl(run_dir / "requests.jsonl")
    lens = {r["repeat"]: sorted(q["prompt_len"] for q in reqs if q["repeat"] == r["repeat"]) for r in reqs}
    assert len(lens) == 3 and len({tuple(v) for v in lens.values()}) > 1


def _point(system, tp, repeat, **kw):
    return {"dataset": "d", "system": system, "rps": 1.0, "repeat": repeat, "workload_seed": repeat,
            "output_throughput": tp, "completed": 4, "within_budget": True, "interrupted": False,
            "stats": {"forwards": 10 + repeat}, **kw}


def test_aggregate_points_medians_ranges_flags_and_verdicts():
    pts = [_point("e", 10.0, 0), _point("e", 14.0, 1), _point("e", 11.0, 2, within_budget=False),
           _point("b", 5.0, 0), _point("b", 6.0, 1), _point("b", 9.0, 2, interrupted=True)]
    e, b = aggregate_points(pts)
    assert (e["output_throughput"], e["output_throughput_min"], e["output_throughput_max"]) == (11.0, 10.0, 14.0)
    assert e["completed"] == 4 and isinstance(e["completed"], int)          # equal in every repeat: kept as is
    assert e["within_budget"] is False and b["interrupted"] is True         # all must hold / any flags
    assert e["stats"]["forwards"] == 11 and "repeat" not in e and e["seeds"] == [0, 1, 2]
    r, v = compare(e, b, "output_throughput")
    assert v == "better" and r.lo == pytest.approx(10 / 9)
    assert cell(e, "output_throughput", "{:.1f}") == "11.0 [10.0–14.0]"
    b2 = aggregate_points([_point("b", 9.5, 0), _point("b", 12.0, 1)])[0]
    assert compare(e, b2, "output_throughput")[1] == "within noise"
    assert compare(b2, e, "output_throughput", higher_better=False)[1] == "within noise"
    single = aggregate_points([_point("e", 10.0, 0)])[0]
    assert single["repeats"] == 1 and cell(single, "output_throughput", "{:.1f}") == "10.0"
