"""`dllm-bench accuracy` with no --task and no --model reads the GSM8K-shaped synth-cot task on its
committed model, and says which scoring rule its figures are under and what the dev split chose;
`--result-dir` puts the run where every other command puts one."""
from __future__ import annotations

import json

from typer.testing import CliRunner


def _app():
    import typer

    from dllm_bench.commands.accuracy import register

    app = typer.Typer()
    register(app)
    return app


def test_bare_accuracy_runs_synth_cot_and_names_the_rule_and_the_dev_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path / "env-root"))
    runs = tmp_path / "runs"
    args = ["--retention", "0.1", "--limit", "2", "--threads", "1", "--no-r1", "--result-dir", str(runs)]
    r = CliRunner().invoke(_app(), [*args, "--run-id", "table"])
    assert r.exit_code == 0, r.output
    cfg = json.loads((runs / "table" / "config.json").read_text())["config"]
    assert cfg["task"] == "synth-cot" and cfg["models"] == ["synth-cot"]
    assert "accuracy · synth-cot (test) · synth-cot" in r.stdout
    out = " ".join(r.stdout.split())                    # Rich wraps long lines
    assert "scoring rule mean: the block's queries averaged" in out
    assert "dev split: no choice made (no --dev-run)" in out and "upstream rule (mean)" in out
    assert not (tmp_path / "env-root").exists()         # --result-dir, not the environment's root

    r = CliRunner().invoke(_app(), [*args, "--run-id", "doc", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["task"] == "synth-cot" and doc["run_dir"] == str(runs / "doc")
    assert list(doc["scoring_rules"]) == ["mean"] and doc["dev_choice"] is None
    assert any("no choice made" in line for line in doc["protocol"])


def test_a_dev_runs_choice_is_named_in_the_output(tmp_path):
    runs = tmp_path / "runs"
    common = ["--model", "tiny", "--task", "synth", "--retention", "0.25", "--selection", "head", "--limit", "2",
              "--score-query", "mean,max", "--threads", "1", "--no-r1", "--result-dir", str(runs)]
    assert CliRunner().invoke(_app(), [*common, "--split", "dev", "--run-id", "dev", "--json"]).exit_code == 0
    r = CliRunner().invoke(_app(), [*common, "--dev-run", "dev", "--run-id", "test"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    chosen = json.loads((runs / "test" / "config.json").read_text())["config"]["dev_choice"]["choice"]["head"]
    assert f"dev split (run dev) chose head: {chosen['score_query']}" in out
    assert "scoring rule mean:" in out and "scoring rule max:" in out
