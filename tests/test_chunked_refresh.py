"""A Refresh longer than the token budget, in chunks (engine.chunking; issue "long contexts").

* float64 tokens of chunked Refreshes equal the unchunked engine's (the same engine with a token
  budget that holds the canvas), for the none / dual / sparse caches, GQA and MHA, chunk sizes
  that do and do not divide the canvas, sampling, random remasking and a parallel policy, with
  short requests decoded in the same steps; cache=none also equals LLaDA's sampler;
* a request 4x longer than max_num_batched_tokens completes under a memory budget with every
  step's measured peak within the profiled activation peak, the long Refresh's own included;
* the scheduler charges a long Refresh over several steps while a short request's Reuse steps
  keep running in every step (scheduler=request: every step of a long canvas); by default
  (max_model_len the checkpoint's) with no other setting; lookahead refuses, saying why.
"""
from __future__ import annotations

import time

import pytest
import torch

from baselines.reference_llada import reference_generate
from dllm_bench.checkpoints.load import load_model
from engine import EngineConfig, SamplingParams
from engine.chunking import refresh_rows
from engine.request import Phase, Request
from tests.helpers import make_engine, metered_steps, random_prompts, tiny_model
from tests.test_flash_path import standin  # noqa: F401  (the fixture)

F64 = torch.float64


@pytest.fixture(scope="module")
def gqa():
    return tiny_model(F64)


@pytest.fixture(scope="module")
def mha():
    return tiny_model(F64, n_kv_heads=4, seed=1)


def _workload():
    """Two long canvases (61 and 45 tokens) and a short one, in one engine."""
    prompts = random_prompts(3, [45, 33, 5], seed=7)
    params = [SamplingParams(gen_length=16, steps=8, block_length=8, seed=1),
              SamplingParams(gen_length=12, steps=6, block_length=4, temperature=0.8, remasking="random", seed=2),
              SamplingParams(gen_length=8, steps=8, block_length=4, seed=3)]
    return prompts, params


@pytest.mark.parametrize("cache,selection", [("none", "head"), ("dual", "head"), ("sparse", "head"),
                                             ("sparse", "uniform")])
@pytest.mark.parametrize("model_name", ["gqa", "mha"])
def test_chunked_equals_unchunked(request, model_name, cache, selection):
    model = request.getfixturevalue(model_name)
    prompts, params = _workload()
    kw = dict(cache=cache, selection=selection, retention=0.5, max_num_logits=5)
    whole = make_engine(model, max_num_batched_tokens=128, **kw).generate(prompts, params)
    for budget, chunk in ((24, 5), (32, 7), (24, 16), (40, 64)):      # 5 and 7 divide neither canvas
        eng = make_engine(model, max_num_batched_tokens=budget, max_model_len=128, refresh_chunk_tokens=chunk, **kw)
        out = eng.generate(prompts, params)
        assert [o.token_ids for o in out] == [o.token_ids for o in whole], (budget, chunk)
        assert [o.nfe for o in out] == [sp.steps for sp in params]
        assert max(q for _, _, q in eng.step_log) > budget               # a chunked Refresh ran


def test_chunked_parallel_decoding_and_entropy(gqa):
    prompts = random_prompts(2, [40, 6], seed=5)
    params = [SamplingParams(gen_length=16, steps=16, block_length=8, decoding="entropy:0.5", seed=1),
              SamplingParams(gen_length=8, steps=8, block_length=4, decoding="threshold:0.3", seed=2)]
    kw = dict(cache="sparse", retention=0.5, max_num_logits=4)
    whole = make_engine(gqa, max_num_batched_tokens=128, **kw).generate(prompts, params)
    out = make_engine(gqa, max_num_batched_tokens=24, max_model_len=64, refresh_chunk_tokens=9,
                      **kw).generate(prompts, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in whole]
    assert [o.steps_per_block for o in out] == [o.steps_per_block for o in whole]


def test_chunked_none_equals_llada_sampler(gqa):
    prompt = random_prompts(1, 50, seed=9)[0]
    params = SamplingParams(gen_length=12, steps=6, block_length=4, temperature=0.5, seed=4)
    ref, _ = reference_generate(gqa, prompt, params)
    out = make_engine(gqa, cache="none", max_num_batched_tokens=16, max_model_len=64,
                      refresh_chunk_tokens=6).generate([prompt], params)
    assert out[0].token_ids == ref


def test_long_request_within_profiled_activation_budget():
    """A canvas 4x the token budget on the tiny preset (float32), under a memory budget: the
    profiler sizes the chunk and reserves the chunked peak; every step's measured peak stays
    within it."""
    model = load_model("tiny", "float32", "cpu")
    budget_tokens, length = 64, 256
    make_engine(model, cache="none").generate(random_prompts(1, 4), SamplingParams(gen_length=4, steps=1,
                                                                                    block_length=4))   # RoPE table
    eng = make_engine(model, cache="sparse", retention=0.5, max_num_batched_tokens=budget_tokens, max_num_logits=16,
                      memory_budget=64 * 2**20, max_model_len=length)
    prof = eng.profile
    assert prof.refresh_chunk_tokens is not None and prof.refresh_chunk_tokens <= budget_tokens
    assert prof.activation_peak_bytes >= prof.long_refresh_peak_bytes > 0
    params = SamplingParams(gen_length=32, steps=8, block_length=16, temperature=1.0, seed=3)
    eng.add_request(random_prompts(1, length - 32, seed=2)[0], params)
    out, peaks, queries = metered_steps(eng)
    assert out.finished and len(out.token_ids) == 32 and out.nfe == 8
    assert max(queries) == length                       # the Refreshes ran whole, in chunks
    assert max(peaks) <= prof.activation_peak_bytes, (max(peaks), prof.to_dict())
    assert max(peaks) >= 0.5 * prof.long_refresh_peak_bytes   # the bound is not vacuous


def test_reuse_work_runs_while_a_long_refresh_accrues(gqa):
    eng = make_engine(gqa, cache="dual", max_num_batched_tokens=16, max_model_len=64, refresh_chunk_tokens=8)
    short = eng.add_request(random_prompts(1, 4, seed=1)[0], SamplingParams(gen_length=16, steps=16, block_length=4))
    long = eng.add_request(random_prompts(1, 60, seed=2)[0], SamplingParams(gen_length=4, steps=2, block_length=4))
    ran = {short: [], long: []}
    outs = {}
    while eng.has_unfinished():
        batch = eng.scheduler.schedule(time.perf_counter())
        names = {r.request_id for r, _ in batch}
        for rid in ran:
            ran[rid].append(rid in names)
        if eng.scheduler.policy.credit:
            assert eng.scheduler.deferred == 1          # a planned wait, not a stall
        st = eng.runner.run(batch)
        eng.commit(batch, st.decisions)
        for req in eng.advance(batch, time.perf_counter()):
            eng.scheduler.finish(req)
            outs[req.request_id] = req.output()
    assert outs[short].nfe == 16 and outs[long].nfe == 2
    first_short_end = ran[short].index(False) if False in ran[short] else len(ran[short])
    assert first_short_end == 16                        # the short request ran in every step until done
    assert sum(ran[long][:16]) >= 1                     # the long one ran in between, after accruing
    assert ran[long].index(True) > 0


def test_default_engine_serves_canvases_up_to_the_models_length(gqa):
    """max_model_len left to the checkpoint's length: a canvas 4x the token budget is refreshed in
    chunks with no other setting (the tokens of an engine whose budget holds it); one over the
    model's length is refused, the error naming that length."""
    prompts, params = random_prompts(1, 56, seed=4), SamplingParams(gen_length=8, steps=4, block_length=4)
    whole = make_engine(gqa, cache="sparse", max_num_batched_tokens=128).generate(prompts, params)
    eng = make_engine(gqa, cache="sparse", max_num_batched_tokens=16)
    assert eng.max_model_len == gqa.config.max_sequence_length
    out = eng.generate(prompts, params)
    assert out[0].token_ids == whole[0].token_ids and max(q for _, _, q in eng.step_log) == 64
    n = gqa.config.max_sequence_length
    with pytest.raises(ValueError, match=rf"= {n + 1} exceeds the model's length of {n} tokens \(max_model_len\)"):
        eng.add_request(random_prompts(1, n - 7)[0], params)


def test_request_scheduler_charges_every_step_of_a_long_canvas_over_several(gqa):
    """scheduler=request charges every step the whole canvas: a long canvas accrues credit for
    each step, Reuse steps too, and decodes the tokens of an engine whose budget holds it."""
    prompts, params = _workload()
    kw = dict(cache="dual", scheduler="request", max_num_logits=5)
    whole = make_engine(gqa, max_num_batched_tokens=128, **kw).generate(prompts, params)
    eng = make_engine(gqa, max_num_batched_tokens=24, refresh_chunk_tokens=7, **kw)
    out = eng.generate(prompts, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in whole]
    assert [o.nfe for o in out] == [sp.steps for sp in params]
    assert max(q for _, _, q in eng.step_log) == 61                      # the 61-token Refresh, chunked
    assert eng.counters["deferred_requests"] > 0 and eng.counters["stalled_requests"] == 0


def test_lookahead_and_several_ranks_say_why_they_refuse_long_canvases(gqa):
    from engine.scheduler import long_refusal

    eng = make_engine(gqa, scheduler="lookahead", max_num_batched_tokens=16)
    with pytest.raises(ValueError, match=r"^scheduler=lookahead: its ledger plans every step whole within the "
                                         r"token budget, so a canvas longer than the token budget cannot be served"):
        eng.add_request(random_prompts(1, 20)[0], SamplingParams(gen_length=4, steps=4, block_length=4))
    assert "several ranks" in long_refusal(EngineConfig(tensor_parallel_size=2))
    assert long_refusal(EngineConfig()) == ""


def test_serving_long_canvases_is_a_fact_of_the_scheduling_policy(monkeypatch):
    """serves_long asks the policy registry (`chunks_long_refresh`), not the scheduler's name."""
    from engine import scheduler as policies

    def cfg(scheduler: str) -> EngineConfig:
        return EngineConfig(scheduler=scheduler, max_num_batched_tokens=16)
    assert {s: policies.serves_long(cfg(s)) for s in policies.POLICIES} == {
        "phase": True, "request": True, "lookahead": False}
    monkeypatch.setattr(policies.LookaheadPolicy, "chunks_long_refresh", True)
    monkeypatch.setattr(policies.PhasePolicy, "chunks_long_refresh", False)
    assert policies.serves_long(cfg("lookahead")) and not policies.serves_long(cfg("phase"))
    assert not policies.serves_long(cfg("request"))                  # the phase policy, its cost flag set
    assert policies.long_schedulers() == ["lookahead"]


def test_block_longer_than_budget_refused(gqa):
    eng = make_engine(gqa, cache="dual", max_num_batched_tokens=16, max_model_len=64)
    with pytest.raises(ValueError, match="Reuse steps could never be scheduled"):
        eng.add_request(random_prompts(1, 4)[0], SamplingParams(gen_length=32, steps=4, block_length=32))


def test_chunked_flash_path_matches_sdpa(standin):  # noqa: F811  (the imported fixture)
    """On the flash-attn path each chunk is one varlen call over the whole canvas's keys (the
    stand-in checks flash-attn's contracts); its rows match the SDPA path's in bf16."""
    model = tiny_model(torch.bfloat16, seed=3)
    req = Request("r", random_prompts(1, 37, seed=1)[0], SamplingParams(gen_length=8, steps=4, block_length=4),
                  model.config.mask_token_id)
    config = EngineConfig(device="cpu", dtype="bfloat16")
    got = refresh_rows(model, req, Phase.REFRESH, None, config, chunk=10, backend="flash_attn")
    want = refresh_rows(model, req, Phase.REFRESH, None, config, chunk=10, backend="sdpa")
    # bf16 rounding through two layers of large random weights: ~0.05 at most; a wrong key set
    # (a chunk attending to itself only) differs by ~1.
    assert (got.float() - want.float()).abs().max() < 0.15
    assert len(standin.calls) == 5 * model.config.n_layers           # ceil(45 / 10) chunks per layer
    assert all(c["lk"] == [45] for c in standin.calls)


def test_profiler_sizes_the_chunk_to_the_activation_peak():
    """With max_model_len 4x the token budget the profiler measures the chunked Refresh at that
    length and picks a chunk within the ordinary worst step's peak: the pool is what a canvas of
    the token budget leaves, and larger than an engine whose token budget holds the whole canvas
    (the unchunked way to serve it) gets."""
    model = load_model("tiny", "float32", "cpu")
    model.rope.reserve(4096, model.device, model.dtype)     # not grown inside the first profile
    kw = dict(cache="sparse", max_num_logits=16, memory_budget=16 * 2**20)
    short = make_engine(model, max_num_batched_tokens=64, max_model_len=64, **kw).profile
    chunked = make_engine(model, max_num_batched_tokens=64, max_model_len=256, **kw).profile
    whole = make_engine(model, max_num_batched_tokens=256, max_model_len=256, **kw).profile
    assert short.refresh_chunk_tokens is None and short.long_refresh_peak_bytes == 0
    assert chunked.refresh_chunk_tokens in (32, 64)
    assert 0 < chunked.long_refresh_peak_bytes <= chunked.activation_peak_bytes
    assert chunked.activation_peak_bytes == short.activation_peak_bytes < whole.activation_peak_bytes
    assert chunked.kv_pool_tokens == short.kv_pool_tokens > whole.kv_pool_tokens


def test_default_profile_reserves_the_models_length_within_the_ordinary_peak():
    """max_model_len left to the checkpoint's (4096 on the tiny preset): the profiler measures the
    chunked Refresh of a 4096-token canvas. At a token budget of a quarter of it, that Refresh's
    state and one chunk fit within the ordinary worst step: the pool is exactly the pool of an
    engine that admits no longer canvas, and a 4x-budget canvas runs within the reservation. At a
    budget so small that the canvas's own state (hidden states and one layer's K/V, linear in its
    length) is over the ordinary peak, the reservation grows by exactly that excess."""
    model = load_model("tiny", "float32", "cpu")
    model.rope.reserve(4096, model.device, model.dtype)
    kw = dict(cache="sparse", retention=0.5, memory_budget=64 * 2**20)        # the default logit budget
    n = model.config.max_sequence_length
    for budget in (n // 4, 64):
        short = make_engine(model, max_num_batched_tokens=budget, max_model_len=budget, **kw).profile
        eng = make_engine(model, max_num_batched_tokens=budget, **kw)
        prof = eng.profile
        assert short.refresh_chunk_tokens is None and prof.refresh_chunk_tokens is not None
        assert prof.long_refresh_peak_bytes > 0 and prof.refresh_peak_bytes == short.refresh_peak_bytes
        assert prof.activation_peak_bytes == max(short.activation_peak_bytes, prof.long_refresh_peak_bytes,
                                                 prof.long_reuse_peak_bytes)
        if budget == 64:
            assert prof.kv_pool_tokens < short.kv_pool_tokens
            continue
        assert prof.activation_peak_bytes == short.activation_peak_bytes
        assert prof.kv_pool_tokens == short.kv_pool_tokens
        eng.add_request(random_prompts(1, n - 16, seed=2)[0], SamplingParams(gen_length=16, steps=2, block_length=16))
        out, peaks, queries = metered_steps(eng)
        assert out.finished and out.nfe == 2 and max(queries) == n
        assert max(peaks) <= prof.activation_peak_bytes


def test_a_budget_with_no_room_for_a_long_canvas_serves_the_token_budget():
    """A memory budget that holds every step within the token budget but not a longer canvas's
    reservation: the engine starts (as it did before long canvases were served by default), runs
    canvases up to the token budget, and refuses a longer one naming the max_model_len it has."""
    model = load_model("tiny", "float32", "cpu")
    model.rope.reserve(4096, model.device, model.dtype)
    kw = dict(cache="sparse", retention=0.5, max_num_batched_tokens=64)
    short = make_engine(model, max_model_len=64, memory_budget=64 * 2**20, **kw).profile
    long = make_engine(model, memory_budget=64 * 2**20, **kw).profile
    assert long.long_canvas and long.activation_peak_bytes > short.activation_peak_bytes
    # Between the weights plus either peak: the short one fits, the long one does not.
    budget = int((short.weights_bytes + (short.activation_peak_bytes + long.activation_peak_bytes) / 2 + 64 * 1024)
                 / (1 - short.guard_bytes / short.budget_bytes))
    eng = make_engine(model, memory_budget=budget, **kw)
    assert not eng.profile.long_canvas and eng.profile.refresh_chunk_tokens is None
    assert eng.profile.activation_peak_bytes == short.activation_peak_bytes and eng.max_model_len == 64
    with pytest.raises(ValueError, match=r"= 65 exceeds max_model_len 64 \(the model's length: 4096 tokens\)"):
        eng.add_request(random_prompts(1, 49, seed=3)[0], SamplingParams(gen_length=16, steps=2, block_length=16))
    eng.add_request(random_prompts(1, 48, seed=3)[0], SamplingParams(gen_length=16, steps=2, block_length=16))
    out, _, _ = metered_steps(eng)
    assert out.finished
