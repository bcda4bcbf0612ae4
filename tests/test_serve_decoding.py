"""`serve --decoding` and the trained models as serving models: what each system runs for a
policy (the worker's spec), a tiny run recording per-request TPF and steps per block, the
`trained` preset and its `--dataset task` workload."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dllm_bench.errors import UserError
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.serve.presets import preset_for
from dllm_bench.serve.process import worker_spec
from dllm_bench.serve.workload import shape_of

REPO = Path(__file__).resolve().parent.parent


def _spec(decoding: str, systems: str) -> dict:
    run = resolve_run(ServeOptions(model="tiny", systems=systems, num_prompts=2, decoding=decoding))
    wl = next(iter(run.workloads.values()))
    return {v.label: worker_spec(run, v, wl, shape_of(wl, run.preset.block_length)) for v in run.systems}


def test_each_system_gets_the_policy_it_has_upstream():
    specs = _spec("threshold:0.9", "engine,fast-dllm,sparse-dllm,fast-dllm:threshold=0.5")
    assert {k: s["sampling"]["decoding"] for k, s in specs.items()} == {
        "engine": "threshold:0.9", "fast-dllm": "threshold:0.9", "sparse-dllm": "fixed",
        "fast-dllm:threshold=0.5": "threshold:0.5"}
    assert specs["fast-dllm"]["baseline_defaults"]["fast-dllm"]["threshold"] == 0.9
    assert specs["engine"]["baseline_defaults"]["fast-dllm"]["threshold"] is None     # only the variant's own spec
    factor = _spec("factor:2", "fast-dllm")["fast-dllm"]
    assert factor["sampling"]["decoding"] == "factor:2" and factor["baseline_defaults"]["fast-dllm"]["factor"] == 2.0
    # no entropy rule upstream: Fast-dLLM runs fixed under it, the engine runs it
    ent = _spec("entropy:0.5", "engine,fast-dllm")
    assert ent["fast-dllm"]["sampling"]["decoding"] == "fixed" and ent["engine"]["sampling"]["decoding"] == "entropy:0.5"
    with pytest.raises(UserError, match="0 < τ ≤ 1"):
        _spec("threshold:0", "engine")


def test_the_policy_travels_as_one_object_and_is_text_only_in_the_workers_spec():
    """Parsed once (resolve_run): the run and each system hold a Decoding; the worker's spec, the
    process boundary, holds its text, which the worker parses back to the same policy."""
    from engine.decoding import Decoding

    run = resolve_run(ServeOptions(model="tiny", systems="engine", num_prompts=2, decoding="Threshold:0.90"))
    want = Decoding("threshold", 0.9)
    assert run.decoding == want and run.decoding_for(run.systems[0]).decoding == want
    wl = next(iter(run.workloads.values()))
    text = worker_spec(run, run.systems[0], wl, shape_of(wl, run.preset.block_length))["sampling"]["decoding"]
    assert text == "threshold:0.9" and Decoding.parse(text) == want


def test_serve_decoding_records_tpf_and_steps_per_block(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # random weights rarely reach a high threshold: a tiny one commits a whole block per forward
    r = subprocess.run([sys.executable, "-m", "dllm_bench.cli", "serve", "--model", "tiny", "--num-prompts", "3",
                        "--num-warmups", "0", "--rps", "inf", "--systems", "engine,sparse-dllm:batch=3",
                        "--decoding", "threshold:0.0001", "--result-dir", str(tmp_path), "--run-id", "d", "--json"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    points = {p["system"]: p for p in json.loads(r.stdout)["points"]}
    eng, sd = points["engine"], points["sparse-dllm:batch=3"]
    block = 8                                                        # the tiny preset's
    assert eng["decoding"] == "threshold:0.0001" and eng["mean_tpf"] == eng["p50_tpf"] == eng["p90_tpf"] == block
    assert eng["mean_steps_per_block"] == 1
    assert sd["decoding"] == "fixed" and "no parallel decoding upstream" in sd["decoding_note"]
    assert sd["mean_tpf"] == 1 and sd["mean_steps_per_block"] == block
    reqs = [json.loads(x) for x in (tmp_path / "d" / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) == 6
    for q in reqs:
        assert q["tpf"] == q["output_len"] / q["nfe"] and sum(q["steps_per_block"]) == q["nfe"]
        # ITL at block commit: one gap per block after the first
        assert len(q["itl"]) == q["output_len"] // block - 1
    assert "Mean TPF per request:" in r.stderr and "fixed (none upstream)" in r.stderr


def test_trained_models_serve_their_own_task():
    assert preset_for(None, "synth-cot").name == "trained"
    p = preset_for(None, "tiny-math")                 # trained on synth, answer window 16
    assert (p.name, p.model, p.gen_length, p.block_length, p.dataset) == ("trained", "tiny-math", 16, 16, "task")
    assert preset_for(None, "tiny").name == "tiny"
    run = resolve_run(ServeOptions(model="synth-cot-s1", num_prompts=3, decoding="threshold:0.9"))
    (wl,) = run.workloads.values()
    from dllm_bench.checkpoints.load import load_tokenizer

    tok = load_tokenizer(run.model_dir)
    texts = [tok.decode(r.prompt_ids) for r in wl]
    assert all(t.startswith("Question:") and t.rstrip().endswith("Answer:") for t in texts)
    assert len(set(texts)) == 3 and {r.gen_length for r in wl} == {32}
    with pytest.raises(UserError, match="training.json"):
        resolve_run(ServeOptions(model="tiny", dataset="task", num_prompts=2))


def test_no_gpu_projection_for_parallel_decoding_or_a_trained_models_task():
    from dllm_bench.simulate.projection import skip_reason

    assert skip_reason(resolve_run(ServeOptions(model="tiny", systems="engine", num_prompts=2))) is None
    assert "--steps-per-block" in skip_reason(resolve_run(ServeOptions(model="tiny", systems="engine", num_prompts=2,
                                                                        decoding="threshold:0.9")))
    assert "--dataset task" in skip_reason(resolve_run(ServeOptions(model="synth-cot", systems="engine",
                                                                     num_prompts=2)))
