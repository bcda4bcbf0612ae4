"""`dllm-bench profile --device-memory`: LLaDA-8B's memory plan on GPUs we do not have, from its
shapes alone (no weights, no GPU), term by term."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REAL = Path(__file__).resolve().parent / "data" / "llada-8b-instruct"
GiB = 2**30


def _profile(*args: str):
    import typer
    from typer.testing import CliRunner

    from dllm_bench.commands.profile import register

    app = typer.Typer()
    register(app)
    return CliRunner().invoke(app, list(args))


def _plan(*args: str) -> dict:
    r = _profile(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("gib", [24, 48, 80])
def test_llada_8b_plan_term_by_term(gib):
    doc = _plan("--model", "llada-8b", "--device-memory", f"{gib}GiB")
    assert doc["dtype"] == "bfloat16" and doc["n_params"] == 8_015_581_184
    d, f, v, layers, T = 4096, 12288, 126464, 32, 4096
    for label, rows in (("logit budget", 1024), ("monolithic", T)):
        p = doc["plans"][label]
        assert p["budget_bytes"] == int(gib * GiB * 0.9)
        assert abs(p["weights_bytes"] - 2 * doc["n_params"]) < 1e-4 * p["weights_bytes"]   # bf16
        assert p["activation_bytes"] == T * (3 * f + 4 * d) * 2
        assert (p["logit_rows"], p["logit_bytes"]) == (rows, rows * v * 8)
        assert p["kv_bytes_per_token"] == 2 * layers * d * 2
        free = (p["budget_bytes"] - p["weights_bytes"] - p["context_bytes"] - p["activation_bytes"]
                - p["logit_bytes"])
        assert p["kv_pool_bytes"] == free and p["kv_tokens"] == free // p["kv_bytes_per_token"] > 0
        need = int((256 + 256 - 32) * 0.5) + 32  # sparse, r = 0.5: half the context outside the block, plus it
        assert p["requests_that_fit"] == p["kv_tokens"] // need
        assert p["concurrency"] == min(p["requests_that_fit"], 256)
    budgeted, mono = doc["plans"]["logit budget"], doc["plans"]["monolithic"]
    assert budgeted["kv_tokens"] - mono["kv_tokens"] == 3 * 1024 * v * 8 // budgeted["kv_bytes_per_token"]


def test_plan_agrees_with_the_simulators_kv_pool():
    from dllm_bench.checkpoints.load import load_shape
    from dllm_bench.simulate.cost_model import ModelShape
    from dllm_bench.simulate.memory import engine_kv_tokens

    doc = _plan("--model", str(REAL), "--device-memory", "l40s", "--max-num-batched-tokens", "2048")
    shape = ModelShape.from_config(load_shape(str(REAL)), 2)
    assert doc["plans"]["logit budget"]["kv_tokens"] == engine_kv_tokens(shape, doc["device_memory_bytes"] * 0.9, 2048, 1024)


def test_a_plan_with_no_room_says_how_short_it_is():
    r = _profile("--model", "llada-8b", "--device-memory", "16GiB")
    assert r.exit_code == 0, r.output
    assert "logit budget: no KV pool" in r.stdout and "MiB short" in r.stdout


@pytest.mark.parametrize("args, msg", [
    (["--device-memory", "lots"], "--device-memory takes a size"),
    (["--device-memory", "24GiB", "--memory-budget", "4GiB"], "not both"),
    (["--device-memory", "24GiB", "--dtype", "int8"], "--dtype must be one of"),
])
def test_bad_plan_options(args, msg):
    from dllm_bench.errors import UserError

    r = _profile("--model", "llada-8b", *args)
    assert isinstance(r.exception, UserError) and msg in str(r.exception)
