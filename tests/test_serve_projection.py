"""What the main job says: a point with too few finished requests shows its latencies and jitter but
no ratio, and a CPU `serve` run ends with the same comparison simulated at GPU scale, labelled as
simulated, naming its hardware profile, with the `simulate` command that reproduces it."""
from __future__ import annotations

import json

import pytest

from dllm_bench.serve.summary import MIN_REQUESTS_FOR_RATIOS, comparison_table, comparisons
from dllm_bench.simulate import projection
from tests.helpers import run_cli


def _point(system: str, completed: int, tput: float, e2el: float, baseline: bool) -> dict:
    return {"system": system, "dataset": "livebench", "rps": 0.5, "is_baseline": baseline, "completed": completed,
            "output_throughput": tput, "request_throughput": tput / 100, "mean_e2el_ms": e2el,
            "p99_e2el_ms": 2 * e2el, "latency_std_ms": e2el / 4, "latency_span_ms": e2el / 2,
            "mean_ttft_ms": e2el / 3, "max_batch_size": 2 if baseline else None, "scenario_kind": "max-fit"}


def _table_text(summaries, baselines) -> str:
    from rich.console import Console

    con = Console(width=400, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    con.print(comparison_table(summaries, baselines))
    return con.export_text()


@pytest.mark.parametrize("completed", [2, MIN_REQUESTS_FOR_RATIOS - 1])
def test_a_point_with_too_few_requests_prints_latencies_but_no_ratios(completed):
    points = [_point("engine", completed, 200.0, 1000.0, False), _point("fast-dllm", 12, 100.0, 3000.0, True)]
    (comp,) = comparisons(points, {"fast-dllm"})
    engine = next(r for r in comp["rows"] if r["system"] == "engine")
    assert engine["too_few_requests"] is True
    assert all(engine[f"{m}_x"] is None for m in ("output_throughput", "mean_e2el_ms", "latency_std_ms",
                                                  "latency_span_ms"))
    text = _table_text(comp["summaries"], comp["baselines"])
    row = next(line for line in text.splitlines() if line.startswith("│ engine"))
    assert f"too few requests: {completed}" in row and row.count("too few") == 5
    assert "2.00" in row and "0.25" in row             # P99 E2EL 2 s and σ 0.25 s are still shown
    assert "2.00 │ 3.00" not in row                      # the ratios (2x tput, 3x latency) are not


def test_enough_requests_on_both_sides_give_ratios_and_a_too_small_reference_gives_none():
    points = [_point("engine", 12, 200.0, 1000.0, False), _point("fast-dllm", 12, 100.0, 3000.0, True)]
    (comp,) = comparisons(points, {"fast-dllm"})
    engine = next(r for r in comp["rows"] if r["system"] == "engine")
    assert engine["output_throughput_x"] == pytest.approx(2.0) and engine["mean_e2el_ms_x"] == pytest.approx(3.0)
    assert "too few" not in _table_text(comp["summaries"], comp["baselines"])
    points[1]["completed"] = 3                            # the reference itself is too small
    (comp,) = comparisons(points, {"fast-dllm"})
    assert all(r["output_throughput_x"] is None and r["too_few_requests"] for r in comp["rows"])


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    r = run_cli(monkeypatch, capsys, *args)
    return r.returncode, r.stdout, r.stderr


def test_a_cpu_serve_run_ends_with_a_simulated_gpu_projection_that_its_command_reproduces(
        tmp_path, monkeypatch, capsys):
    # The default run's code path, on a small GPU-scale setting so it costs seconds: the tiny
    # preset's shape on the rtx4090 profile, 24 requests per point.
    monkeypatch.delenv("DLLM_BENCH_NO_PROJECTION", raising=False)
    monkeypatch.setattr(projection, "PRESET", "tiny")
    monkeypatch.setattr(projection, "MIN_REQUESTS", 24)
    runs = tmp_path / "runs"
    code, out, err = _cli(monkeypatch, capsys, "serve", "--model", "tiny", "--systems", "engine,llada",
                          "--num-prompts", "2", "--rps", "inf", "--num-warmups", "0", "--result-dir", str(runs),
                          "--run-id", "p", "--json")
    assert code == 0, err[-3000:]
    text = " ".join(err.split())
    assert "GPU projection — simulated, not measured" in text and "rtx4090 hardware profile" in text
    # every simulated GPU figure says how far its profile is off a real run (here: never checked)
    assert "SIMULATED on rtx4090 (tiny; not validated on real hardware): livebench @ inf rps" in text
    assert "too few requests for ratios: 2 finished per point" in text     # the measured table's
    doc = json.loads(out)
    proj = doc["projection"]
    assert proj["simulated"] is True and proj["hardware"] == "rtx4090" and proj["num_prompts"] == 24
    assert proj["validation"] == "not validated on real hardware"
    assert json.loads((runs / "p" / "projection.json").read_text()) == proj
    assert all(r.get("too_few_requests") for c in doc["comparisons"] for r in c["rows"])
    assert {p["system"] for p in proj["points"]} == {"engine", "llada"} and all(p["completed"] == 24
                                                                                  for p in proj["points"])
    assert proj["command"] == ("dllm-bench simulate --hardware rtx4090 --preset tiny --systems engine,llada "
                               "--dataset livebench --rps inf --num-prompts 24")
    assert f"reproduce: {proj['command']}" in text
    # The printed command gives the projection's numbers.
    args = proj["command"].split()[1:] + ["--result-dir", str(tmp_path / "sim"), "--json"]
    code, out, err = _cli(monkeypatch, capsys, *args)
    assert code == 0, err[-3000:]
    assert "simulated on rtx4090 (not validated on real hardware)" in " ".join(err.split())
    simulated = {p["system"]: p["output_throughput"] for p in json.loads(out)["points"]}
    assert simulated == {p["system"]: p["output_throughput"] for p in proj["points"]}

    code, out, err = _cli(monkeypatch, capsys, "serve", "--model", "tiny", "--systems", "engine", "--num-prompts",
                          "2", "--rps", "inf", "--num-warmups", "0", "--result-dir", str(runs), "--run-id", "q",
                          "--no-projection")
    assert code == 0 and "GPU projection" not in err and not (runs / "q" / "projection.json").exists()
