"""The trained tiny-math checkpoint, `dllm-bench train`, `dllm-bench accuracy`, and the lm-eval
engine backend (docs/ACCURACY.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models import build_model

REPO = Path(__file__).resolve().parent.parent
ASSET_READY = (REPO / "dllm_bench" / "assets" / "tiny-math" / "model.safetensors").is_file()

# Documented in docs/ACCURACY.md ("Regression floor"): tiny-math, engine exact mode (cache=none,
# float32, greedy, gen_length = steps = block = the training window) on the first FLOOR_N synth test questions
# (seed 0, the model's eval context size). Measured: FLOOR_MEASURED; the floor leaves a margin
# for float summation-order differences across machines / thread counts.
FLOOR_N = 48
FLOOR_MEASURED = 1.0     # 48/48; on the current test split 200/200 on the first 200 (run fig6-synth-test, docs/ACCURACY.md)
FLOOR = 0.9


@pytest.fixture(scope="module")
def tiny_math():
    from dllm_bench.accuracy.points import model_training_info
    from dllm_bench.checkpoints.load import load_model, load_tokenizer, model_dir

    if not ASSET_READY:
        pytest.skip("the trained tiny-math checkpoint is not committed yet (docs/ACCURACY.md: dllm-bench train)")
    path = model_dir("tiny-math")
    return path, load_model("tiny-math", "float32", "cpu"), load_tokenizer(path), model_training_info(path)


def _docs(info: dict, n: int, seed: int = 0):
    from dllm_bench.accuracy.points import generated_docs

    c = info["config"]
    return generated_docs("synth", "test", n, seed, c["eval_facts"], {"ops": c["ops"], "max_value": c["max_value"]})


# ------------------------------------------------------------------------------ the checkpoint
def test_tiny_math_asset_layout(tiny_math):
    from dllm_bench.checkpoints.presets import PRESETS
    from dllm_bench.checkpoints.store import asset_dir

    path, model, tok, info = tiny_math
    assert path == asset_dir(PRESETS["tiny-math"])
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "training.json", "learning_curve.csv", "learning_curve.png"} <= files
    assert sum(p.stat().st_size for p in path.iterdir()) < 10 * 2**20            # "a few MB"
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "llada" and cfg["vocab_size"] == cfg["embedding_size"] == len(tok)
    assert tok.convert_tokens_to_ids("<|mdm_mask|>") == cfg["mask_token_id"] == model.config.mask_token_id
    assert tok.eos_token_id == cfg["eos_token_id"]
    assert info["config"]["objective"] == "llada" and info["config"]["task"] == "synth"
    text = "Question: Bob has 7 marbles. Ann has 2 marbles. How many marbles do Bob and Ann have together?\nAnswer: 7 + 2 = 9\n#### 9"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and len(tok(" Bob", add_special_tokens=False)["input_ids"]) == 1


def test_tiny_math_reaches_documented_floor(tiny_math):
    """Exact mode (the engine with cache=none = LLaDA's sampler) on a fixed synth slice."""
    from dllm_bench.accuracy.backend import PointBackend
    from dllm_bench.accuracy.evaluate import eval_synth_point
    from dllm_bench.accuracy.points import Point

    path, model, tok, info = tiny_math
    w = info["config"]["window"]
    backend = PointBackend(model, tok, Point("dense", "engine", "dense", cache="none"),
                           gen_length=w, block_length=w, steps=w)
    res = eval_synth_point(backend, _docs(info, FLOOR_N))
    assert res.n == FLOOR_N
    assert res.accuracy >= FLOOR, f"tiny-math dense accuracy {res.accuracy:.3f} < documented floor {FLOOR}"
    # continuous batching: the requests really ran concurrently
    assert max(backend.stats[0]["batch_sizes"]) > 1
    # the measured retention behaviour (docs/ACCURACY.md): uniform selection at r = 0.2 kept the
    # needles (500/500), so it must stay above the same floor
    sparse = PointBackend(model, tok, Point("uniform-r0.2", "engine", "sparse", "sparse", "uniform", 0.2),
                          gen_length=w, block_length=w, steps=w)
    assert eval_synth_point(sparse, _docs(info, FLOOR_N)).accuracy >= FLOOR


def test_engine_exact_mode_matches_reference_on_tiny_math(tiny_math):
    from baselines.reference_llada import reference_generate
    from dllm_bench.accuracy.backend import point_system
    from dllm_bench.accuracy.points import Point
    from dllm_bench.checkpoints.load import encode_prompt, load_model
    from engine import SamplingParams
    from workloads.tasks import synth

    path, _, tok, info = tiny_math
    # float64: the engine batches the three requests, the reference runs each alone; in float32 a
    # GEMM rounds a row differently with the batch on some CPU kernels, which could flip a near-tie.
    model = load_model("tiny-math", "float64", "cpu")
    prompts = [encode_prompt(tok, synth.format_prompt(d["question"]), False) for d in _docs(info, 3)]
    w = info["config"]["window"]
    params = SamplingParams(gen_length=w, block_length=w, steps=w)
    outs = point_system(Point("dense", "engine", "dense", cache="none"), model).generate(prompts, params)
    for p, o in zip(prompts, outs, strict=True):
        assert o.token_ids == reference_generate(model, p, params)[0]


# ------------------------------------------------------------------------------ training code
def test_train_is_deterministic_and_engine_loadable(tmp_path):
    import torch

    from dllm_bench.checkpoints.load import load_tokenizer
    from dllm_bench.train.loop import TrainConfig, train
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.models import load_model

    kw = dict(train_facts=(2, 3), eval_facts=2, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1,
              mlp_hidden_size=64, batch_size=4, steps=3, warmup=1, eval_every=3, eval_n=2,
              tokenizer_corpus=200, threads=1)
    a = train(TrainConfig(out=str(tmp_path / "a"), **kw), log=lambda s: None)
    b = train(TrainConfig(out=str(tmp_path / "b"), **kw), log=lambda s: None)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert a["steps_done"] == 3 and [r["loss"] for r in a["curve"]] == [r["loss"] for r in b["curve"]]
    assert (tmp_path / "a" / "learning_curve.csv").is_file() and (tmp_path / "a" / "learning_curve.png").is_file()
    model = load_model(tmp_path / "a", torch.float32)
    tok = load_tokenizer(tmp_path / "a")
    assert tok.mask_token_id == model.config.mask_token_id
    eng = LLMEngine(EngineConfig(cache="sparse", retention=0.5, device="cpu"), model=model)
    out = eng.generate([tok("Question: Ann has 3 pens.", add_special_tokens=False)["input_ids"]],
                       SamplingParams(gen_length=32, block_length=32, steps=32))
    assert len(out[0].token_ids) == 32


def test_diffusion_loss_masks_only_the_answer_region():
    import torch

    from dllm_bench.train.loop import diffusion_loss
    from engine.models import ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_heads=2, n_kv_heads=2, n_layers=1, mlp_hidden_size=32, vocab_size=20,
                      embedding_size=20, mask_token_id=19, eos_token_id=18, pad_token_id=18)
    model = build_model(cfg)
    ids = torch.randint(0, 18, (3, 10))
    valid = torch.ones(3, 10, dtype=torch.bool)
    region = torch.zeros(3, 10, dtype=torch.bool)
    seen = []
    orig = model.hidden_states

    def spy(input_ids, positions, attn):
        seen.append(input_ids.view(3, 10).clone())
        return orig(input_ids, positions, attn)

    model.hidden_states = spy
    loss, _ = diffusion_loss(model, ids, valid, region, 19, "llada", generator=torch.Generator().manual_seed(0))
    assert float(loss.detach()) == 0.0 and not (seen[-1] == 19).any()          # nothing to mask outside the region
    region[:, 6:] = True
    for seed in range(5):
        diffusion_loss(model, ids, valid, region, 19, "llada", generator=torch.Generator().manual_seed(seed))
        assert not (seen[-1][:, :6] == 19).any()                      # prompt never masked
        assert torch.equal(seen[-1][seen[-1] != 19], ids[seen[-1] != 19])


# ------------------------------------------------------------------------------ the command
def _app():
    import typer

    from dllm_bench.commands.accuracy import register

    app = typer.Typer()
    register(app)
    return app


def test_accuracy_command_end_to_end(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    # The plumbing runs on the random-weight `tiny` preset; tiny-math's accuracy is tested above.
    r = CliRunner().invoke(_app(), ["--model", "tiny", "--task", "synth", "--limit", "4", "--retention", "0.1,0.5",
                                    "--json", "--run-id", "t1", "--threads", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    run = tmp_path / "t1"
    assert doc["run_dir"] == str(run) and doc["task"] == "synth" and doc["n"] == 4
    names = [p["point"] for p in doc["points"]]
    assert names == ["dense", "sparse-r1.0", "head-r0.1", "head-r0.5", "uniform-r0.1", "uniform-r0.5"]
    assert all(p["n"] == 4 and 0 <= p["ci_low"] <= p["accuracy"] <= p["ci_high"] <= 1 for p in doc["points"])
    assert doc["points"][0]["cache"] == "none" and doc["analysis"]["n"] == 4
    for f in ("config.json", "summary.json", "metrics.csv", "fig6_accuracy_vs_retention.png"):
        assert (run / f).is_file(), f
    assert json.loads((run / "config.json").read_text())["kind"] == "accuracy"
    rows = [json.loads(x) for x in (run / "points" / "head-r0.1" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and {"question", "target", "completion", "strict-match", "nfe"} <= set(rows[0])
    from dllm_bench.results import latest_run

    assert latest_run("accuracy", tmp_path) == run
    # the table form, one point of a baseline system next to the dense reference
    r = CliRunner().invoke(_app(), ["--model", "tiny", "--limit", "2", "--system", "llada", "--run-id", "t2",
                                    "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert "dense" in r.stdout and "llada" in r.stdout


def test_accuracy_local_data_synth_and_gsm8k(tmp_path, monkeypatch):
    """--data: a local GSM8K-shaped JSONL replaces the built-in data, for synth and for gsm8k
    (through lm-eval, with --num-fewshot); every sample of the run is one of the file's rows."""
    from typer.testing import CliRunner

    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    rows = [{"question": f"Ann has {i} pens. How many pens does the first one have?", "answer": f"#### {i}"}
            for i in range(1, 4)]
    data = tmp_path / "local.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for task, extra in (("synth", []), ("gsm8k", ["--num-fewshot", "0", "--gen-length", "32", "--steps", "32"])):
        r = CliRunner().invoke(_app(), ["--model", "tiny", "--task", task, "--data", str(data), "--limit", "3",
                                        "--retention", "0.5", "--selection", "head", "--no-r1", "--json",
                                        "--run-id", f"local-{task}", "--threads", "1", *extra])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert [p["n"] for p in doc["points"]] == [3, 3]
        cfg = json.loads((tmp_path / f"local-{task}" / "config.json").read_text())
        assert cfg["config"]["data"] == str(data) and cfg["config"]["data_rows"] == 3
        got = [json.loads(x) for x in (tmp_path / f"local-{task}" / "points" / "head-r0.5" / "samples.jsonl").read_text().splitlines()]
        assert sorted(g["question"] for g in got) == sorted(r["question"] for r in rows)


def test_accuracy_score_query_sweep(tmp_path, monkeypatch):
    """--score-query mean,max: both scoring rules as separate curves, with their own analysis."""
    from typer.testing import CliRunner

    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    r = CliRunner().invoke(_app(), ["--model", "tiny", "--limit", "2", "--retention", "0.25,0.5", "--selection",
                                    "head", "--score-query", "mean,max", "--no-r1", "--json", "--threads", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [p["point"] for p in doc["points"]] == ["dense", "head-r0.25", "head-r0.5", "head-max-r0.25", "head-max-r0.5"]
    assert [p["score_query"] for p in doc["points"][1:]] == ["mean", "mean", "max", "max"]
    assert set(doc["analysis"]) >= {"head", "head-max"}
    assert set(doc["analysis"]["head-max"]["accuracy_by_retention"]) == {"0.25", "0.5"}


@pytest.mark.parametrize("args, msg", [
    (["--task", "nope"], "--task"),
    (["--retention", "1.5"], "--retention"),
    (["--retention", "a,b"], "--retention"),
    (["--selection", "heads"], "--selection"),
    (["--system", "vllm"], "--system"),
    (["--limit", "0"], "--limit"),
    (["--model", "tiny", "--gen-length", "48", "--block-length", "32"], "multiple of block_length"),
    (["--model", "no-such-preset"], "unknown model preset"),
    (["--model", "tiny", "--data", "/no/such/file.jsonl"], "data file not found"),
    (["--model", "tiny", "--score-query", "avg"], "--score-query"),
    (["--model", "tiny", "--num-fewshot", "3"], "--num-fewshot"),
    (["--model", "tiny", "--task", "gsm8k", "--num-fewshot", "9"], "--num-fewshot"),
])
def test_accuracy_bad_input_is_a_user_error(args, msg, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dllm_bench.errors import UserError

    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    r = CliRunner().invoke(_app(), args)
    assert isinstance(r.exception, UserError) and msg in str(r.exception)
    assert not any(tmp_path.iterdir())                               # nothing written


def test_accuracy_bad_input_exits_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DLLM_BENCH_RESULTS_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "accuracy", "--retention", "0"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "--retention" in p.stderr


def test_wilson_interval():
    from dllm_bench.accuracy.points import wilson

    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)


# ------------------------------------------------------------------------------ lm-eval
def test_lm_eval_engine_backend_on_tiny_math(tiny_math):
    """lm-eval's simple_evaluate drives the real engine on 5 dllm_synth docs, offline, and scores
    exactly what our own scoring of the same engine outputs gives."""
    from dllm_bench.accuracy.backend import PointBackend
    from dllm_bench.accuracy.evaluate import eval_synth_point
    from dllm_bench.accuracy.lm_eval_model import DllmBenchLM, make_backend, run_lm_eval
    from dllm_bench.accuracy.points import Point

    path, model, tok, info = tiny_math
    k = info["config"]["eval_facts"]
    be = make_backend({"model": "tiny-math", "retention": 0.1, "selection": "head"})
    assert isinstance(be, PointBackend) and be.point.cache == "sparse" and be.point.retention == 0.1
    assert be.gen_length == info["config"]["window"]
    res = run_lm_eval("dllm_synth", {"model": "tiny-math", "threads": 1}, limit=5,
                      metadata={"synth_context_facts": k, "synth_n": 5, "synth_ops": ",".join(info["config"]["ops"]),
                                "synth_max_value": info["config"]["max_value"]})
    got = res["results"]["dllm_synth"]
    assert res["n-samples"]["dllm_synth"]["effective"] == 5
    w = info["config"]["window"]
    ours = eval_synth_point(PointBackend(model, tok, Point("dense", "engine", "dense", cache="none"),
                                         gen_length=w, block_length=w, steps=w), _docs(info, 5))
    assert got["exact_match,strict-match"] == pytest.approx(ours.accuracy)
    assert got["exact_match,flexible-extract"] == pytest.approx(ours.other["flexible-extract"]["accuracy"])
    assert isinstance(DllmBenchLM(model="tiny-math").backend, PointBackend)
