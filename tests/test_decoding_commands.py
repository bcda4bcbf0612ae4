"""--decoding on the other commands: simulate replays a steps-per-block distribution (declared or
recorded), accuracy records TPF per point and sample, generate refuses a policy a baseline has
no rule for."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from dllm_bench.errors import UserError
from dllm_bench.serve.options import ServeOptions
from dllm_bench.simulate import hardware
from dllm_bench.simulate.options import simulation
from dllm_bench.simulate.simulator import simulate_point
from dllm_bench.simulate.steps_per_block import parse as parse_steps
from engine.decoding import Decoding

SYSTEMS = "engine,fast-dllm:batch=4"


def _simulate(decoding: str = "fixed", steps: str | None = None, **kw) -> dict:
    opts = ServeOptions(model="tiny", systems=SYSTEMS, num_prompts=4, rps="inf", decoding=decoding, **kw)
    run, setup = simulation(opts, hardware.load("cpu"), steps_per_block=steps)
    (wl,) = run.workloads.values()
    return {v.label: simulate_point(v, setup, wl, run.preset.block_length)["result"] for v in run.systems}


def test_simulate_with_a_declared_steps_per_block_takes_fewer_steps_than_fixed():
    fixed, par = _simulate(), _simulate("threshold:0.9", "2")
    block = 8                                                           # the tiny preset's
    for label in fixed:
        f, p = fixed[label], par[label]
        assert all(r["steps_per_block"] == [block] * (r["output_len"] // block) for r in f["records"])
        assert all(r["steps_per_block"] == [2] * (r["output_len"] // block) for r in p["records"])
        assert p["stats"]["forwards"] < f["stats"]["forwards"] and p["duration"] < f["duration"]
    # the same request draws the same plan on every system (the static batch ends a block at its slowest row)
    # (one output length: the four requests are one static batch)
    drawn = _simulate("threshold:0.9", "1,2,3", gen_length=16)
    plans = [r["steps_per_block"] for r in drawn["engine"]["records"]]
    assert {v for p in plans for v in p} <= {1, 2, 3} and len({tuple(p) for p in plans}) > 1
    slowest = [max(p[i] for p in plans) for i in range(2)]
    assert all(r["steps_per_block"] == slowest for r in drawn["fast-dllm:batch=4"]["records"])


def test_simulate_replays_a_recorded_distribution(tmp_path):
    rec = tmp_path / "requests.jsonl"
    rec.write_text("\n".join(json.dumps(r) for r in (
        {"status": "finished", "steps_per_block": [1, 3]}, {"status": "finished", "steps_per_block": [2, 2]},
        {"status": "rejected"})) + "\n")
    plan = parse_steps(str(tmp_path))
    assert plan.lists == ((1, 3), (2, 2)) and not plan.declared
    res = _simulate("factor:1", str(rec))
    for r in res["engine"]["records"]:              # each request replays one recorded request's blocks
        blocks = r["output_len"] // 8
        assert r["steps_per_block"] in ([1, 3][:blocks], [2, 2][:blocks], [1], [2])
    assert parse_steps("2,3").draw("req-1", 5) == parse_steps("2,3").draw("req-1", 5)


@pytest.mark.parametrize("decoding,steps,msg", [
    ("fixed", "2", "give the policy it was recorded under"),
    ("threshold:0.9", None, "--steps-per-block"),
    ("threshold:0.9", "9", "9 forwards for a block of 8"),
    ("threshold:0.9", "0", ">= 1"),
])
def test_simulate_parallel_decoding_needs_a_plan(decoding, steps, msg):
    with pytest.raises(UserError, match=msg):
        _simulate(decoding, steps)


def _app(module):
    app = typer.Typer()
    module.register(app)
    return app


def test_accuracy_decoding_records_tpf(tmp_path, monkeypatch):
    from dllm_bench.commands import accuracy

    monkeypatch.setenv("DLLM_BENCH_RESULTS_DIR", str(tmp_path))
    r = CliRunner().invoke(_app(accuracy), ["--model", "synth-cot", "--limit", "3", "--retention", "0.5", "--selection",
                                            "head", "--system", "engine,sparse-dllm", "--no-r1", "--threads", "1",
                                            "--decoding", "threshold:0.9", "--run-id", "a", "--json"])
    assert r.exit_code == 0, r.output
    pts = {p["point"]: p for p in json.loads(r.stdout)["points"]}
    assert pts["dense"]["decoding"] == "threshold:0.9" and pts["dense"]["tpf_mean"] > 1       # real confidences
    assert pts["sparse-dllm-r0.5"]["decoding"] == "fixed" and pts["sparse-dllm-r0.5"]["tpf_mean"] == 1
    assert "no parallel decoding upstream" in pts["sparse-dllm-r0.5"]["decoding_note"]
    sample = json.loads((tmp_path / "a" / "points" / "dense" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["tpf"] == 32 / sample["nfe"] and sum(sample["steps_per_block"]) == sample["nfe"]
    assert json.loads((tmp_path / "a" / "config.json").read_text())["config"]["decoding"] == "threshold:0.9"


def test_generate_decoding(monkeypatch):
    from dllm_bench.commands import generate

    app = _app(generate)
    r = CliRunner().invoke(app, ["--model", "tiny", "--prompt-ids", "1,2,3", "--gen-length", "16", "--block-length",
                                 "8", "--decoding", "threshold:0.0001", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["outputs"][0]
    assert out["steps_per_block"] == [1, 1] and out["tpf"] == 8 and out["nfe"] == 2
    r = CliRunner().invoke(app, ["--model", "tiny", "--prompt-ids", "1,2,3", "--system", "dllm-cache",
                                 "--decoding", "threshold:0.9"])
    assert isinstance(r.exception, UserError) and "fixed only" in str(r.exception)
    r = CliRunner().invoke(app, ["--model", "tiny", "--prompt-ids", "1,2,3", "--system", "fast-dllm",
                                 "--decoding", "factor:1", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["stats"]["knobs"]["factor"] == 1.0


def test_serve_endpoint_sends_the_policy_with_the_dllm_extras():
    from dllm_bench.serve.endpoint import Endpoint, request_body
    from dllm_bench.serve.response import Outcome, record

    item = {"prompt_ids": [1, 2, 3], "gen_length": 16}
    body = request_body(Endpoint("http://h/v1", "m", decoding=Decoding("threshold", 0.9)), item, block_length=8, decode=None)
    assert body["threshold"] == 0.9 and "factor" not in body and "entropy" not in body
    assert request_body(Endpoint("http://h/v1", "m", decoding=Decoding("entropy", 0.5)), item, block_length=8,
                        decode=None)["entropy"] == 0.5
    for ep in (Endpoint("http://h/v1", "m"), Endpoint("http://h/v1", "m", dllm_extras=False, decoding=Decoding("factor", 1.0))):
        assert not {"threshold", "factor", "entropy"} & set(request_body(ep, item, block_length=8, decode=None))
    out = Outcome()
    out.usage, out.finished = {"prompt_tokens": 3, "completion_tokens": 16}, 1.0
    out.dllm = {"nfe": 4, "tpf": 4.0, "steps_per_block": [2, 2]}
    rec = record("r", 3, out, 0.0, 0.0, 0.0)
    assert rec["tpf"] == 4.0 and rec["steps_per_block"] == [2, 2] and rec["nfe"] == 4


def test_server_default_decoding_applies_to_requests_that_name_no_rule():
    from types import SimpleNamespace

    from dllm_bench.server.app import sampling_params
    from dllm_bench.server.protocol import CompletionRequest

    state = SimpleNamespace(block_length=8, decoding=Decoding("threshold", 0.9))
    assert sampling_params(state, CompletionRequest(prompt="hi", max_tokens=8)).decoding == Decoding("threshold", 0.9)
    assert sampling_params(state, CompletionRequest(prompt="hi", max_tokens=8, factor=2.0)).decoding == Decoding("factor", 2.0)
    assert sampling_params(SimpleNamespace(block_length=8, decoding=Decoding()),
                           CompletionRequest(prompt="hi", max_tokens=8)).decoding == Decoding()
