"""CUDA graphs captured at warm-up (`LLMEngine.capture_graphs`, engine.graphs.StepGraphs.capture_all)
rather than in the first served steps. CUDA is faked as in test_cuda_graphs: a fake capturer
replays by plain calls and times as told, so these check what a warm-up capture relies on.

* float64: an engine that captured every bucket at warm-up gives exactly the tokens of one
  without graphs, and its served steps capture nothing more (same canvas shape) and replay;
* every bucket within the token budget is decided, no step counted, the KV pool left empty;
* no graphs (or no Reuse step: cache none) captures nothing; `warm_up` captures first;
* what it captures is `warm_up_plan`'s (the simulator's too), and config.json says where and
  by which rule it keeps graphs.
"""
from __future__ import annotations

import pytest
import torch

from dllm_bench.stepprofile.summary import graph_buckets
from engine import SamplingParams
from engine.graphs import StepGraphs, warm_up_plan
from tests.helpers import make_engine, random_prompts, tiny_model
from tests.test_cuda_graphs import FakeCapture

MODEL = tiny_model(torch.float64, seed=4)
PARAMS = SamplingParams(gen_length=8, steps=8, block_length=4)
PROMPT = 6


def _serve(eng) -> list[list[int]]:
    return [o.token_ids for o in eng.generate(random_prompts(3, PROMPT, seed=5), PARAMS)]


@pytest.mark.parametrize("cache", ["dual", "sparse"])
def test_graphs_captured_at_warm_up_serve_exact_tokens_without_capturing_again(cache):
    want = _serve(make_engine(MODEL, cache=cache, max_num_seqs=8))
    eng = make_engine(MODEL, cache=cache, max_num_seqs=8, cuda_graphs=True)
    cap = FakeCapture(graph_ms=1.0, eager_ms=2.0)
    eng.runner.graphs = g = StepGraphs(eng.runner, cap)
    # A synthetic canvas of one block after PROMPT + 4 tokens: the served requests' Reuse keys.
    assert eng.capture_graphs(4, prompt_len=PROMPT + 4) == len(g.buckets) == 4    # 1, 2, 4, 8
    decided, timed = set(g.entries), list(cap.timed)
    assert timed == ["eager", "graph"] * 4
    assert all(r["decision"] == "graph" and r["steps"] == 0 for r in graph_buckets(g))
    assert g.replays == 0 and eng.pool.used == 0 and eng.counters["steps"] == 0
    assert _serve(eng) == want
    assert set(g.entries) == decided and cap.timed == timed          # nothing captured while serving
    assert g.replays > 0 and sum(r["steps"] for r in graph_buckets(g)) == g.replays


def test_warm_up_capture_stops_at_the_token_budget_and_leaves_the_pool_empty():
    eng = make_engine(MODEL, cache="dual", max_num_seqs=8, max_num_batched_tokens=16, cuda_graphs=True)
    assert eng.capture_graphs(4, prompt_len=3) == 3                   # buckets 1, 2, 4: 8 x 4 > 16
    assert sorted(k[0] for k in eng.runner.graphs.entries) == [1, 2, 4]
    assert all(r["decision"] == "plain" for r in graph_buckets(eng.runner.graphs))
    assert eng.pool.used == 0
    assert eng.capture_graphs(4, prompt_len=3) == 0                   # already decided


def test_warm_up_capture_stops_at_the_bucket_holding_the_run_s_largest_batch():
    eng = make_engine(MODEL, cache="dual", max_num_seqs=24, cuda_graphs=True)
    # what it captures is decided without a model (the simulator asks the same: warm_up_plan)
    assert warm_up_plan(eng.config, 4, 3, 3, eng.pool.can_reserve) == ("dual", 7, [1, 2, 4])
    assert eng.capture_graphs(4, prompt_len=3, max_batch=3) == 3      # 1, 2, 4 (the one holding 3)
    assert sorted(k[0] for k in eng.runner.graphs.entries) == [1, 2, 4]
    assert warm_up_plan(eng.config, 4, 3, 3, lambda slots: slots < 4 * 7)[2] == [1, 2]   # a pool holding less
    assert eng.capture_graphs(4, prompt_len=3, max_batch=100) == 3    # past max_num_seqs: the rest, 8, 16, 24
    assert sorted(k[0] for k in eng.runner.graphs.entries) == [1, 2, 4, 8, 16, 24]


def test_nothing_to_capture_without_graphs_or_reuse_steps():
    assert make_engine(MODEL, cache="dual", cuda_graphs=False).capture_graphs(4) == 0
    eng = make_engine(MODEL, cache="none", cuda_graphs=True)
    assert eng.capture_graphs(4) == 0 and not eng.runner.graphs.entries


def test_warm_up_captures_before_its_requests():
    from dllm_bench.systems.build import warm_up

    calls = []

    class System:
        def capture_graphs(self, block_length, prompt_len, max_batch):
            calls.append(("capture", block_length, prompt_len, max_batch))

        def generate(self, prompts, params):
            calls.append(("generate", len(prompts), params.block_length))

    warm_up(System(), [1, 2, 3], 4, n=2, max_batch=32)
    assert calls == [("capture", 4, 3, 32), ("generate", 2, 4)]
    warm_up(System(), [1, 2, 3], 4, n=0)                              # no warm-up asked: nothing
    assert len(calls) == 2


@pytest.mark.parametrize("num_warmups, where", [(1, "warm-up"), (0, "in-point")])
def test_a_serve_run_records_where_its_graphs_are_captured(num_warmups, where):
    # config.json's graph_capture: what `simulate --fit` replays a measured run with (serve's and,
    # through ServeRun.describe, ablate's and sweep's)
    from dllm_bench.serve.options import ServeOptions, resolve_run
    from dllm_bench.serve.run import _run_config
    from dllm_bench.systems.build import warm_up_batch
    from tests.test_serve import RUN_DEFAULTS

    run = resolve_run(ServeOptions(**{**RUN_DEFAULTS, "num_warmups": num_warmups}))
    assert run.describe()["graph_capture"] == _run_config(run)["graph_capture"] == where
    # and which graphs they keep (graph_keep): on CUDA only those that timed faster than eager
    assert run.describe()["graph_keep"] == _run_config(run)["graph_keep"] == "timed"
    assert (warm_up_batch(32, None), warm_up_batch(32, 8), warm_up_batch(3, 8)) == (32, 8, 3)
