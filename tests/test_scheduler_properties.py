"""Scheduler invariants on random workloads (issue "mechanisms"), checked at every step:

* token budget: Σ per-step costs as the scheduler charges them <= max_num_batched_tokens, and the
  forward's real query tokens too, except a canvas longer than the budget (engine.chunking),
  whose Refresh (scheduler=request: every step) is charged its grants over several steps and
  run whole in one; batch size <= max_num_seqs;
* logit budget: no LM-head call and no step materializes more than max_num_logits rows;
* KV pool: used <= capacity, used == Σ reservations of the running requests, 0 at the end;
* liveness: every admitted request finishes (after exactly `steps` forwards); whenever the
  running set is empty the head of the queue is admitted in that step; no idle steps;
* FCFS: admission order == add order;
* impossible requests raise ValueError at add_request and never block later ones.

Most workloads run with a cheap fake ModelRunner.run that commits tokens per the schedule (the
scheduler does not need the model); fewer run the real tiny model in float32.
"""
from __future__ import annotations

import math
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import SamplingParams
from engine.models import DenseLM
from engine.runner import StepStats
from engine.scheduler import POLICIES
from tests.helpers import MASK, candidates, make_engine, random_prompts, tiny_model

MODEL = tiny_model(torch.float32)


def fake_run(self, batch) -> StepStats:
    """Commit the scheduled number of candidates (lowest positions) with token 7, no model."""
    q = rows = 0
    for req, phase in batch:
        cand = candidates(req)
        req.canvas[cand[: req.block_commits[req.step_in_block]]] = 7
        req.host_canvas[cand[: req.block_commits[req.step_in_block]].numpy()] = 7   # a runner keeps both
        req.nfe += 1
        q += req.length if phase.is_refresh else req.params.block_length
        rows += cand.numel()
    m = self.config.max_num_logits
    n_ref = sum(p.is_refresh for _, p in batch)
    return StepStats(q, rows, rows if m is None else min(rows, m), n_ref, len(batch) - n_ref)


@st.composite
def workloads(draw, max_requests: int, max_prompt: int, blocks=(1, 2, 4, 8)):
    config = dict(
        cache=draw(st.sampled_from(["none", "dual", "sparse", "auto"])),
        scheduler=draw(st.sampled_from(["phase", "phase", "request"])),
        max_num_batched_tokens=draw(st.integers(12, 96)),
        max_num_seqs=draw(st.integers(1, 4)),
        max_num_logits=draw(st.one_of(st.none(), st.integers(1, 8))),
        kv_pool_tokens=draw(st.one_of(st.none(), st.integers(0, 40), st.integers(40, 200))),
        retention=draw(st.sampled_from([0.25, 0.5, 1.0])),
        delay_step=draw(st.integers(0, 2)),
        # None: the checkpoint's; either way canvases longer than the budget too, in chunks.
        max_model_len=draw(st.sampled_from([None, 200])),
    )
    reqs = []
    for _ in range(draw(st.integers(1, max_requests))):
        block = draw(st.sampled_from(blocks))
        nb = draw(st.integers(1, 3))
        spb = draw(st.integers(1, block + 2))        # > block: trailing zero-size steps
        # Mostly short prompts (concurrency); sometimes long ones (impossible requests).
        prompt = draw(st.one_of(*[st.integers(1, max_prompt)] * 4, st.integers(max_prompt, 4 * max_prompt)))
        reqs.append(dict(prompt=prompt, gen=block * nb, block=block,
                         steps=spb * nb, temperature=draw(st.sampled_from([0.0, 0.0, 1.0])),
                         arrival=draw(st.integers(0, 12))))
    return config, reqs


def expected_possible(cfg: dict, r: dict) -> bool:
    length = r["prompt"] + r["gen"]
    ctx = length - r["block"]
    need = {"none": 0, "dual": length,
            # ⌊r·L_ctx⌋ retained (as Sparse-dLLM rounds), then one block of slots for the fresh block
            "sparse": min(ctx, math.floor(cfg["retention"] * ctx)) + r["block"]}
    # auto: a request runs in a mode whose need fits, else (no cache mode ever holds it) in none
    need = need[cfg["cache"]] if cfg["cache"] != "auto" else 0
    pool = cfg["kv_pool_tokens"]
    # Longer than the token budget: refreshed in chunks (phase, request: not lookahead), up to
    # max_model_len.
    fits_steps = length <= cfg["max_num_batched_tokens"] or POLICIES[cfg["scheduler"]].chunks_long_refresh
    fits_model = length <= (cfg["max_model_len"] or MODEL.config.max_sequence_length)
    return fits_steps and fits_model and (pool is None or need <= pool)


def check_workload(cfg: dict, reqs: list[dict], fake: bool) -> None:
    eng = make_engine(MODEL, **cfg)
    if fake:
        eng.runner.run = types.MethodType(fake_run, eng.runner)
    else:
        def lm_head(h):                  # every logits tensor of the step stays within the budget
            assert cfg["max_num_logits"] is None or h.shape[0] <= cfg["max_num_logits"]
            return DenseLM.lm_head(MODEL, h)

        MODEL.lm_head = lm_head          # an instance attribute, removed below
    try:
        _drive(eng, cfg, reqs)
    finally:
        MODEL.__dict__.pop("lm_head", None)


def _drive(eng, cfg: dict, reqs: list[dict]) -> None:
    sched, pool = eng.scheduler, eng.pool
    admitted: list[str] = []
    charged: list[int] = []
    original = sched.schedule

    def schedule(now):
        head = sched.waiting[0] if sched.waiting else None
        was_empty = not sched.running
        busy = bool(sched.running or sched.waiting)
        batch = original(now)
        assert bool(batch) == busy                                       # no idle step
        assert len(batch) <= cfg["max_num_seqs"]
        T = cfg["max_num_batched_tokens"]
        long = [sched.policy.accrues(r, p) for r, p in batch]
        costs = [sched.policy.cost(r, p) for r, p in batch]
        # Long canvases' steps are charged their grants (run or accruing), the others their cost.
        grants = sum(sched.policy.granted.values())
        assert sum(c for c, lg in zip(costs, long) if not lg) + grants <= T
        assert all(lg == (r.length > T and (p.is_refresh or cfg["scheduler"] == "request"))
                   for (r, p), lg in zip(batch, long))
        # What the forward will really compute: a long Refresh runs its whole canvas.
        charged.append(sum(r.length if lg else c for (r, _), c, lg in zip(batch, costs, long)))
        if cfg["scheduler"] == "request":
            assert [c for c, lg in zip(costs, long) if not lg] == [r.length for (r, _), lg in zip(batch, long) if not lg]
        assert pool.capacity is None or pool.used <= pool.capacity
        assert pool.used == sum(r.kv_tokens for r in sched.running)
        if was_empty and head is not None:
            assert head.admitted_time == now                             # liveness: head admitted
        admitted.extend(r.request_id for r in sched.running if r.admitted_time == now)
        return batch

    sched.schedule = schedule
    order = sorted(range(len(reqs)), key=lambda i: reqs[i]["arrival"])
    prompts = random_prompts(len(reqs), [r["prompt"] for r in reqs], seed=len(reqs))
    added, outs, step = [], {}, 0
    bound = sum(r["steps"] for r in reqs) + max(r["arrival"] for r in reqs) + 2
    while order or eng.has_unfinished():
        while order and reqs[order[0]]["arrival"] <= step:
            i = order.pop(0)
            r = reqs[i]
            sp = SamplingParams(gen_length=r["gen"], steps=r["steps"], block_length=r["block"],
                                temperature=r["temperature"], seed=i)
            try:
                added.append(eng.add_request(prompts[i], sp, request_id=f"r{i}"))
                assert expected_possible(cfg, r), r
            except ValueError:
                assert not expected_possible(cfg, r), r
        outs.update({o.request_id: o for o in eng.step()})
        step += 1
        assert step <= bound, "engine did not drain"
    # The forwards' real query tokens: the batch's costs, a long Refresh its canvas (phase), or
    # less (request: Reuse computes only its block but is charged the canvas).
    queries = [q for _, _, q in eng.step_log]
    assert len(queries) == len([c for c in charged if c])
    assert all(q == c if cfg["scheduler"] == "phase" else q <= c
               for q, c in zip(queries, [c for c in charged if c], strict=True))
    assert admitted == added                                             # FCFS, nobody lost
    assert set(outs) == set(added)
    for rid in added:
        o, r = outs[rid], reqs[int(rid[1:])]
        assert o.finished and o.nfe == r["steps"]
        assert MASK not in o.token_ids                   # proposals never are (engine.unmask.proposal_argmax)
        assert len(o.token_ids) == r["gen"]
    times = [outs[rid].admitted_time for rid in added]
    assert times == sorted(times)
    assert pool.used == 0 and not sched.running and not sched.waiting
    if cfg["max_num_logits"] is not None:
        assert eng.counters["max_logits_rows_in_step"] <= cfg["max_num_logits"]


@settings(max_examples=300, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(max_requests=8, max_prompt=16))
def test_scheduler_invariants_fake_runner(w):
    check_workload(*w, fake=True)


@settings(max_examples=60, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(max_requests=5, max_prompt=12, blocks=(1, 2, 4)))
def test_scheduler_invariants_real_model(w):
    check_workload(*w, fake=False)


def test_impossible_request_does_not_block_queue():
    eng = make_engine(MODEL, cache="dual", max_num_batched_tokens=32, kv_pool_tokens=24)
    sp = SamplingParams(gen_length=8, steps=8, block_length=4)
    ok1 = eng.add_request(random_prompts(1, 8)[0], sp)
    with pytest.raises(ValueError, match="the model's length of 4096 tokens"):
        eng.add_request(random_prompts(1, 4096)[0], sp)
    with pytest.raises(ValueError, match="KV"):
        eng.add_request(random_prompts(1, 20)[0], sp)
    ok2 = eng.add_request(random_prompts(1, 4)[0], sp)
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert [o.request_id for o in outs] == [ok1, ok2]
