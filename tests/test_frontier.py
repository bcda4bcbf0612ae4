"""`dllm-bench frontier`: end to end on the trained synth-cot model (one seed, a few questions),
the Pareto front and the goals' verdicts on hand-made rows, and the configuration grid."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from dllm_bench.errors import UserError
from dllm_bench.frontier import configs, output, pareto
from dllm_bench.systems import decoding as system_decoding
from engine.decoding import Decoding


def _app():
    from dllm_bench.commands.frontier import register

    app = typer.Typer()
    register(app)
    return app


ARGS = ["--model", "synth-cot", "--seeds", "1", "--limit", "4", "--repeats", "2", "--concurrency", "2", "--threads", "1",
        "--systems", "engine:cache=dual,fast-dllm", "--decoding", "fixed,threshold:0.9"]


def test_frontier_end_to_end_on_the_trained_model(tmp_path, monkeypatch):
    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    r = CliRunner().invoke(_app(), [*ARGS, "--run-id", "f1"])
    assert r.exit_code == 0, r.output
    run = tmp_path / "f1"
    for col in output.COLUMNS:                                  # the printed table's header
        assert col in r.output, col
    assert "goal — engine ≥ 1x Fast-dLLM" in r.output and "goal — the engine's best point ≥ 2x" in r.output
    assert (run / "frontier.png").stat().st_size > 0
    assert json.loads((run / "config.json").read_text())["kind"] == "frontier"
    doc = json.loads((run / "summary.json").read_text())
    assert doc["columns"] == list(output.COLUMNS)
    rows = {(x["system"], x["decoding"]): x for x in doc["rows"]}
    assert set(rows) == {("engine:cache=dual", "fixed"), ("engine:cache=dual", "threshold:0.9"),
                         ("fast-dllm", "fixed"), ("fast-dllm", "threshold:0.9")}
    for x in rows.values():
        assert x["n"] == 4 and 0 <= x["ci_low"] <= x["accuracy"] <= x["ci_high"] <= 1
        assert x["repeats"] == 2 and x["tps_min"] <= x["tps"] <= x["tps_max"] and x["accuracy_stable"]
    # fixed: one token per forward (32 forwards for the 32-token answer window); the trained
    # model's confidences are real, so threshold 0.9 commits several tokens per forward
    for s in ("engine:cache=dual", "fast-dllm"):
        assert rows[(s, "fixed")]["mean_tpf"] == 1.0 and rows[(s, "fixed")]["mean_nfe"] == 32
        assert rows[(s, "threshold:0.9")]["mean_nfe"] < 32 and rows[(s, "threshold:0.9")]["mean_tpf"] > 1
    assert sum(x["pareto"] for x in rows.values()) >= 1
    assert set(doc["verdicts"]) == {"engine_vs_fast_dllm", "parallel_vs_fixed"}
    # per request: NFE, TPF, steps per block (what simulate --steps-per-block replays)
    slug = configs.Config(configs.parse_systems("engine:cache=dual")[0], Decoding("threshold", 0.9)).slug
    recs = [json.loads(x) for x in (run / "points" / slug / "requests.jsonl").read_text().splitlines()]
    assert len(recs) == 4 * 2 and {"nfe", "tpf", "steps_per_block", "repeat", "model"} <= set(recs[0])
    assert all(sum(x["steps_per_block"]) == x["nfe"] for x in recs)
    samples = (run / "points" / slug / "synth-cot" / "samples.jsonl").read_text().splitlines()
    assert {"nfe", "tpf", "steps_per_block"} <= set(json.loads(samples[0]))
    assert (run / "metrics.csv").read_text().count("\n") == 5
    # `report` reads it
    from dllm_bench.report.document import render

    rep = render(tmp_path / "report.md", tmp_path)
    assert rep["runs"].get("frontier") == str(run)
    text = (tmp_path / "report.md").read_text()
    assert "## Frontier" in text and "threshold:0.9" in text
    # and a doc's current-results block of it is the report's table (dllm_bench.report.current)
    from dllm_bench.report.current import render as block

    rows = [line for line in block(run).splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 4 and all(line in text for line in rows)


def test_frontier_bad_input_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    for bad, msg in ((["--decoding", "threshold:2"], "0 < τ ≤ 1"), (["--concurrency", "0"], "--concurrency"),
                     (["--systems", "fast-dllm:batch=2"], "static batch"), (["--task", "gsm8k"], "needs --model")):
        r = CliRunner().invoke(_app(), [*bad, "--limit", "2"])
        assert isinstance(r.exception, UserError) and msg in str(r.exception), (bad, r.exception)
    assert not any(tmp_path.iterdir())


def test_the_grid_gives_each_system_its_upstream_rules():
    pol = system_decoding.parse_list("fixed,threshold:0.9,factor:1,entropy:0.5")
    got = [(c.variant.label, str(c.decoding)) for c in configs.plan("engine,fast-dllm,sparse-dllm,fast-dllm:threshold=0.8", pol)]
    assert got == [("engine", "fixed"), ("engine", "threshold:0.9"), ("engine", "factor:1"), ("engine", "entropy:0.5"),
                   ("fast-dllm", "fixed"), ("fast-dllm", "threshold:0.9"), ("fast-dllm", "factor:1"),
                   ("sparse-dllm", "fixed"), ("fast-dllm:threshold=0.8", "threshold:0.8")]
    fd = configs.plan("fast-dllm", pol)
    assert [c.baseline_knobs({}).get("factor") for c in fd] == [None, None, 1.0]
    assert fd[1].baseline_knobs({})["threshold"] == 0.9


def _row(system, decoding, acc, tps, lo=None, hi=None, name=None):
    return {"label": f"{system} · {decoding}", "system": system, "system_name": name or system.split(":")[0],
            "decoding": decoding, "accuracy": acc, "tps": tps, "tps_min": lo or tps, "tps_max": hi or tps,
            "repeats": 3 if lo else 1}


def test_front_and_verdicts_on_hand_made_rows():
    rows = [_row("engine", "fixed", 0.90, 10), _row("engine", "threshold:0.9", 0.895, 25),
            _row("engine", "threshold:0.5", 0.80, 60), _row("fast-dllm", "fixed", 0.90, 12),
            _row("fast-dllm", "threshold:0.9", 0.89, 20), _row("fast-dllm", "threshold:0.5", 0.85, 30)]
    marked = {r["label"]: r["pareto"] for r in pareto.mark_front(rows)}
    assert marked == {"engine · fixed": False, "engine · threshold:0.9": True, "engine · threshold:0.5": True,
                      "fast-dllm · fixed": True, "fast-dllm · threshold:0.9": False, "fast-dllm · threshold:0.5": True}
    g1 = pareto.engine_vs_fast_dllm(rows)
    by = {lv["fast_dllm"]: lv for lv in g1["levels"]}
    # 0.85 -> engine threshold:0.9 (0.895, 25 tok/s) vs 30: 0.83x, not met; 0.90 -> engine fixed, 10 vs 12
    assert by["fast-dllm · threshold:0.5"]["engine"] == "engine · threshold:0.9"
    assert by["fast-dllm · threshold:0.5"]["ratio"] == pytest.approx(25 / 30) and not g1["met"]
    assert by["fast-dllm · fixed"]["engine"] == "engine · fixed" and by["fast-dllm · fixed"]["ratio"] == pytest.approx(10 / 12)
    g2 = pareto.parallel_vs_fixed(rows)
    # within one point of 0.90: threshold:0.9 (0.895) at 25 tok/s = 2.5x; threshold:0.5 lost 10 points
    assert g2["met"] and g2["variants"][0]["best"] == "engine · threshold:0.9" and g2["variants"][0]["ratio"] == 2.5
    # repeats whose ratio interval straddles the target: within noise
    noisy = [_row("engine", "fixed", 0.9, 10, 8, 12), _row("engine", "threshold:0.9", 0.9, 21, 18, 30)]
    assert pareto.parallel_vs_fixed(noisy)["variants"][0]["mark"] == "within noise"
    assert pareto.engine_vs_fast_dllm(noisy)["met"] is None          # no Fast-dLLM point: nothing to check


def test_a_trained_models_seed0_name_stands_for_its_seeds():
    from dllm_bench.frontier.run import FrontierOptions, resolve

    plan = resolve(FrontierOptions(model="synth-cot", limit=2))
    assert plan.models == ["synth-cot", "synth-cot-s1", "synth-cot-s2"]
    assert resolve(FrontierOptions(model="synth-cot", seeds=1, limit=2)).models == ["synth-cot"]
    assert resolve(FrontierOptions(model="synth-cot-s1", limit=2)).models == ["synth-cot-s1"]
