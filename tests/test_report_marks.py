"""`dllm-bench report` marks each claim from the data: reproduced / not reproduced / within noise
(the interval the repeats allow straddles 1.0), "(one run)" for a single-run figure; simulated
runs get their own section, labelled with the hardware profile, never mixed with measured rows."""
import re

import pytest

from dllm_bench import results
from dllm_bench.repeats import Spread
from dllm_bench.report import document as rp
from dllm_bench.report.claims import mark

CLAIM = "Throughput vs the strongest baseline"


def _serve_point(run_dir, system, tp, repeat=0, rps=1.0, dataset="livebench", **kw):
    s = {"output_throughput": tp, "request_throughput": tp / 100, "completed": 4, "mean_e2el_ms": 1e5 / tp,
         "p99_e2el_ms": 2e5 / tp, "latency_std_ms": 1e4 / tp, "latency_span_ms": 3e4 / tp, "interrupted": False,
         "system_name": system.split(":")[0], "is_baseline": system != "engine", "workload_seed": repeat,
         "mean_batch_size": 1.0, **kw}
    results.write_point(run_dir, results.PointKey(system, rps, dataset, repeat), s, [{"request_id": "r0"}])


def _serve_run(root, engine_tps, baseline_tps, run_id="serve-m"):
    d = results.create_run("serve", {"preset_line": "preset fixture", "repeats": len(engine_tps)},
                           run_id=run_id, root=root)
    for i, (e, b) in enumerate(zip(engine_tps, baseline_tps, strict=True)):
        _serve_point(d, "engine", e, i)
        _serve_point(d, "fast-dllm", b, i, max_batch_size=4)
    return d


@pytest.mark.parametrize("engine, baseline, expected", [
    ((90.0, 95.0, 100.0), (50.0, 55.0, 52.0), "reproduced"),           # apart, engine above
    ((50.0, 70.0, 60.0), (55.0, 65.0, 60.0), "within noise"),          # ratio interval [0.77, 1.27]
    ((30.0, 32.0, 35.0), (50.0, 55.0, 52.0), "not reproduced"),        # apart, engine below
    ((90.0,), (50.0,), "reproduced (one run)"),                         # one figure: no interval
])
def test_throughput_claim_marked_from_the_repeats(tmp_path, engine, baseline, expected):
    d = _serve_run(tmp_path / "runs", engine, baseline)
    doc = rp.render(tmp_path / "r.md", tmp_path / "runs", runs={"serve": d})
    marks = {c["claim"]: c["mark"] for c in doc["claims"]}
    assert marks[CLAIM] == expected
    text = (tmp_path / "r.md").read_text()
    assert f"**Mark: {expected}.**" in text
    if len(engine) > 1:                                                 # medians with their ranges in the table
        assert f"{sorted(engine)[1]:.2f} [{min(engine):.2f}–{max(engine):.2f}]" in text


def test_mark_rule():
    assert mark(Spread(1.3, 1.1, 1.5, 3)) == "reproduced"
    assert mark(Spread(1.3, 0.9, 1.5, 3)) == "within noise"
    assert mark(Spread(0.7, 0.6, 0.8, 3)) == "not reproduced"
    assert mark(Spread(0.7, 0.6, 0.8, 3), paper_above_one=False) == "reproduced"   # a falling trend
    assert mark(Spread(0.7, float("nan"), float("nan"), 1)) == "not reproduced (one run)"
    assert mark(None) == "no data" and mark(Spread.of([])) == "no data"


def test_sweep_trend_within_noise_when_the_ends_overlap(tmp_path):
    from tests.test_ablate_sweep_report import _plan

    root = tmp_path / "runs"
    plan = _plan("cpu-default", "input-len")
    cfg = {"vary": "input-len", "plan": plan.to_dict(), "systems_labels": ["engine", "sparse-dllm"],
           "reference": "sparse-dllm", "preset_line": "preset fixture", "num_prompts": 8, "measurement": "saturation"}
    d = results.create_run("sweep", cfg, run_id="sw", root=root)
    for i, (a, b, c) in enumerate(((3.0, 2.8, 2.6), (2.5, 2.9, 3.1))):  # first [2.5, 3.0], last [2.6, 3.1]
        for pt, x in zip(plan.points, (a, b, c), strict=True):
            _serve_point(d, "sparse-dllm", 10.0, i, dataset=plan.label(pt), max_batch_size=4)
            _serve_point(d, "engine", 10.0 * x, i, dataset=plan.label(pt))
    doc = rp.render(tmp_path / "r.md", root, runs={"sweep:input-len": d})
    marks = {c["claim"]: c["mark"] for c in doc["claims"]}
    assert marks["Speedup falls as the input length grows"] == "within noise"
    assert marks["Speedup vs sparse-dllm at the shortest input length"] == "reproduced"


def test_report_reads_a_simulated_run_in_its_own_section(tmp_path):
    root = tmp_path / "runs"
    _serve_run(root, (90.0,), (50.0,))
    hw = {"name": "l40s", "kind": "gpu", "peak_flops": 3.62e14, "bandwidth": 8.64e11, "memory_bytes": 48 * 2**30,
          "description": "NVIDIA L40S"}
    d = results.create_run("simulate", {"simulated": True, "hardware": hw, "impls": {"engine": "ours"}},
                           run_id="sim-l40s", root=root)
    for system, tp in (("engine", 123.0), ("fast-dllm", 41.0)):
        _serve_point(d, system, tp, simulated=True, hardware="l40s")
    runs = rp.find_runs(root)
    assert runs["simulate:l40s"] == d and runs["serve"].name == "serve-m"
    doc = rp.render(tmp_path / "r.md", root)
    assert "simulate:l40s" not in doc["missing"] and not doc["errors"]
    text = (tmp_path / "r.md").read_text()
    measured, simulated = text.split("## Simulated, not measured: serving on l40s")
    row = re.compile(r"\| engine +\| +123(\.00)? ")                  # tabulate drops trailing zeros
    assert not row.search(measured) and row.search(simulated)         # never mixed with measured rows
    assert "NVIDIA L40S" in simulated and "362.0 TFLOP/s" in simulated and "864 GB/s" in simulated
    sim_claims = [c for c in doc["claims"] if c["section"] == "simulate:l40s"]
    assert {c["claim"] for c in sim_claims} >= {f"{CLAIM} (simulated on l40s)"}
    assert {c["mark"] for c in sim_claims if c["claim"].startswith(CLAIM)} == {"reproduced (one run)"}
    assert [c["ours"] for c in doc["claims"] if c["claim"] == CLAIM][0].startswith("engine / best baseline output "
                                                                                  "throughput: livebench 1.80×")
