"""The two baseline scenarios: the largest static batch that fits the budget (max-fit) and the
batch the upstream code runs (`batch=upstream`, `--baseline-batch upstream|both`)."""
import pytest

from baselines.profile import measure_run
from dllm_bench import inputs
from dllm_bench.errors import UserError
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.serve.points import display_label
from dllm_bench.systems.build import STATIC_PROFILE_STEPS, WorkloadShape, build_system
from dllm_bench.systems.spec import UPSTREAM_BATCH, apply_baseline_batch, parse_system, parse_systems
from engine.models import load_model
from engine.profiler import weights_bytes
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
    run = resolve_run(ServeOptions(**{**RUN_DEFAULTS, "systems": "engine,fast-dllm", "baseline_batch": "both"}))
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


def test_max_fit_search_stops_at_the_points_request_count(tmp_path):
    """A static batch never holds more requests than the point has, so the max-fit search stops
    there, and the label says the batch took them all (the budget may hold more)."""
    model = load_model(inputs.checkpoint_dir("tiny"))
    shape = dict(max_prompt_len=8, max_gen_length=8, block_length=8, steps=None)
    peaks = [measure_run(model, b, 8, 8, 8, None, "fast-dllm", run_steps=STATIC_PROFILE_STEPS) for b in (1, 3, 4)][1:]
    budget = weights_bytes(model) + (peaks[0] + peaks[1]) // 2          # B = 3 fits, 4 does not
    kw = dict(model_dir=inputs.checkpoint_dir("tiny"), memory_budget=budget, cache_dir=tmp_path, model=model)
    capped = build_system(parse_system("fast-dllm"), shape=WorkloadShape(**shape, max_requests=2), **kw).info
    assert capped["max_batch_size"] == 2 and capped["batch_capped"] and "every request" in capped["scenario"]
    label = display_label({**capped, "system": "fast-dllm", "is_baseline": True})
    assert label == "fast-dllm [B=2 max-fit (all)]"
    free = build_system(parse_system("fast-dllm"), shape=WorkloadShape(**shape, max_requests=5), **kw).info
    assert free["max_batch_size"] == 3 and not free["batch_capped"]


def test_serve_profiles_for_its_largest_workload():
    from dllm_bench.serve.workload import workload_shape
    run = resolve_run(ServeOptions(**{**RUN_DEFAULTS, "systems": "fast-dllm", "num_prompts": 3}))
    assert workload_shape(run).max_requests == max(len(wl) for wl in run.workloads.values()) == 3


@pytest.mark.parametrize("spec", ["engine", "fast-dllm:batch=2"])
def test_budget_probe_meters_the_whole_workload_at_once_then_frees_it(spec):
    """A CPU replay runs unmetered (the per-operator meter slowed it unequally); the point's
    peak is measured afterwards on the whole workload submitted at once, over the steps a
    static-batch profile meters, and the probe leaves nothing running."""
    import torch

    from dllm_bench.serve.worker import budget_probe
    from engine.profiler import MemoryMeter
    from engine.sampling import SamplingParams

    def build():
        return build_system(parse_system(spec), model_dir=inputs.checkpoint_dir("tiny"), memory_budget=None,
                            shape=WorkloadShape(max_prompt_len=9, max_gen_length=16, block_length=8, steps=None),
                            use_cache=False, engine_defaults={"max_num_batched_tokens": 64}).system
    g = torch.Generator().manual_seed(0)
    work = [{"prompt_ids": torch.randint(0, 200, (n,), generator=g).tolist(), "gen_length": 16} for n in (5, 9)]
    params = lambda it: SamplingParams(gen_length=it["gen_length"], steps=16, block_length=8)  # noqa: E731
    system = build()
    peak = budget_probe(system, work, params)
    assert peak > 0 and not system.has_unfinished()
    fresh = build()                                       # the same three steps, metered by hand
    for it in work:
        fresh.add_request(it["prompt_ids"], params(it))
    with MemoryMeter("cpu") as m:
        for _ in range(STATIC_PROFILE_STEPS):
            fresh.step()
    assert peak == m.peak_bytes
