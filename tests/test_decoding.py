"""Parallel decoding policies (engine.decoding): each rule on a hand-worked confidence vector,
the engine's dual cache with threshold / factor decoding against Fast-dLLM's (float64, batch 1,
the trained synth-cot checkpoint: its confidences are real), batch invariance under mixed
policies, and liveness under random policies and arrivals."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines import make_system
from baselines.common import _factor_count
from engine import SamplingParams
from engine.decoding import Decoding, commit_mask, policy_columns
from tests.helpers import make_engine, random_prompts, tiny_model

NEG = -math.inf


def _mask(rows, policies, ks=None, entropy=None):
    """rows: each request's confidences in descending order (padded with -inf)."""
    W = max(len(r) for r in rows)
    conf = torch.tensor([r + [NEG] * (W - len(r)) for r in rows], dtype=torch.float64)
    counts = torch.tensor([sum(c > NEG for c in r) for r in rows])
    ent = None if entropy is None else torch.tensor([e + [0.0] * (W - len(e)) for e in entropy], dtype=torch.float64)
    kinds, values = policy_columns([Decoding.parse(p) for p in policies])
    k = torch.tensor(ks or [0] * len(rows))
    out = commit_mask(conf, ent, counts, k, torch.from_numpy(kinds), torch.from_numpy(values))
    return [row[: len(r)] for row, r in zip(out.tolist(), rows)]


def test_each_rule_on_a_hand_worked_vector():
    # threshold 0.9: the best always, then every one >= 0.9; a row none of whose reach it: its best only
    assert _mask([[0.95, 0.92, 0.5, 0.3], [0.6, 0.5]], ["threshold:0.9", "threshold:0.9"]) == \
        [[True, True, False, False], [True, False]]
    # factor 1: rank i (from 0) needs 1 - 1/(i+2): 0.667, 0.75, 0.8 for ranks 1-3
    assert _mask([[0.9, 0.7, 0.6, 0.5]], ["factor:1"]) == [[True, True, False, False]]
    # upstream's quirk: only the last rank fails -> all are taken
    assert _mask([[0.9, 0.8, 0.1]], ["factor:1"]) == [[True, True, True]]
    assert _mask([[0.2]], ["factor:1"]) == [[True]]
    # entropy 1.0: cumulative entropies 0.5, 0.9, 1.2 -> two; a first entropy above the bound: one
    assert _mask([[0.9, 0.8, 0.7], [0.9, 0.8]], ["entropy:1.0", "entropy:1.0"],
                 entropy=[[0.5, 0.4, 0.3], [2.0, 0.1]]) == [[True, True, False], [True, False]]
    # fixed: the schedule's k, whatever the confidences; mixed with other policies in one call
    assert _mask([[0.99, 0.98, 0.97], [0.95, 0.92, 0.5]], ["fixed", "threshold:0.9"], ks=[1, 0]) == \
        [[True, False, False], [True, True, False]]
    # every request fixed: the step passes no policy columns, and the rows are what the columns give
    rows, ks = [[0.9, 0.8, 0.7], [0.6, NEG, NEG], [0.5, 0.4, NEG]], [2, 3, 0]
    conf = torch.tensor(rows, dtype=torch.float64)
    counts, k = torch.tensor([3, 1, 2]), torch.tensor(ks)
    alone = commit_mask(conf, None, counts, k, None, None)
    assert alone.tolist() == [[True, True, False], [True, False, False], [False, False, False]]
    assert [r[:n] for r, n in zip(alone.tolist(), (3, 1, 2))] == _mask([r[:n] for r, n in zip(rows, (3, 1, 2))],
                                                                      ["fixed"] * 3, ks=ks)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=12), st.floats(0.05, 3))
def test_factor_rule_agrees_with_the_baselines_reimplementation(conf, f):
    conf = sorted(conf, reverse=True)
    assert sum(_mask([conf], [f"factor:{f!r}"])[0]) == _factor_count(conf, f)


@pytest.mark.parametrize("spec", ["threshold:0", "threshold:1.5", "factor:0", "entropy:-1", "bogus", "fixed:1",
                                  "threshold:x"])
def test_bad_policies_are_refused(spec):
    with pytest.raises(ValueError):
        SamplingParams(decoding=spec)
    assert str(Decoding.parse("THRESHOLD:0.90")) == "threshold:0.9"


@pytest.fixture(scope="module")
def synth_cot():
    from dllm_bench.accuracy.points import generated_docs, model_training_info
    from dllm_bench.checkpoints.load import encode_prompt, load_model, load_tokenizer, model_dir
    from workloads.tasks import generated, synth

    path = model_dir("synth-cot")
    c = model_training_info(path)["config"]
    docs = generated_docs("synth-cot", "test", 3, 0, c["eval_facts"], generated.knobs_of("synth-cot", c))
    tok = load_tokenizer(path)
    return load_model("synth-cot", "float64", "cpu"), [encode_prompt(tok, synth.format_prompt(d["question"]), False)
                                                       for d in docs]


@pytest.mark.parametrize("engine_policy,knobs", [("threshold:0.5", dict(threshold=0.5)),
                                                 ("threshold:0.7", dict(threshold=0.7)),
                                                 ("threshold:0.9", dict(threshold=0.9)),
                                                 ("factor:1", dict(factor=1.0))])
def test_engine_dual_equals_fast_dllm_parallel_decoding(synth_cot, engine_policy, knobs):
    model, prompts = synth_cot
    params = SamplingParams(gen_length=32, block_length=8, steps=32, decoding=engine_policy)
    fast = make_system("fast-dllm", model, max_batch_size=1, **knobs)
    nfe = []
    for p in prompts:
        want = fast.generate([p], params)[0]
        got = make_engine(model, cache="dual").generate([p], params)[0]
        assert got.token_ids == want.token_ids
        assert got.nfe == want.nfe
        assert sum(got.steps_per_block) == got.nfe and len(got.steps_per_block) == 4
        nfe.append(got.nfe)
    assert min(nfe) < 32                       # parallel decoding did commit several tokens a step


POLICIES = ["fixed", "threshold:0.3", "threshold:0.9", "factor:2", "entropy:0.5", "entropy:0"]


@pytest.mark.parametrize("cache", ["dual", "sparse", "none"])
def test_batch_invariance_under_mixed_policies(cache):
    model = tiny_model(torch.float64, seed=7)
    prompts = random_prompts(6, [5, 9, 3, 12, 7, 4], seed=7)
    params = [SamplingParams(gen_length=16, block_length=8, steps=16, decoding=POLICIES[i], temperature=0.5 * (i == 4),
                             seed=i) for i in range(6)]
    alone = [make_engine(model, cache=cache).generate([p], sp)[0] for p, sp in zip(prompts, params)]
    together = make_engine(model, cache=cache).generate(prompts, params)
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert [o.steps_per_block for o in together] == [o.steps_per_block for o in alone]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(POLICIES), st.integers(1, 12), st.integers(0, 3), st.sampled_from([4, 8])),
                min_size=1, max_size=6), st.sampled_from(["dual", "sparse", "none"]))
def test_liveness_under_random_policies_and_arrivals(reqs, cache):
    """Every request finishes; every running request commits at least one token per step."""
    model = tiny_model(torch.float32, seed=1)
    eng = make_engine(model, cache=cache, max_num_batched_tokens=512)
    pending = [(arrive, p, SamplingParams(gen_length=16, block_length=b, steps=16, decoding=pol))
               for (pol, plen, arrive, b), p in zip(reqs, random_prompts(len(reqs), [r[1] for r in reqs], seed=3))]
    ids, done, t = [], {}, 0
    while pending or eng.has_unfinished():
        for item in [x for x in pending if x[0] <= t]:
            ids.append(eng.add_request(item[1], item[2]))
            pending.remove(item)
        before = {r.request_id: int((r.host_canvas == model.config.mask_token_id).sum()) for r in eng.scheduler.running}
        batch_ids = [r.request_id for r in eng.scheduler.running]
        done.update((o.request_id, o) for o in eng.step())
        for r in eng.scheduler.running:
            if r.request_id in batch_ids:
                assert int((r.host_canvas == model.config.mask_token_id).sum()) < before[r.request_id]
        t += 1
        assert t < 500
    assert sorted(done) == sorted(ids) and all(o.finished and model.config.mask_token_id not in o.token_ids
                                               for o in done.values())
