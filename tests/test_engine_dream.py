"""The engine on a shifted-prediction family (Dream: the hidden at p - 1 predicts token p), float64,
on a tiny Dream (GQA 14:2, q/k/v biases, odd lengths, prompts shorter and longer than a block).

* cache=none equals a plain full-canvas sampler on `DenseLM.forward`'s shifted rows
  (baselines.reference_llada with LLaDA's decisions; Dream's own decoding is not this file's);
* batch invariance for none, dual and sparse;
* the block edge (docs/ENGINE.md): cache=dual equals a plainly written dual cache whose windows
  query the row before the block too, without storing it; on every step the logit row of a masked
  position p is the LM head of the hidden at p - 1 computed in that step, the edge row's cached
  K/V never change within a block, and the LM head gets exactly the candidates' rows (the logit
  budget's chunking, or none, changes no token);
* cache=sparse at retention 1 and delay 0 equals dual (head and uniform selection); head-centric
  selection packs per KV head what a plain per-head loop over its 7 query heads picks;
* cache=auto mixing dual and sparse members: each request equals itself alone in its mode.
"""
from __future__ import annotations

import pytest
import torch

from baselines.reference_llada import reference_generate
from engine import SamplingParams
from engine.request import Phase
from engine.unmask import proposal_argmax
from tests.dream_helpers import MASK, dream_prompts, tiny_dream
from tests.helpers import kv_of, make_engine, run_alone
from tests.plain_dual import plain_dual_cache_generate, plain_full, plain_window
from tests.test_engine_mechanisms import check_refresh_select


@pytest.fixture(scope="module")
def model():
    return tiny_dream()


# (prompt_len, gen_length, block_length, steps, temperature, remasking, seed)
REF_CASES = [
    (5, 8, 8, 8, 0.0, "low_confidence", 0),      # prompt shorter than the block
    (11, 12, 4, 6, 0.0, "low_confidence", 1),    # longer than the block, 2 tokens per step
    (3, 12, 4, 6, 0.7, "low_confidence", 3),     # Gumbel sampling
    (9, 6, 3, 6, 0.0, "random", 2),              # odd block, random remasking
    (1, 5, 5, 5, 1.0, "random", 5),              # a one-token prompt: the first candidate reads it
]


@pytest.mark.parametrize("P,gen,block,steps,temp,remask,seed", REF_CASES)
def test_none_equals_the_full_canvas_sampler(model, P, gen, block, steps, temp, remask, seed):
    params = SamplingParams(gen_length=gen, steps=steps, block_length=block, temperature=temp,
                            remasking=remask, seed=seed)
    prompt = dream_prompts(1, P, seed=100 + P)[0]
    ref, nfe = reference_generate(model, prompt, params)
    out = make_engine(model, cache="none", max_num_logits=3).generate([prompt], params)[0]
    assert out.token_ids == ref and out.nfe == nfe == steps


def _mixed():
    prompts = dream_prompts(5, [3, 9, 5, 14, 1], seed=11)
    params = [SamplingParams(gen_length=8, steps=8, block_length=4, seed=1),
              SamplingParams(gen_length=12, steps=6, block_length=4, temperature=0.8, seed=2),
              SamplingParams(gen_length=5, steps=5, block_length=5, remasking="random", seed=3),
              SamplingParams(gen_length=16, steps=16, block_length=8, temperature=1.0, remasking="random", seed=4),
              SamplingParams(gen_length=6, steps=6, block_length=2, seed=5)]
    return prompts, params


@pytest.mark.parametrize("cache", ["none", "dual", "sparse"])
def test_batch_invariance(model, cache):
    prompts, params = _mixed()
    kw = dict(cache=cache, retention=0.5, max_num_logits=5)
    alone = [run_alone(model, p, sp, **kw) for p, sp in zip(prompts, params, strict=True)]
    eng = make_engine(model, **kw)
    ids, outs = [], {}
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):    # staggered: mixed phases per step
        ids.append(eng.add_request(p, sp))
        for _ in range(i):
            outs.update({o.request_id: o for o in eng.step()})
    while eng.has_unfinished():
        outs.update({o.request_id: o for o in eng.step()})
    assert [outs[i].token_ids for i in ids] == alone
    assert max(eng.batch_sizes) > 1


DUAL_CASES = [  # (prompt_len, gen, block, steps, temperature, remasking, seed)
    (6, 16, 8, 16, 0.0, "low_confidence", 0),
    (10, 12, 4, 6, 0.0, "low_confidence", 1),
    (4, 15, 5, 9, 0.9, "low_confidence", 2),
    (8, 8, 4, 8, 0.0, "random", 3),
]


def test_dual_equals_plain_dual_under_the_edge_rule(model):
    differs = 0
    for P, gen, block, steps, temp, remask, seed in DUAL_CASES:
        params = SamplingParams(gen_length=gen, steps=steps, block_length=block, temperature=temp,
                                remasking=remask, seed=seed)
        prompt = dream_prompts(1, P, seed=200 + seed)[0]
        want = plain_dual_cache_generate(model, prompt, params)
        out = make_engine(model, cache="dual", max_num_logits=4).generate([prompt], params)[0]
        assert out.token_ids == want, (P, gen, block, steps, temp, remask)
        differs += want != reference_generate(model, prompt, params)[0]
    assert differs >= 1          # the dual cache approximates: otherwise the equality shows nothing


def _instrument(eng):
    """Record every step's (PackedStep, hidden, candidate rows, decode result)."""
    seen, runner = [], eng.runner
    forward, decode = runner.forward, runner.decode_rows

    def fwd(p):
        h = forward(p)
        seen.append([p, h])
        return h

    def dec(lm_head, hidden, rows, *a, **kw):
        res = decode(lm_head, hidden, rows, *a, **kw)
        seen[-1] += [rows.clone(), res]
        return res

    runner.forward, runner.decode_rows = fwd, dec
    return seen


def test_each_logit_row_is_the_head_of_the_hidden_before_it_computed_in_that_step(model):
    """Dual cache, one request, step by step: against a plain full forward (block start) or a plain
    window over [s-1, e) (Reuse), the hidden row each candidate p decodes is the hidden at p - 1 of
    that step, the proposals are the argmax of its LM head, the LM head gets exactly the
    candidates' rows, a Reuse step queries block + 1 rows and is charged as many, and the edge
    row's cached K/V stay those of the block's full forward."""
    prompt, bl = dream_prompts(1, 7, seed=3)[0], 5
    params = SamplingParams(gen_length=15, steps=15, block_length=bl)
    eng = make_engine(model, cache="dual", max_num_logits=2)
    seen = _instrument(eng)
    eng.add_request(prompt, params)
    edge_reads, rows_total, cache, edge_kv, outs = 0, 0, None, None, []
    while eng.has_unfinished():
        req = eng.scheduler.running[0] if eng.scheduler.running else eng.scheduler.waiting[0]
        x, step_in_block = torch.from_numpy(req.host_canvas.copy()), req.step_in_block
        outs += eng.step()
        p, hidden, rows, res = seen[-1]
        s, e = p.meta.block_start[0], p.meta.block_start[0] + bl
        cand = torch.nonzero(x[s:e] == MASK).squeeze(-1) + s
        assert rows.numel() == cand.numel()                          # logit rows = candidates
        rows_total += cand.numel()
        assert torch.equal(p.positions[rows], cand - 1)
        if step_in_block == 0:
            want, cache = plain_full(model, x)
            want = want[cand - 1]
            edge_kv = kv_of(req)[:, :, :, s - 1].clone()
        else:
            assert int(p.meta.n_q[0]) == bl + 1 and eng.step_log[-1][2] == bl + 1
            assert eng.scheduler.policy.cost(req, Phase.REUSE) == bl + 1
            want = plain_window(model, x, [[k.clone(), v.clone()] for k, v in cache], s, e)[cand - s]
            edge_reads += bool((cand == s).any())
            if req.slots is not None:
                assert torch.equal(kv_of(req)[:, :, :, s - 1], edge_kv)   # the edge row is never stored
        torch.testing.assert_close(hidden[rows], want, rtol=0, atol=1e-10)   # float64, other op order
        assert torch.equal(res.x0, proposal_argmax(model.lm_head(want), MASK))
    assert edge_reads > 0                     # some Reuse step decoded the block's first position
    assert eng.counters["max_logits_rows_in_step"] == 2
    assert outs[0].logits_rows == rows_total and outs[0].nfe == params.steps


def _candidates(sp: SamplingParams) -> int:
    """Masked block positions summed over the steps of LLaDA's fixed schedule (all masked at first)."""
    n, S = sp.block_length, sp.steps_per_block
    sched = [n // S + (1 if i < n % S else 0) for i in range(S)]
    return sp.num_blocks * sum(n - sum(sched[:i]) for i in range(S))


@pytest.mark.parametrize("cache", ["none", "dual", "sparse"])
def test_logit_rows_charged_are_the_candidates(model, cache):
    """The edge row is queried but gets no logits: rows = candidates, as for an unshifted family."""
    prompts, params = _mixed()
    outs = make_engine(model, cache=cache, retention=0.5, max_num_logits=3).generate(prompts, params)
    assert [o.logits_rows for o in outs] == [_candidates(sp) for sp in params]
    for m in (1, None):                  # the budget's chunking (or none: every query row) changes no token
        other = make_engine(model, cache=cache, retention=0.5, max_num_logits=m).generate(prompts, params)
        assert [o.token_ids for o in other] == [o.token_ids for o in outs]


@pytest.mark.parametrize("selection", ["head", "uniform"])
def test_sparse_full_retention_without_delay_equals_dual(model, selection):
    """At retention 1 and delay 0 a sparse Reuse step reads every context key the dual one does
    (in another order), edge row included."""
    prompts, params = _mixed()
    dual = make_engine(model, cache="dual").generate(prompts, params)
    sparse = make_engine(model, cache="sparse", retention=1.0, delay_step=0, selection=selection).generate(
        prompts, params)
    assert [o.token_ids for o in sparse] == [o.token_ids for o in dual]
    assert [o.kv_tokens for o in sparse] == [len(p) + sp.gen_length for p, sp in zip(prompts, params, strict=True)]


@pytest.mark.parametrize("selection", ["uniform", "head"])
def test_refresh_select_packs_the_plainly_selected_rows_per_kv_head(model, selection):
    """The delayed select step of a GQA 7:1 Dream: head-centric keeps, per KV head, the top tokens
    by the max over its 7 query heads (dLLM-Serve); uniform one set for both heads (Sparse-dLLM)."""
    differ = check_refresh_select(model, dream_prompts(1, 8, seed=5)[0], selection)
    assert (differ > 0) == (selection == "head")          # the KV heads really choose apart


def test_auto_mixing_dual_and_sparse_equals_each_alone(model):
    prompts, params = _mixed()
    kw = dict(retention=0.5, max_num_logits=5, delay_step=1)
    eng = make_engine(model, cache="auto", kv_pool_tokens=62, max_num_seqs=5, ridge_rows=10**6, **kw)
    outs = eng.generate(prompts, params)
    assert {o.cache for o in outs} == {"dual", "sparse"}
    for o, p, sp in zip(outs, prompts, params, strict=True):
        assert o.token_ids == run_alone(model, p, sp, cache=o.cache, **kw)
