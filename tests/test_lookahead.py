"""The look-ahead scheduler (engine.scheduler.Lookahead, `scheduler=lookahead`), checked at every step:

* in the engine (random arrivals, lengths, budgets, cache policies, KV pools; the fake runner of
  test_scheduler_properties): every invariant of the phase scheduler (token, logit and KV
  budgets, liveness, FCFS admission, no idle step) and, the point of planning, every request
  runs in exactly the steps its plan gave it when it was admitted: no collision ever moves a
  running request (no stall), and the planned waits are the only steps it sits out;
* the planner alone, with blocks that end early (parallel decoding) or late, and aborts: no
  step over the budget, the ledger equal to what runs, stalls only for a request that ran past
  its plan, and every request that never ran late finishes no later than planned at admission;
* float64 tokens: the same under `phase` and `lookahead` although the schedules differ.
"""
from __future__ import annotations

import types
from collections import deque

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_bench.systems.spec import engine_knobs, parse_system
from engine import SamplingParams
from engine.request import Request, phase_at
from engine.scheduler import Lookahead, planned_costs
from tests.helpers import MASK, make_engine, random_prompts, tiny_model
from tests.test_scheduler_properties import MODEL, _drive, fake_run, workloads


def check_plans_followed(eng) -> dict:
    """Wrap the scheduler: record each request's planned steps at admission and the steps it
    ran in; `_drive` wraps this again with the phase scheduler's invariants."""
    sched, planned, ran, step = eng.scheduler, {}, {}, [0]
    original = sched.schedule

    def schedule(now):
        running = len(sched.running)
        batch = original(now)
        admitted = [r for r, _ in batch if r.request_id not in planned]
        for r in admitted:
            planned[r.request_id] = sched.policy.plan.plans[id(r)].slots.tolist()
        for r, _ in batch:
            ran.setdefault(r.request_id, []).append(step[0])
        assert sched.stalled == 0
        assert sched.deferred == running + len(admitted) - len(batch)
        step[0] += 1
        return batch

    sched.schedule = schedule
    return {"planned": planned, "ran": ran}


@settings(max_examples=250, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(max_requests=8, max_prompt=16))
def test_lookahead_invariants_and_plans_followed(w):
    cfg, reqs = w
    cfg = {**cfg, "scheduler": "lookahead"}
    eng = make_engine(MODEL, **cfg)
    eng.runner.run = types.MethodType(fake_run, eng.runner)
    log = check_plans_followed(eng)
    _drive(eng, cfg, reqs)
    assert log["ran"] == log["planned"]                 # every step as planned at admission
    assert eng.counters["stalled_steps"] == 0
    assert eng.counters["deferred_requests"] == sum(
        p[-1] - p[0] + 1 - len(p) for p in log["planned"].values())    # waits: the plans' gaps


# ---------------------------------------------------------------- the planner alone
@st.composite
def planner_runs(draw, late: bool):
    budget = draw(st.integers(25, 96))          # >= the longest generation (8 x 3) + 1: all fit
    reqs = []
    for _ in range(draw(st.integers(1, 8))):
        block = draw(st.sampled_from([1, 2, 4, 8]))
        nb, spb = draw(st.integers(1, 3)), draw(st.integers(1, block + 2))
        prompt = draw(st.integers(1, budget - block * nb))
        # Steps each block really takes: early (parallel decoding) or as planned; late: more.
        hi = spb + (2 if late else 0)
        reqs.append(dict(prompt=prompt, block=block, nb=nb, spb=spb, arrival=draw(st.integers(0, 12)),
                         steps=[draw(st.integers(1, hi)) for _ in range(nb)],
                         abort=draw(st.one_of(st.none(), st.integers(0, 20)))))
    return dict(budget=budget, cache=draw(st.sampled_from(["none", "dual", "sparse"])),
                delay=draw(st.integers(0, 2)), max_seqs=draw(st.integers(1, 5)), reqs=reqs)


def _request(i: int, r: dict) -> Request:
    sp = SamplingParams(gen_length=r["block"] * r["nb"], steps=r["spb"] * r["nb"], block_length=r["block"])
    return Request(f"r{i}", [1] * r["prompt"], sp, MASK, arrival_time=float(r["arrival"]))


def drive_planner(run: dict) -> None:
    B, cache, delay = run["budget"], run["cache"], run["delay"]
    la = Lookahead(B, cache, delay)
    reqs = [_request(i, r) for i, r in enumerate(run["reqs"])]
    spec = {q.request_id: r for q, r in zip(reqs, run["reqs"], strict=True)}
    pending = deque(sorted(reqs, key=lambda q: q.arrival_time))
    waiting, running, admitted, finished, aborted = deque(), [], [], {}, set()
    promised, went_late = {}, set()
    total = sum(sum(r["steps"]) for r in run["reqs"])
    t = 0
    while pending or waiting or running:
        while pending and pending[0].arrival_time <= t:
            waiting.append(pending.popleft())
        for q in list(running):                          # aborts take a running request out
            if spec[q.request_id]["abort"] == t:
                la.drop(q)
                running.remove(q)
                aborted.add(q.request_id)
        late = {q.request_id for q in running if (q.block, q.step_in_block) != la.plans[id(q)].expect
                and q.block < la.plans[id(q)].expect[0]}
        went_late |= late
        batch = la.due(running)
        assert la.stalled <= len(late)                  # only a request past its plan can stall
        while waiting and len(running) < run["max_seqs"] and la.admits(waiting[0]):
            q = waiting.popleft()
            la.admit(q)
            running.append(q)
            batch.append(q)
            admitted.append(q.request_id)
            promised[q.request_id] = int(la.plans[id(q)].slots[-1])
            assert int(la.plans[id(q)].slots[0]) == t
        costs = [q.query_cost(phase_at(q.step_in_block, cache, delay)) for q in batch]
        assert sum(costs) <= B
        assert la.ledger[t] == sum(costs)               # the plan is what runs
        assert bool(batch) == bool(running or waiting)  # no idle step
        la.tick()
        for q in batch:                                  # the step: each cursor moves
            q.step_in_block += 1
            if q.step_in_block == spec[q.request_id]["steps"][q.block]:
                q.step_in_block, q.block = 0, q.block + 1
                if q.block == q.num_blocks:
                    la.drop(q)
                    running.remove(q)
                    finished[q.request_id] = t
        t += 1
        assert t <= total + 14, "did not drain"
    assert admitted == [q.request_id for q in sorted(reqs, key=lambda q: q.arrival_time)
                        if q.request_id in admitted]       # FCFS
    assert set(finished) | aborted == set(admitted) == {q.request_id for q in reqs}
    for rid, end in finished.items():
        if rid not in went_late:
            assert end <= promised[rid], rid              # never later than planned at admission


@settings(max_examples=250, deadline=None, database=None, derandomize=True)
@given(planner_runs(late=False))
def test_early_block_ends_never_delay_anyone(run):
    drive_planner(run)


@settings(max_examples=150, deadline=None, database=None, derandomize=True)
@given(planner_runs(late=True))
def test_late_block_ends_stall_only_themselves(run):
    drive_planner(run)


def test_planned_costs_follow_the_phases():
    sp = SamplingParams(gen_length=8, steps=8, block_length=4)
    q = Request("a", [1] * 6, sp, MASK)
    assert planned_costs(q, "sparse", 1).tolist() == [14, 14, 4, 4] * 2
    assert planned_costs(q, "dual", 1).tolist() == [14, 4, 4, 4] * 2
    q.block, q.step_in_block = 1, 2
    assert planned_costs(q, "sparse", 1).tolist() == [4, 4]
    q.step_in_block = 5                                  # ran past its planned block end
    assert planned_costs(q, "sparse", 1).tolist() == [4]
    # Parallel decoding: a block is planned at its longest, one step per position.
    par = Request("b", [1] * 6, SamplingParams(gen_length=8, steps=2, block_length=4, decoding="threshold:0.9"), MASK)
    assert planned_costs(par, "sparse", 1).tolist() == [14, 14, 4, 4] * 2


# ---------------------------------------------------------------- tokens: when, never what
BUDGET_PARALLEL = 30


def _serve_both(params: list[SamplingParams], budget: int) -> tuple[dict, dict]:
    """Requests arriving two per step over the first steps, served by phase and by lookahead:
    per scheduler the outputs by request id and (step log, counters)."""
    m = tiny_model(torch.float64)
    prompts = random_prompts(len(params), [9, 14, 6, 12, 10, 7][: len(params)], seed=5)
    outs, logs = {}, {}
    for sched in ("phase", "lookahead"):
        eng = make_engine(m, dtype="float64", cache="sparse", scheduler=sched, max_num_batched_tokens=budget,
                          retention=0.5, delay_step=1)
        got, step = {}, 0
        while 2 * step < len(params) or eng.has_unfinished():
            for i in range(2 * step, min(2 * step + 2, len(params))):
                eng.add_request(prompts[i], params[i], request_id=f"r{i}")
            got.update({o.request_id: o for o in eng.step()})
            step += 1
        outs[sched], logs[sched] = got, (list(eng.step_log), dict(eng.counters))
    assert len(outs["phase"]) == len(params)
    assert {k: o.token_ids for k, o in outs["phase"].items()} == {k: o.token_ids for k, o in outs["lookahead"].items()}
    assert logs["phase"][0] != logs["lookahead"][0]               # the schedules differ
    assert logs["lookahead"][1]["stalled_requests"] == 0
    return outs, logs


def test_lookahead_changes_when_not_what_float64():
    params = [SamplingParams(gen_length=8 * (1 + i % 2), steps=8 * (1 + i % 2), block_length=4,
                             temperature=[0.0, 1.0][i % 2], seed=i) for i in range(6)]
    _, logs = _serve_both(params, 36)
    assert logs["phase"][1]["stalled_requests"] > 0
    assert logs["lookahead"][1]["deferred_requests"] > 0


def test_lookahead_under_parallel_decoding_float64():
    """Blocks that end early (threshold / factor decoding beside fixed ones): the plan shifts
    block starts, tokens stay the same and nobody stalls."""
    kinds = ["threshold:0.3", "fixed", "factor:2.0", "threshold:0.5", "fixed", "entropy:1.0"]
    params = [SamplingParams(gen_length=8, steps=8, block_length=4, decoding=k, seed=i) for i, k in enumerate(kinds)]
    outs, logs = _serve_both(params, BUDGET_PARALLEL)
    assert logs["phase"][1]["stalled_requests"] > 0 and logs["lookahead"][1]["deferred_requests"] > 0
    early = [o for o in outs["lookahead"].values() if any(n < 4 for n in o.steps_per_block)]
    assert any(o.request_id in ("r0", "r2", "r3", "r5") for o in early)     # blocks did end early


def test_lookahead_is_an_engine_knob():
    v = parse_system("engine:scheduler=lookahead")
    assert engine_knobs(v, {})["scheduler"] == "lookahead"
    with pytest.raises(Exception, match="lookahead"):
        parse_system("engine:scheduler=look-ahead")
