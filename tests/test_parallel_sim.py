"""Tensor parallelism on GPUs we do not have: a rank's share of LLaDA-8B (shapes), its cost
(compute split by N plus the all-reduces on the profile's link), its memory plan
(`profile --device-memory --tensor-parallel-size`) and `simulate --tensor-parallel-size`."""
from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from dllm_bench.errors import UserError
from dllm_bench.simulate import hardware
from dllm_bench.simulate.cost_model import (
    CostModel,
    Efficiency,
    Forward,
    HostCost,
    LayerPass,
    ModelShape,
    Seg,
)
from dllm_bench.simulate.implementations import get_impl
from dllm_bench.simulate.parallel import ParallelCostModel

LLADA_8B = ModelShape(d=4096, layers=32, heads=32, kv_heads=32, head_dim=128, ffn=12288, vocab=126464, wbytes=2)


def _app(register) -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_a_rank_holds_half_of_every_split_dimension():
    half = LLADA_8B.rank_share(2)
    assert (half.heads, half.kv_heads, half.ffn, half.vocab, half.d) == (16, 16, 6144, 63232, 4096)
    assert half.n_params * 2 == LLADA_8B.n_params
    assert half.kv_bytes_per_token * 2 == LLADA_8B.kv_bytes_per_token
    assert LLADA_8B.rank_share(1) is LLADA_8B
    with pytest.raises(ValueError, match="does not divide heads = 32"):
        LLADA_8B.rank_share(3)


def _cost(shape: ModelShape, hw) -> CostModel:
    return CostModel(shape, hw.peak_flops, hw.bandwidth, Efficiency(), get_impl("engine"), HostCost())


def _forward(tokens: int, rows: int = 0, chunk: int = 0) -> Forward:
    return Forward((LayerPass(32, (Seg(tokens, tokens),)),), rows=rows, n_seq=1, softmax_rows=rows, lm_chunk=chunk)


def test_tp2_step_is_half_the_flops_plus_the_collectives():
    hw = hardware.load("rtx4090")
    one, tp = _cost(LLADA_8B, hw), ParallelCostModel(_cost(LLADA_8B.rank_share(2), hw), 2, hw.link)
    fw = _forward(1024, rows=512, chunk=256)
    assert tp.step(fw).flops * 2 == one.step(fw).flops
    assert tp.step(fw).t == pytest.approx(tp.rank.step(fw).t + tp.comm(fw))
    # 65 all-reduces (two per layer, one for the embedding) of tokens x d bf16 values; a ring
    # all-reduce sends 2(N-1)/N of the message per rank, the whole message at N = 2: the comm
    # time grows by 65·d·2 B / bandwidth per token, on top of one link latency per collective.
    extra = tp.comm(_forward(2048, rows=512, chunk=256)) - tp.comm(fw)
    assert extra == pytest.approx(65 * 1024 * 4096 * 2 / hw.link.bandwidth)
    assert tp.comm(_forward(1)) == pytest.approx(65 * (hw.link.latency + 4096 * 2 / hw.link.bandwidth))
    # the decode: one all-gather per logit chunk, the same rows' candidates in all
    assert tp.comm(_forward(1, rows=512, chunk=256)) - tp.comm(_forward(1, rows=512, chunk=512)) == pytest.approx(
        hw.link.latency)


def _plan(*args) -> dict:
    from dllm_bench.commands.profile import register

    r = CliRunner().invoke(_app(register), ["--model", "llada-8b", "--device-memory", "rtx4090", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_profile_plans_one_of_n_gpus():
    one, two = _plan()["plans"]["logit budget"], _plan("--tensor-parallel-size", "2")["plans"]["logit budget"]
    assert two["budget_bytes"] == one["budget_bytes"]                       # each GPU has its own budget
    assert two["weights_bytes"] * 2 == one["weights_bytes"]
    assert two["logit_bytes"] * 2 == one["logit_bytes"] and two["kv_bytes_per_token"] * 2 == one["kv_bytes_per_token"]
    assert two["activation_bytes"] < one["activation_bytes"] and two["context_bytes"] == one["context_bytes"]
    assert two["kv_pool_bytes"] == (two["budget_bytes"] - two["weights_bytes"] - two["context_bytes"]
                                    - two["activation_bytes"] - two["logit_bytes"])
    assert two["kv_tokens"] == two["kv_pool_bytes"] // two["kv_bytes_per_token"]
    # half the bytes per token in more than the freed memory: more than twice the tokens
    assert two["kv_tokens"] > 2 * one["kv_tokens"] and two["requests_that_fit"] > 2 * one["requests_that_fit"]


def _simulate(tmp_path, *args):
    from dllm_bench.commands.simulate import register

    return CliRunner().invoke(_app(register), ["--hardware", "rtx4090", "--preset", "paper", "--num-prompts", "24",
                                               "--rps", "1.0", "--result-dir", str(tmp_path), "--json", *args])


def test_simulate_tp2_on_two_4090s(tmp_path):
    """LLaDA-8B by its shape, the engine on one and on two 4090s in one run (a variant knob): two
    hold ~11x the KV tokens per GPU, so more requests run at once and the run ends sooner."""
    r = _simulate(tmp_path, "--systems", "engine,engine:tensor_parallel_size=2", "--run-id", "tp")
    assert r.exit_code == 0, r.output
    one, two = sorted(json.loads(r.stdout)["points"], key=lambda p: p["engine_config"]["tensor_parallel_size"])
    assert (one["engine_config"]["tensor_parallel_size"], two["engine_config"]["tensor_parallel_size"]) == (1, 2)
    assert two["kv_pool_tokens"] > 10 * one["kv_pool_tokens"]
    assert two["stats"]["kv_pool_bytes"] / two["kv_pool_tokens"] * 2 == one["stats"]["kv_pool_bytes"] / one["kv_pool_tokens"]
    assert two["stats"]["max_batch_size_seen"] > one["stats"]["max_batch_size_seen"]
    assert two["duration_s"] < one["duration_s"]


def test_the_flag_sets_the_engine_and_leaves_baselines_on_one_gpu(tmp_path):
    runs = []
    for n in ("1", "2"):
        r = _simulate(tmp_path, "--systems", "engine,fast-dllm:batch=2", "--tensor-parallel-size", n, "--run-id", n)
        assert r.exit_code == 0, r.output
        runs.append({p["system_name"]: p for p in json.loads(r.stdout)["points"]})
    assert runs[1]["engine"]["engine_config"]["tensor_parallel_size"] == 2
    assert runs[1]["engine"]["duration_s"] != runs[0]["engine"]["duration_s"]
    assert runs[1]["fast-dllm"]["duration_s"] == runs[0]["fast-dllm"]["duration_s"]


def test_simulate_tp_needs_a_link_between_gpus(tmp_path):
    r = _simulate(tmp_path, "--tensor-parallel-size", "2", "--hardware", "l40s", "--systems", "engine")
    assert isinstance(r.exception, UserError) and "has no 'link' between GPUs" in str(r.exception), r.output
