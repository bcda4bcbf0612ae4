"""`cache=auto` (engine.cache_mode): every request served dual while the KV pool holds it, sparse
when memory binds, its mode chosen at admission and kept for its life.

* the rule alone (a pure function), case by case;
* float64: with a pool that holds everyone, auto is the dual engine (tokens and NFE); with a pool
  too small for everyone as dual, the modes are the ones the rule gives (worked out by hand
  below) and every request's tokens equal the same request's alone in its mode, through steps
  that mix dual and sparse members (Refresh-store beside Refresh-select, Reuse beside Reuse,
  padded bucket steps), under the phase and the look-ahead scheduler;
* a property test: the pool is never over-committed, each admission follows the rule's
  meaning (recomputed here from the needs, not by calling it), and every request finishes.
"""
from __future__ import annotations

import math
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import SamplingParams
from engine.cache_mode import admission_mode
from engine.request import Phase
from tests.helpers import make_engine, random_prompts, run_alone, tiny_model
from tests.test_engine_exact import _mixed_workload
from tests.test_scheduler_properties import MODEL, fake_run

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_model(F64)


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize("free, dual, sparse, behind, mode", [
    (None, 30, 12, [99, 99], "dual"),        # an unbounded pool never binds
    (100, 30, 12, [20, 20, 30], "dual"),     # 30 + 70 = 100: everyone queued still fits as sparse
    (100, 30, 12, [20, 20, 31], "sparse"),   # one slot short: this one goes sparse
    (12, 30, 12, [], "sparse"),              # dual does not fit, sparse does
    (11, 30, 12, [], None),                  # neither: it waits
    (30, 30, 12, [], "dual"),                # nobody behind: dual if it fits at all
    (30, 30, 30, [5], "dual"),               # retention 1: sparse would save nothing
    (29, 30, 30, [], None),
])
def test_admission_rule(free, dual, sparse, behind, mode):
    assert admission_mode(free, dual, sparse, iter(behind)) == mode


# ---------------------------------------------------------------- float64 tokens
def test_auto_with_room_for_everyone_is_the_dual_engine(model):
    prompts, params = _mixed_workload()
    kw = dict(retention=0.5, max_num_logits=5)
    dual = make_engine(model, cache="dual", **kw).generate(prompts, params)
    eng = make_engine(model, cache="auto", **kw)
    auto = eng.generate(prompts, params)
    assert [(o.token_ids, o.nfe) for o in auto] == [(o.token_ids, o.nfe) for o in dual]
    assert {o.cache for o in auto} == {"dual"} and {o.cache for o in dual} == {"dual"}
    st_ = eng.stats()
    assert (st_["requests_dual"], st_["requests_sparse"]) == (len(prompts), 0)


def test_modes_follow_the_rule_and_each_request_equals_itself_alone(model):
    """Five requests at once, block 8, gen 16, retention 0.5, a pool of 60 slots. Canvases
    21, 25, 19, 28, 23: dual needs = the canvas, sparse needs ⌊0.5·(L-8)⌋ + 8 = 14, 16, 13, 18, 15.
    r0: 21 + (16+13+18+15) = 83 > 60 -> sparse (free 46); r1: 25 + 46 > 46 -> sparse (30);
    r2: 19 + 33 > 30 -> sparse (17); r3: neither 28 nor 18 fits 17 -> waits, and r4 behind it.
    When r0-r2 finish (together): r3: 28 + 15 <= 60 -> dual; r4: 23 <= 32 -> dual."""
    prompts = random_prompts(5, [5, 9, 3, 12, 7], seed=1)
    sp = SamplingParams(gen_length=16, steps=8, block_length=8)
    kw = dict(retention=0.5, dtype="float64")
    eng = make_engine(model, cache="auto", kv_pool_tokens=60, **kw)
    outs = eng.generate(prompts, sp)
    assert [o.cache for o in outs] == ["sparse", "sparse", "sparse", "dual", "dual"]
    assert [o.kv_tokens for o in outs] == [14, 16, 13, 28, 23]
    assert outs[3].admitted_time >= max(o.finished_time for o in outs[:3])
    assert eng.pool.peak_used <= 60 and eng.pool.used == 0
    for o, p in zip(outs, prompts, strict=True):
        assert o.token_ids == run_alone(model, p, sp, cache=o.cache, **kw)


def _record_steps(eng) -> list[list[tuple[str, Phase]]]:
    steps, original = [], eng.scheduler.schedule

    def schedule(now):
        batch = original(now)
        steps.append([(r.cache, p) for r, p in batch])
        return batch
    eng.scheduler.schedule = schedule
    return steps


@pytest.mark.parametrize("delay_step, scheduler, cuda_graphs", [
    (0, "phase", False), (1, "phase", True), (1, "lookahead", False)])
def test_mixed_dual_and_sparse_steps_are_batch_invariant(model, delay_step, scheduler, cuda_graphs):
    """The mixed workload (temperatures, random remasking, block lengths 2-8) in a pool of 62
    with 5 sequences: the first two go dual, the others sparse, all in the same steps. At
    delay_step 0 the block-start Refresh stores (dual) and selects (sparse) in one step;
    `cuda_graphs` pads Reuse-only steps to buckets (plain calls on a CPU)."""
    prompts, params = _mixed_workload()
    kw = dict(retention=0.5, max_num_logits=5, delay_step=delay_step)
    eng = make_engine(model, cache="auto", kv_pool_tokens=62, max_num_seqs=5, scheduler=scheduler,
                      cuda_graphs=cuda_graphs, **kw)
    steps = _record_steps(eng)
    outs = eng.generate(prompts, params)
    assert [o.cache for o in outs] == ["dual", "dual", "sparse", "sparse", "sparse"]
    assert any({c for c, p in s if p is Phase.REUSE} == {"dual", "sparse"} for s in steps)
    if delay_step == 0:
        assert any({p for _, p in s} >= {Phase.REFRESH_STORE, Phase.REFRESH_SELECT} for s in steps)
    for o, p, sp in zip(outs, prompts, params, strict=True):
        assert o.token_ids == run_alone(model, p, sp, cache=o.cache, **kw)


# ---------------------------------------------------------------- the profiler
def test_auto_is_profiled_for_the_worst_step_of_either_mode(monkeypatch):
    from engine import profiler
    from engine.config import EngineConfig
    from tests.test_memory import _warm

    model = tiny_model(torch.float32, vocab_size=1024, embedding_size=1024)
    _warm(model)

    def measure(cache: str) -> tuple[int, int]:
        cfg = EngineConfig(cache=cache, max_num_batched_tokens=64, max_num_logits=8, device="cpu", retention=0.5)
        return profiler.measure_activation_peak(model, cfg, "sdpa", 64)
    dual, sparse = measure("dual"), measure("sparse")
    assert measure("auto") == (max(dual[0], sparse[0]), max(dual[1], sparse[1]))
    seen = []

    def peaks(runner, model, config, max_model_len, mode):
        seen.append(mode)
        return {"dual": (10, 50), "sparse": (30, 20)}[mode]
    monkeypatch.setattr(profiler, "_peaks", peaks)
    assert measure("auto") == (30, 50) and seen == ["dual", "sparse"]


# ---------------------------------------------------------------- properties
def _needs(req, retention: float) -> tuple[int, int]:
    ctx = req.length - req.block_length
    return req.length, min(ctx, math.floor(retention * ctx)) + req.block_length


@st.composite
def auto_workloads(draw):
    cfg = dict(cache="auto", scheduler=draw(st.sampled_from(["phase", "lookahead"])),
               max_num_batched_tokens=draw(st.integers(40, 96)), max_num_seqs=draw(st.integers(1, 5)),
               kv_pool_tokens=draw(st.one_of(st.none(), st.integers(20, 160))),
               retention=draw(st.sampled_from([0.25, 0.5, 1.0])), delay_step=draw(st.integers(0, 2)))
    reqs = [dict(prompt=draw(st.integers(1, 20)), block=(b := draw(st.sampled_from([2, 4, 8]))),
                 gen=b * draw(st.integers(1, 3)), arrival=draw(st.integers(0, 8))) for _ in range(draw(st.integers(1, 8)))]
    return cfg, reqs


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(auto_workloads())
def test_auto_never_overcommits_follows_its_rule_and_finishes_everyone(w):
    cfg, reqs = w
    eng = make_engine(MODEL, **cfg)
    eng.runner.run = types.MethodType(fake_run, eng.runner)
    sched, pool, r = eng.scheduler, eng.pool, cfg["retention"]
    admit = sched._admit

    def checked_admit(mode, now):
        head, free = sched.waiting[0], None if pool.capacity is None else pool.capacity - pool.used
        room = max(0, cfg["max_num_seqs"] - len(sched.running) - 1)
        behind = sum(_needs(q, r)[1] for q in list(sched.waiting)[1:1 + room])
        dual, sparse = _needs(head, r)
        if mode == "sparse":       # dual would have left too little for those behind, and sparse saves
            assert free is not None and dual + behind > free and sparse < dual and sparse <= free
        else:
            assert free is None or dual <= free and (dual + behind <= free or sparse >= dual)
        return admit(mode, now)
    sched._admit = checked_admit
    prompts = random_prompts(len(reqs), [q["prompt"] for q in reqs], seed=len(reqs))
    order = sorted(range(len(reqs)), key=lambda i: reqs[i]["arrival"])
    added, outs, step = [], {}, 0
    while order or eng.has_unfinished():
        while order and reqs[order[0]]["arrival"] <= step:
            i = order.pop(0)
            q = reqs[i]
            sp = SamplingParams(gen_length=q["gen"], steps=q["gen"], block_length=q["block"])
            try:
                added.append(eng.add_request(prompts[i], sp, request_id=f"r{i}"))
            except ValueError:     # can never run: its canvas over the token budget, or not even sparse fits
                L = q["prompt"] + q["gen"]
                assert L > cfg["max_num_batched_tokens"] or min(
                    L, min(L - q["block"], math.floor(r * (L - q["block"]))) + q["block"]) > cfg["kv_pool_tokens"]
        outs.update({o.request_id: o for o in eng.step()})
        assert pool.capacity is None or pool.used <= pool.capacity
        assert pool.used == sum(q.kv_tokens for q in sched.running)
        step += 1
        assert step < 2000, "did not drain"
    assert set(outs) == set(added) and all(o.finished for o in outs.values())
    assert pool.used == 0
    st_ = eng.stats()
    assert st_["requests_dual"] + st_["requests_sparse"] == len(added)
    if pool.capacity is None:
        assert st_["requests_sparse"] == 0


# ---------------------------------------------------------------- reported by serve
def test_serve_point_reports_each_requests_mode(tmp_path):
    """A serve point of the `engine` system (its default: cache=auto) on the tiny preset, in a
    budget whose KV pool holds about 200 of the workload's 285 dual slots: requests.jsonl says
    each request's mode (a dual one reserved its whole canvas), the point's stats count them
    (the warm-up request left out) and the result block shows the counts."""
    import json

    from dllm_bench.metrics import summarize
    from dllm_bench.serve import worker
    from dllm_bench.serve.options import ServeOptions, resolve_run
    from dllm_bench.serve.process import worker_spec
    from dllm_bench.serve.summary import format_summary
    from dllm_bench.serve.workload import workload_shape
    from tests.test_serve import RUN_DEFAULTS

    run = resolve_run(ServeOptions(**{**RUN_DEFAULTS, "systems": "engine", "rps": "inf", "num_prompts": 6,
                                      "num_warmups": 1, "memory_budget": "2060KiB"}))
    spec = worker_spec(run, run.systems[0], next(iter(run.workloads.values())), workload_shape(run))
    assert worker.run(spec, tmp_path / "out.json") == 0
    result = json.loads((tmp_path / "out.json").read_text())["result"]
    recs = result["records"]
    modes = [r["cache"] for r in recs]
    assert len(modes) == 6 and set(modes) <= {"dual", "sparse"}
    assert all((r["kv_tokens"] == r["prompt_len"] + r["output_len"]) == (r["cache"] == "dual") for r in recs)
    st_ = result["stats"]
    assert (st_["requests_dual"], st_["requests_sparse"]) == (modes.count("dual"), modes.count("sparse"))
    text = format_summary(summarize(result))
    assert f"{'Requests served with dual cache:':<40} {modes.count('dual'):<10}" in text
    assert f"{'Requests served with sparse KV:':<40} {modes.count('sparse'):<10}" in text


def test_the_engine_systems_default_is_auto_and_the_paper_system_is_named():
    from dllm_bench.ablate import ladder
    from dllm_bench.commands.systems import system_rows
    from dllm_bench.simulate.hardware import load
    from dllm_bench.simulate.paper.setting import setup
    from dllm_bench.sweep.lengths import DEFAULT_SYSTEMS as SWEEP
    from dllm_bench.systems.spec import PAPER_ENGINE, engine_knobs, parse_system

    assert system_rows()[0]["knobs"]["cache"] == "auto" and PAPER_ENGINE in system_rows()[0]["notes"]
    assert engine_knobs(parse_system("engine"), {})["cache"] == "auto"
    assert engine_knobs(parse_system(PAPER_ENGINE), {})["cache"] == "sparse"
    assert all("cache=sparse" in r.spec for r in ladder.ladder(64)[1:] + ladder.beyond_rungs(64))
    assert SWEEP.split(",")[0] == PAPER_ENGINE
    assert engine_knobs(parse_system("engine"), setup(load("l40s")).engine_defaults)["cache"] == "sparse"
