"""The two baseline scenarios: the largest static batch that fits the budget (max-fit) and the
batch the upstream code runs (`batch=upstream`, `--baseline-batch upstream|both`)."""
import pytest

from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.serve.options import resolve_run
from dllm_bench.serve.points import display_label
from dllm_bench.systems.build import WorkloadShape, build_system
from dllm_bench.systems.spec import UPSTREAM_BATCH, apply_baseline_batch, parse_system, parse_systems
from tests.test_serve import RUN_DEFAULTS


def test_upstream_batches_are_the_upstream_codes():
    assert UPSTREAM_BATCH == {"llada": 1, "fast-dllm": 1, "sparse-dllm": 1, "dllm-cache": 2}
    assert parse_system("fast-dllm:batch=upstream").static_batch == (1, "upstream")
    assert parse_system("dllm-cache:batch=upstream").static_batch == (2, "upstream")
    assert parse_system("sparse-dllm:batch=3").static_batch == (3, "fixed")
    assert parse_system("sparse-dllm").static_batch == (None, "max-fit")


def test_baseline_batch_modes():
    vs = parse_systems("engine,engine:cache=dual,fast-dllm,sparse-dllm:keep_ratio=0.3,dllm-cache:batch=4")
    assert [v.label for v in apply_baseline_batch(vs, "max-fit")] == [v.label for v in vs]
    assert [v.label for v in apply_baseline_batch(vs, "upstream")] == [
        "engine", "engine:cache=dual", "fast-dllm:batch=upstream", "sparse-dllm:keep_ratio=0.3,batch=upstream",
        "dllm-cache:batch=4"]                                       # an explicit batch is kept
    both = apply_baseline_batch(vs, "both")
    assert [v.label for v in both] == [
        "engine", "engine:cache=dual", "fast-dllm", "fast-dllm:batch=upstream", "sparse-dllm:keep_ratio=0.3",
        "sparse-dllm:keep_ratio=0.3,batch=upstream", "dllm-cache:batch=4"]
    with pytest.raises(UserError, match="--baseline-batch must be one of"):
        apply_baseline_batch(vs, "all")
    run = resolve_run(**{**RUN_DEFAULTS, "systems": "engine,fast-dllm", "baseline_batch": "both"})
    assert [v.label for v in run.systems] == ["engine", "fast-dllm", "fast-dllm:batch=upstream"]


def test_upstream_scenario_builds_fast_dllm_at_batch_one_and_says_so():
    built = build_system(parse_system("fast-dllm:batch=upstream"), model_dir=inputs.checkpoint_dir("tiny"),
                         memory_budget=None, use_cache=False,
                         shape=WorkloadShape(max_prompt_len=8, max_gen_length=8, block_length=8, steps=None))
    info = built.info
    assert info["scenario_kind"] == "upstream" and info["max_batch_size"] == 1
    assert "upstream" in info["scenario"]
    label = display_label({**info, "system": "fast-dllm:batch=upstream", "is_baseline": True})
    assert label == "fast-dllm:batch=upstream [B=1 upstream]"
