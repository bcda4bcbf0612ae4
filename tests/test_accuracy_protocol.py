"""`dllm-bench accuracy`'s held-out protocol (dev run -> choice -> test run), several models per
run (per-seed results and their spread), `--data` as a `datasets` directory, and the report's
use of test-split runs only."""
from __future__ import annotations

import json
import os
import shutil

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _app():
    import typer

    from dllm_bench.commands.accuracy import register

    app = typer.Typer()
    register(app)
    return app


def _run(args, tmp_path):
    from typer.testing import CliRunner

    r = CliRunner().invoke(_app(), [*args, "--json", "--threads", "1", "--no-r1"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_dev_choice_rule():
    from dllm_bench.accuracy.protocol import dev_choice

    def pt(sel, q, r, a):
        return {"system": "engine", "role": "sparse", "selection": sel, "score_query": q, "retention": r, "accuracy": a}
    rows = [{"system": "engine", "role": "dense", "retention": 1.0, "accuracy": 1.0},
            pt("head", "mean", 0.1, 0.4), pt("head", "mean", 0.2, 0.6), pt("head", "max", 0.1, 0.9),
            pt("head", "max", 0.2, 0.5), pt("uniform", "mean", 0.1, 0.7), pt("uniform", "max", 0.1, 0.7),
            pt("head", "max", 1.0, 0.0)]                  # r = 1 is not a retention choice
    c = dev_choice(rows)
    assert c["head"]["score_query"] == "max" and c["head"]["dev_mean_accuracy"] == pytest.approx({"mean": 0.5, "max": 0.7})
    assert c["uniform"]["score_query"] == "mean"         # a tie keeps the upstream rule


def test_dev_then_test_with_several_models(tmp_path, monkeypatch):
    """Two models (the tiny preset and a copy of it): a dev run, then a test run that records the
    dev run's choice; per-seed rows, the spread, per-model sample dirs; the report shows the test
    run, never the dev one."""
    from dllm_bench.checkpoints.load import model_dir

    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path / "runs"))
    copy = tmp_path / "tiny-copy"
    shutil.copytree(model_dir("tiny"), copy)
    models = f"tiny,{copy}"
    common = ["--model", models, "--task", "synth", "--limit", "3", "--retention", "0.25,0.5", "--selection", "head",
              "--score-query", "mean,max"]
    dev = _run([*common, "--split", "dev", "--run-id", "dev"], tmp_path)
    assert dev["split"] == "dev" and dev["models"] == ["tiny", str(copy)]
    test = _run([*common, "--dev-run", "dev", "--run-id", "test"], tmp_path)
    assert test["split"] == "test" and test["dev_choice"]["dev_run"] == "dev"
    assert set(test["dev_choice"]["choice"]) == {"head"}
    dev_q = {json.loads(x)["question"] for x in (tmp_path / "runs/dev/points/tiny/dense/samples.jsonl").read_text().splitlines()}
    test_q = {json.loads(x)["question"] for x in (tmp_path / "runs/test/points/tiny/dense/samples.jsonl").read_text().splitlines()}
    assert len(dev_q) == len(test_q) == 3 and not dev_q & test_q
    assert [p["model"] for p in test["points"]].count("tiny") == 5 == [p["model"] for p in test["points"]].count(str(copy))
    seeds = {s["point"]: s for s in test["seeds"]}
    assert set(seeds) == {"dense", "head-r0.25", "head-r0.5", "head-max-r0.25", "head-max-r0.5"}
    for s in seeds.values():                                # the same weights: no spread, pooled counts
        assert s["seeds"] == 2 and s["seed_sd"] == 0 and s["seed_min"] == s["seed_max"] == s["accuracy"]
        assert s["n"] == 6 and s["per_seed"] == {"tiny": s["accuracy"], str(copy): s["accuracy"]}
    assert (tmp_path / "runs/test/points" / copy.name / "head-max-r0.5" / "samples.jsonl").is_file()
    assert (tmp_path / "runs/test/fig6_accuracy_vs_retention.png").is_file()

    from dllm_bench.report.document import find_runs, render

    runs = find_runs(tmp_path / "runs")
    assert runs["accuracy"] == tmp_path / "runs" / "test"
    doc = render(tmp_path / "report.md", root=tmp_path / "runs")
    text = (tmp_path / "report.md").read_text()
    assert "seed_sd" in text and "chosen on dev run `dev`" in text and "(test split)" in text
    claims = {c["claim"] for c in doc["claims"] if c["section"] == "accuracy"}
    assert "synth: head-centric beats uniform at low retention (mean-query rule, the paper's code)" in claims
    assert any(c.startswith("synth: head-centric beats uniform at low retention (max-query rule") for c in claims)


@pytest.mark.parametrize("args, msg", [
    (["--model", "tiny,tiny"], "distinct"),
    (["--model", "tiny", "--split", "train"], "--split"),
    (["--model", "tiny", "--task", "gsm8k", "--split", "dev"], "needs --data"),
    (["--model", "tiny", "--dev-run", "/no/such/run"], "--dev-run"),
])
def test_bad_protocol_input(args, msg, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dllm_bench.errors import UserError

    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    r = CliRunner().invoke(_app(), args)
    assert isinstance(r.exception, UserError) and msg in str(r.exception)
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------ --data DIR
def test_load_local_datasets_directory(tmp_path):
    import datasets

    from workloads.tasks import gsm8k
    from workloads.tasks.local import load_local

    rows = gsm8k.load_gsm8k(limit=3)
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:1]),
                          "test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "g"))
    assert load_local(tmp_path / "g") == ("gsm8k", rows)                    # the test split
    datasets.Dataset.from_list(rows[:2]).save_to_disk(str(tmp_path / "one"))
    assert load_local(tmp_path / "one", kind="gsm8k") == ("gsm8k", rows[:2])
    he = [{"task_id": "T/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
           "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(he)}).save_to_disk(str(tmp_path / "h"))
    assert load_local(tmp_path / "h") == ("humaneval", he)
    datasets.DatasetDict({"a": datasets.Dataset.from_list(rows), "b": datasets.Dataset.from_list(rows)}
                         ).save_to_disk(str(tmp_path / "two"))
    for bad, msg in ((tmp_path / "two", "without a 'test' split"), (tmp_path, "not a datasets directory")):
        with pytest.raises(ValueError, match=msg):
            load_local(bad)


def test_accuracy_gsm8k_from_a_datasets_directory(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path / "runs"))
    rows = [{"question": f"Ann has {i} pens. How many pens does she have?", "answer": f"She has {i}.\n#### {i}"}
            for i in range(1, 3)]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "g"))
    doc = _run(["--model", "tiny", "--task", "gsm8k", "--data", str(tmp_path / "g"), "--num-fewshot", "0",
                "--gen-length", "32", "--steps", "32", "--limit", "2", "--retention", "0.5", "--selection", "head",
                "--run-id", "g"], tmp_path)
    assert [p["n"] for p in doc["points"]] == [2, 2]
    got = {json.loads(x)["question"] for x in (tmp_path / "runs/g/points/head-r0.5/samples.jsonl").read_text().splitlines()}
    assert got == {r["question"] for r in rows}
