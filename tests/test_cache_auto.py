"""`cache=auto` (engine.kv_cache): each request served in the mode whose pool full of requests
like it commits more tokens per unit of step time on the device's roofline (dual unless sparse's
extra requests ride on a weight-bound step or amortise a step's fixed overhead), its mode chosen
at admission and kept for its life (against both pure modes on the simulator:
tests/test_cache_auto_sim.py).

* the rule alone (pure functions), worked by hand, and on LLaDA-8B's shape at H100 pools;
* float64: with a pool that holds everyone, auto is the dual engine (tokens and NFE); with a pool
  too small for everyone as dual, the modes are the ones the rule gives (worked out by hand
  below) and every request's tokens equal the same request's alone in its mode, through steps
  that mix dual and sparse members (Refresh-store beside Refresh-select, Reuse beside Reuse,
  padded bucket steps), under the phase and the look-ahead scheduler;
* a property test: the pool is never over-committed, each admission's mode fits, at a ridge of
  0 (every step compute-bound) the mode is dual exactly when a dual request fits the pool, and
  every request finishes.
"""
from __future__ import annotations

import math
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import SamplingParams
from engine.kv_cache import Shape, admission_mode, kv_need, per_weight, preferred_mode, step_time
from engine.models import ModelConfig
from engine.request import Phase
from tests.helpers import make_engine, random_prompts, run_alone, tiny_model
from tests.test_engine_exact import _mixed_workload
from tests.test_scheduler_properties import MODEL, fake_run

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_model(F64)


# ---------------------------------------------------------------- the rule
def test_step_time_by_hand():
    """Canvas 40, block 8, 8 steps per block, delay 1 (dual 1 Refresh per block, sparse 2), no
    key or attention term. 3 dual: Reuse rows 3·7·8/8 = 21, 3 tokens per step. Ridge 100: the
    step costs the ridge, 100, and 21 + 40 < 100 leaves every Refresh free. Ridge 10: the Reuse
    rows cost 21, each Refresh adds its 40 rows 3/8 of the steps: 21 + 15 = 36. 5 sparse: Reuse
    rows 5·6·8/8 = 30; ridge 10: 30 + 10/8·40 = 80. An overhead of 50 rows adds to every step."""
    shape = Shape(40, 8, 8, 1, 40, 24, ridge=100)
    assert step_time(3, 0, shape) == (100, 3)
    small = Shape(40, 8, 8, 1, 40, 24, ridge=10)
    assert step_time(3, 0, small) == (36, 3) and step_time(0, 5, small) == (80, 5)
    assert step_time(3, 0, Shape(40, 8, 8, 1, 40, 24, ridge=10, overhead=50)) == (86, 3)


def test_preferred_mode_by_hand():
    """A pool of 120 slots holds 3 dual (40 each) or 5 sparse (24) requests of that shape (the
    second argument, `max_num_seqs`, caps both at 10). At a ridge of 100 both steps cost 100 rows:
    5 tokens per step beat 3 -> sparse. At a ridge of 10 dual commits 3/36 = 0.083 tokens per row,
    sparse 5/80 = 0.0625 -> dual. With at most 3 at once both modes hold three, dual's step is no
    dearer -> dual; with a pool of 30 no dual request fits -> sparse; at retention 1 (sparse need
    = dual need) -> dual. A step overhead of 50 rows at a ridge of 10 amortised over more
    requests: dual 3/86 = 0.035, sparse 5/130 = 0.038, 10 % more -> sparse."""
    assert preferred_mode(120, 10, Shape(40, 8, 8, 1, 40, 24, ridge=100)) == "sparse"
    assert preferred_mode(120, 10, Shape(40, 8, 8, 1, 40, 24, ridge=10)) == "dual"
    assert preferred_mode(120, 3, Shape(40, 8, 8, 1, 40, 24, ridge=100)) == "dual"
    assert preferred_mode(30, 10, Shape(40, 8, 8, 1, 40, 24, ridge=10)) == "sparse"
    assert preferred_mode(120, 10, Shape(40, 8, 8, 1, 40, 40, ridge=100)) == "dual"
    assert preferred_mode(120, 10, Shape(40, 8, 8, 1, 40, 24, ridge=10, overhead=50)) == "sparse"


@pytest.mark.parametrize("free, dual, sparse, preferred, mode", [
    (None, 30, 12, "sparse", "dual"),      # an unbounded pool never binds
    (30, 30, 12, "dual", "dual"),
    (29, 30, 12, "dual", None),            # it waits for its dual need rather than go sparse
    (12, 30, 12, "sparse", "sparse"),
    (11, 30, 12, "sparse", None),
])
def test_admission_rule(free, dual, sparse, preferred, mode):
    assert admission_mode(free, dual, sparse, preferred) == mode


@pytest.mark.parametrize("pool, max_seqs, canvas, overhead, mode", [
    (11380, 64, 869, 703, "dual"),     # 24 GiB on the h100 profile: 13 dual against 25 sparse
    (7544, 64, 869, 703, "sparse"),    # 22 GiB: 8 dual against 16 sparse, which amortise the overhead
    (7544, 8, 869, 703, "dual"),       # ... but with at most 8 at once, the pool holds them dual
    (3708, 64, 869, 703, "sparse"),    # 20 GiB: 4 dual leave the step weight-bound, 8 sparse fill it
    (1816, 64, 600, 703, "sparse"),    # 19 GiB: 3 dual against 5 sparse
    (7544, 64, 869, 0, "dual"),        # 22 GiB on the bare roofline: 8 dual already past the ridge
    (3708, 64, 869, 0, "sparse"),
])
def test_llada_8b_on_an_h100(pool, max_seqs, canvas, overhead, mode):
    """LLaDA-8B (gen 256, block 32, 32 steps per block, retention 0.5) at the h100 profile's ridge
    of 265 rows and step overhead of 703 (`simulate --preset paper --hardware h100`: max_num_seqs
    64), in the pools
    it profiles at 24, 22, 20 and 19 GiB: the modes whose runs are the faster there
    (tests/test_cache_auto_sim.py); without the overhead (a measured GPU) the rule keeps 22 GiB dual."""
    c = ModelConfig()
    shape = Shape(canvas, 32, 32, 1, kv_need("dual", canvas, 32, 0.5), kv_need("sparse", canvas, 32, 0.5),
                  265, *per_weight(c), overhead)
    assert preferred_mode(pool, max_seqs, shape) == mode


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


@pytest.mark.parametrize("ridge, max_seqs, modes, waiter", [
    (10**6, 64, ["sparse"] * 5, 3), (10**6, 3, ["sparse", "sparse", "dual", "sparse", "sparse"], 3),
    (0, 64, ["dual"] * 5, 2)])
def test_modes_follow_the_rule_and_each_request_equals_itself_alone(model, ridge, max_seqs, modes, waiter):
    """Five requests at once, block 8, gen 16 in 8 steps (4 per block), retention 0.5, a pool
    of 60 slots. Canvases 21, 25, 19, 28, 23: dual needs = the canvas, sparse needs
    ⌊0.5·(L-8)⌋ + 8 = 14, 16, 13, 18, 15. A pool of 60 holds 2, 2, 3, 2, 2 dual requests of
    each one's shape, 4, 3, 4, 3, 4 sparse ones. Ridge 10^6: every step is bound by reading the
    weights (and keys: both pools read about as many), so more requests win: all sparse, r3 and
    r4 too though they run after r0-r2 alone (the pool is weighed full, not by who is left):
    r0-r2 take 14, 16, 13 (free 17), r3's 18 waits for them. At most 3 at once (max_num_seqs):
    r2's shape fills the pool with 3 either way, dual's steps are the cheaper -> r2 dual, the
    rest still 3 sparse against 2 dual; r3 waits for a seat. Ridge 0: every step is
    compute-bound, dual's fewer rows per token win whatever fits: r0, r1 dual (free 14), r2's 19
    waits for one of them."""
    prompts = random_prompts(5, [5, 9, 3, 12, 7], seed=1)
    sp = SamplingParams(gen_length=16, steps=8, block_length=8)
    kw = dict(retention=0.5, dtype="float64")
    eng = make_engine(model, cache="auto", kv_pool_tokens=60, ridge_rows=ridge, max_num_seqs=max_seqs, **kw)
    outs = eng.generate(prompts, sp)
    assert [o.cache for o in outs] == modes
    assert [o.kv_tokens for o in outs] == [kv_need(m, len(p) + 16, 8, 0.5) for m, p in zip(modes, prompts)]
    assert outs[waiter].admitted_time >= min(o.finished_time for o in outs[:waiter])
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
    with 5 sequences at a ridge of 10^6 (weight-bound steps): each request's mode is the one
    whose pool holds more requests of its shape, so they alternate, all in the same steps. At
    delay_step 0 the block-start Refresh stores (dual) and selects (sparse) in one step;
    `cuda_graphs` pads Reuse-only steps to buckets (plain calls on a CPU)."""
    prompts, params = _mixed_workload()
    kw = dict(retention=0.5, max_num_logits=5, delay_step=delay_step)
    eng = make_engine(model, cache="auto", kv_pool_tokens=62, max_num_seqs=5, scheduler=scheduler,
                      cuda_graphs=cuda_graphs, ridge_rows=10**6, **kw)
    steps = _record_steps(eng)
    outs = eng.generate(prompts, params)
    assert {o.cache for o in outs} == {"dual", "sparse"}
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
        cfg = EngineConfig(cache=cache, max_num_batched_tokens=64, max_num_logits=8, device="cpu", retention=0.5,
                           memory_budget=2**30)
        prof = profiler.profile_kv_pool(model, cfg, "sdpa", 64)
        return prof.refresh_peak_bytes, prof.reuse_peak_bytes
    dual, sparse = measure("dual"), measure("sparse")
    assert measure("auto") == (max(dual[0], sparse[0]), max(dual[1], sparse[1]))
    seen = []

    def peaks(runner, config, max_model_len, mode):
        seen.append(mode)
        return {"dual": (10, 30, 20), "sparse": (30, 10, 10)}[mode]     # (Refresh, short Reuses, one Reuse)
    monkeypatch.setattr(profiler, "_peaks", peaks)
    assert measure("auto") == (30, 50) and seen == ["dual", "sparse"]


# ---------------------------------------------------------------- properties
@st.composite
def auto_workloads(draw):
    cfg = dict(cache="auto", scheduler=draw(st.sampled_from(["phase", "lookahead"])),
               max_num_batched_tokens=draw(st.integers(40, 96)), max_num_seqs=draw(st.integers(1, 5)),
               kv_pool_tokens=draw(st.one_of(st.none(), st.integers(20, 160))),
               retention=draw(st.sampled_from([0.25, 0.5, 1.0])), delay_step=draw(st.integers(0, 2)),
               ridge_rows=draw(st.sampled_from([0, 16, 10**6])))
    reqs = [dict(prompt=draw(st.integers(1, 20)), block=(b := draw(st.sampled_from([2, 4, 8]))),
                 gen=b * draw(st.integers(1, 3)), arrival=draw(st.integers(0, 8))) for _ in range(draw(st.integers(1, 8)))]
    return cfg, reqs


def _needs(length: int, block: int, retention: float) -> tuple[int, int]:
    ctx = length - block
    return length, min(ctx, math.floor(retention * ctx)) + block


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
        dual, sparse = _needs(head.length, head.block_length, r)
        if mode == "none":                                                       # no cache mode ever holds it
            assert pool.capacity is not None and sparse > pool.capacity
            return admit(mode, now)
        assert free is None or (dual if mode == "dual" else sparse) <= free      # it fits now
        if free is None or sparse >= dual:                                       # sparse would save nothing
            assert mode == "dual"
        if cfg["ridge_rows"] == 0:            # compute-bound: dual whenever one dual request fits the pool
            assert mode == ("dual" if pool.capacity is None or dual <= pool.capacity else "sparse")
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
            except ValueError:     # can never run: its canvas over the token budget (not even sparse fitting: none)
                assert q["prompt"] + q["gen"] > cfg["max_num_batched_tokens"]
        outs.update({o.request_id: o for o in eng.step()})
        assert pool.capacity is None or pool.used <= pool.capacity
        assert pool.used == sum(q.kv_tokens for q in sched.running)
        step += 1
        assert step < 2000, "did not drain"
    assert set(outs) == set(added) and all(o.finished for o in outs.values())
    assert pool.used == 0
    st_ = eng.stats()
    assert st_["requests_dual"] + st_["requests_sparse"] + st_["requests_none"] == len(added)
