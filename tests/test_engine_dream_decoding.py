"""Dream's decoding in the engine (issue 57): cache=none reproduces baselines.reference_dream (Dream's
`diffusion_generate`) token for token in float64, for each alg, at temperature 0 and with seeded
sampling, batch-invariantly; the time grid per block; the parallel policies with Dream's scores.
Mostly on the LLaDA-shaped tiny model (shift 0), whose forward the reference reads directly; the
last test runs the same equality on a tiny Dream (shift 1, GQA, biases)."""
from __future__ import annotations

import pytest
import torch

from baselines.reference_dream import ALGS, dense_logits, reference_generate
from engine import SamplingParams
from engine.unmask import dream_schedule, token_probs, transfer_schedule
from tests.dream_helpers import dream_prompts, tiny_dream
from tests.helpers import make_engine, random_prompts, run_alone, tiny_model

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_model(F64)


def dream(**kw) -> SamplingParams:
    return SamplingParams.dream(**kw)


# (prompt_len, gen_length, steps, extra options)
GREEDY = [(5, 12, 6, {}), (3, 9, 4, {}), (8, 16, 16, {"top_p": 0.8}), (2, 7, 3, {"top_k": 3})]
SAMPLED = [(4, 12, 6, dict(temperature=0.8, top_p=0.9, seed=3)),
           (6, 10, 10, dict(temperature=1.0, top_k=7, seed=4)),
           (3, 16, 5, dict(temperature=0.5, top_p=0.95, top_k=20, alg_temp=0.5, seed=5)),
           (7, 9, 9, dict(temperature=0.0, alg_temp=1.0, seed=6))]


def _case(model, alg, P, gen, steps, extra, max_num_logits):
    if alg == "origin":
        extra = {k: v for k, v in extra.items() if k != "alg_temp"}
    params = dream(gen_length=gen, steps=steps, alg=alg, **extra)
    prompt = random_prompts(1, P, seed=200 + P)[0]
    ref, ref_nfe = reference_generate(dense_logits(model), prompt, params, model.config.mask_token_id)
    out = make_engine(model, cache="none", max_num_logits=max_num_logits).generate([prompt], params)[0]
    assert out.token_ids == ref
    assert out.nfe == ref_nfe == steps
    assert model.config.mask_token_id not in out.token_ids


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("P,gen,steps,extra", GREEDY)
def test_greedy_equals_reference(model, alg, P, gen, steps, extra):
    _case(model, alg, P, gen, steps, extra, max_num_logits=3)


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("P,gen,steps,extra", SAMPLED)
def test_seeded_sampling_equals_reference(model, alg, P, gen, steps, extra):
    _case(model, alg, P, gen, steps, extra, max_num_logits=5)


def test_monolithic_logits_equal_reference(model):
    """Without a logit budget (every row's logits at once) the tokens are the same."""
    _case(model, "entropy", 5, 12, 6, dict(temperature=0.7, top_p=0.9, seed=8), max_num_logits=None)


def test_sampling_depends_on_the_seed(model):
    """The seeded cases above are not greedy in disguise: another seed gives other tokens."""
    prompt = random_prompts(1, 4, seed=1)[0]
    got = {tuple(run_alone(model, prompt, dream(gen_length=12, steps=6, alg=alg, temperature=1.0, seed=s),
                           cache="none"))
           for alg in ("origin", "entropy") for s in (1, 2)}
    assert len(got) == 4


def _workload():
    prompts = random_prompts(5, [3, 9, 5, 1, 6], seed=21, vocab=95)     # ids both tiny models have
    params = [
        dream(gen_length=12, steps=6, alg="origin", temperature=0.9, top_p=0.9, seed=1),
        dream(gen_length=12, steps=6, alg="origin", temperature=0.9, top_p=0.9, seed=2),
        dream(gen_length=8, steps=8, alg="entropy", temperature=0.6, alg_temp=0.3, seed=3),
        SamplingParams(gen_length=8, steps=8, block_length=4, temperature=0.8, seed=4),   # LLaDA's rule
        dream(gen_length=10, steps=4, alg="topk_margin", top_k=5, seed=5),
    ]
    return prompts, params


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("cache", ["none", "dual", "sparse"])
def test_batch_invariance(model, cache, family):
    """Requests decoded together (Dream's and LLaDA's rules side by side in one logit chunk, same
    algs with different seeds) get exactly the tokens each gets alone, in every cache mode, on a
    shift-0 and a shift-1 model."""
    prompts, params = _workload()
    model = model if family == "llada" else tiny_dream()
    kw = dict(cache=cache, retention=0.5, max_num_logits=7)
    alone = [run_alone(model, p, sp, **kw) for p, sp in zip(prompts, params, strict=True)]
    eng = make_engine(model, **kw)
    together = eng.generate(prompts, params)
    assert [o.token_ids for o in together] == alone
    assert max(eng.batch_sizes) == len(prompts)
    assert alone[0] != alone[1]                         # the seeds matter


def _commits_per_step(model, prompt, params) -> list[int]:
    eng = make_engine(model, cache="none")
    eng.add_request(prompt, params)
    req, mask, out = eng.scheduler.waiting[0], model.config.mask_token_id, []
    while eng.has_unfinished():
        before = int((req.host_canvas == mask).sum())
        eng.step()
        out.append(before - int((req.host_canvas == mask).sum()))
    return out


@pytest.mark.parametrize("remasking", ["low_confidence", "entropy"])
def test_time_grid_applies_per_block(model, remasking):
    """schedule='timegrid' with several blocks: each block commits Dream's counts over its own masks."""
    params = SamplingParams(gen_length=12, steps=8, block_length=6, schedule="timegrid", eps=0.05,
                            remasking=remasking)
    got = _commits_per_step(model, [5, 6, 7], params)
    assert got == dream_schedule(6, 4, 0.05) * 2
    assert got != transfer_schedule(6, 4) * 2           # the grid is not the linear schedule here


def _plain_threshold(model, prompt, params, tau) -> tuple[list[int], int]:
    """A plain loop: each step, Dream's maskgit_plus scores over the masked positions; the best and
    every other reaching tau are committed (Fast-dLLM's threshold rule), until none is masked."""
    mask = model.config.mask_token_id
    x, nfe = torch.tensor(list(prompt) + [mask] * params.gen_length), 0
    while (x == mask).any():
        rows = torch.nonzero(x == mask).squeeze(-1)
        probs = token_probs(model(x[None])[0][rows], params)
        probs[:, mask] = -1                             # never proposed (docs/CONTRACTS.md)
        conf, x0 = probs.max(-1)
        take = conf >= tau
        take[conf.argmax()] = True
        x[rows[take]] = x0[take]
        nfe += 1
    return x[len(prompt):].tolist(), nfe


def test_threshold_takes_dream_scores(model):
    """decoding threshold:τ with maskgit_plus ranks Dream's p(x0) (here filtered by top_p)."""
    params = dream(gen_length=12, steps=12, alg="maskgit_plus", top_p=0.7, decoding="threshold:0.6")
    prompt = random_prompts(1, 5, seed=3)[0]
    ref, nfe = _plain_threshold(model, prompt, params, 0.6)
    out = make_engine(model, cache="none", max_num_logits=4).generate([prompt], params)[0]
    assert out.token_ids == ref and out.nfe == nfe
    assert nfe < 12                                     # several committed at once somewhere


@pytest.mark.parametrize("decoding", ["factor:1.0", "entropy:0.5"])
def test_parallel_policies_run_with_dream_scores(model, decoding):
    """factor and entropy policies over Dream's scores: complete, batch-invariant."""
    prompts = random_prompts(2, [4, 7], seed=9)
    params = [dream(gen_length=10, steps=10, alg="topk_margin", temperature=0.7, seed=s, decoding=decoding)
              for s in (1, 2)]
    alone = [run_alone(model, p, sp, cache="none") for p, sp in zip(prompts, params, strict=True)]
    together = make_engine(model, cache="none").generate(prompts, params)
    assert [o.token_ids for o in together] == alone
    assert all(model.config.mask_token_id not in t for t in alone)


@pytest.mark.parametrize("kw,match", [
    (dict(remasking="origin"), "timegrid"),
    (dict(remasking="low_confidence", top_p=0.9), "Dream's algs"),
    (dict(remasking="random", alg_temp=0.5), "Dream's algs"),
    (dict(remasking="origin", schedule="timegrid", alg_temp=0.5), "ranks none"),
    (dict(remasking="origin", schedule="timegrid", decoding="threshold:0.9"), "origin"),
    (dict(remasking="entropy", alg_temp=0.5, decoding="factor:1"), "alg_temp"),
    (dict(remasking="entropy", decoding="threshold:0.9"), "minus the entropy"),
    (dict(schedule="cosine"), "schedule"),
    (dict(schedule="timegrid", eps=0.0), "eps"),
    (dict(eps=0.01), "timegrid"),
    (dict(remasking="entropy", top_p=0.0), "top_p"),
    (dict(remasking="entropy", top_k=0), "top_k"),
    (dict(remasking="entropy", top_k=True), "top_k"),
    (dict(remasking="entropy", alg_temp=float("nan")), "alg_temp"),
    (dict(remasking="greedy"), "remasking"),
])
def test_bad_combinations_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(gen_length=8, steps=8, block_length=8, **kw)


def test_defaults_unchanged():
    """LLaDA's defaults stay as they were: the linear schedule, no Dream filters."""
    p = SamplingParams()
    assert (p.schedule, p.remasking, p.top_p, p.top_k, p.alg_temp, p.dream_rule) == \
        ("linear", "low_confidence", None, None, None, False)
    assert p.block_counts(32) == transfer_schedule(32, p.steps_per_block)


# ---------------------------------------------------------------- on a shifted family (tiny Dream)
DREAM_CASES = [("origin", dict(temperature=0.9, top_p=0.9, seed=1)), ("maskgit_plus", {}),
               ("topk_margin", dict(temperature=0.7, top_k=9, seed=2)),
               ("entropy", dict(temperature=0.5, top_p=0.95, alg_temp=0.5, seed=3)), ("entropy", {})]


@pytest.mark.parametrize("alg,extra", DREAM_CASES)
def test_tiny_dream_equals_diffusion_generate(alg, extra):
    """The Goal itself: on a tiny Dream (shift 1, GQA, biases) cache=none == Dream's sampler."""
    m = tiny_dream()
    params = dream(gen_length=11, steps=5, alg=alg, **extra)
    for prompt in dream_prompts(2, [1, 6], seed=4):
        ref, _ = reference_generate(dense_logits(m), prompt, params, m.config.mask_token_id)
        out = make_engine(m, cache="none", max_num_logits=4).generate([prompt], params)[0]
        assert out.token_ids == ref
