"""`cache=auto` with a request no cache mode can hold (engine.kv_cache.never_cached): admitted
`none` (no KV, every step a full Refresh, chunked beyond the token budget) instead of refused.

* the rule: `none` exactly when even the sparse need exceeds the whole pool, whatever is free;
* float64: such a request's tokens equal the same request's under cache=none, packed or chunked,
  and in steps that mix it with dual and sparse members each member gets its tokens alone in its
  mode; it reserves no KV slots and the counters say `none`;
* a canvas 4x the token budget completes under auto on the tiny preset within a memory budget
  whose pool cannot hold it, every step within the profiled activation peak (the profiler
  measured the none mode's chunked Refresh).
"""
from __future__ import annotations

import pytest
import torch

from dllm_bench.checkpoints.load import load_model
from engine import SamplingParams, profiler
from engine.kv_cache import admission_mode, kv_need
from engine.request import Phase
from tests.helpers import make_engine, metered_steps, random_prompts, run_alone, tiny_model
from tests.test_cache_auto import _record_steps
from tests.test_engine_exact import _mixed_workload

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_model(F64)


@pytest.mark.parametrize("free, capacity, sparse, mode", [
    (40, 40, 41, "none"),       # even sparse exceeds the whole pool: none at once
    (0, 40, 41, "none"),        # ... however full the pool is (it needs no slots)
    (0, 40, 40, None),          # it fits the empty pool: it waits, as before
    (40, 40, 40, "sparse"),
    (None, None, 10**6, "dual"),  # an unbounded pool holds anything
])
def test_none_exactly_when_no_cache_mode_ever_holds_it(free, capacity, sparse, mode):
    assert admission_mode(free, 2 * sparse, sparse, "sparse", capacity) == mode


@pytest.mark.parametrize("chunked", [False, True])
def test_none_member_equals_cache_none_and_mixes_with_dual_and_sparse(model, chunked):
    """The mixed workload (pool 62, ridge 10^6: dual and sparse alternate) with a canvas of 126
    tokens (block 8, retention 0.5: sparse need ⌊0.5·118⌋ + 8 = 67 > 62) second in line. Chunked:
    a token budget of 40 holds every other canvas, the long one's Refreshes run in chunks of 16."""
    prompts, params = _mixed_workload()
    prompts.insert(1, random_prompts(1, 110, seed=3)[0])
    params.insert(1, SamplingParams(gen_length=16, steps=8, block_length=8, temperature=0.7, seed=6))
    kw = dict(retention=0.5, max_num_logits=5)
    if chunked:
        kw |= dict(max_num_batched_tokens=40, max_model_len=128, refresh_chunk_tokens=16)
    eng = make_engine(model, cache="auto", kv_pool_tokens=62, max_num_seqs=6, ridge_rows=10**6, **kw)
    steps = _record_steps(eng)
    outs = eng.generate(prompts, params)
    assert outs[1].cache == "none" and outs[1].kv_tokens == 0
    assert {o.cache for i, o in enumerate(outs) if i != 1} == {"dual", "sparse"}
    assert any({c for c, _ in s} == {"none", "dual", "sparse"} for s in steps)
    assert all(p is Phase.REFRESH for s in steps for c, p in s if c == "none")
    if chunked:
        assert max(q for _, _, q in eng.step_log) > 40                    # its Refresh ran in chunks
    for o, p, sp in zip(outs, prompts, params, strict=True):
        assert o.token_ids == run_alone(model, p, sp, cache=o.cache, **kw)
    st = eng.stats()
    assert (st["requests_none"], st["requests_dual"] + st["requests_sparse"]) == (1, 5)
    assert eng.pool.peak_used <= 62 and eng.pool.used == 0


def test_short_request_in_a_pool_it_fits_keeps_its_cache(model):
    """A pool that holds the request (even only once the others leave) never sends it to none."""
    prompts, params = _mixed_workload()
    eng = make_engine(model, cache="auto", kv_pool_tokens=30, ridge_rows=10**6, retention=0.5)
    outs = eng.generate(prompts, params)
    assert "none" not in {o.cache for o in outs} and eng.stats()["requests_none"] == 0


def test_long_canvas_completes_under_auto_within_the_profiled_budget(monkeypatch):
    """A canvas 4x the token budget on the tiny preset (float32), under a memory budget that
    leaves the pool about 40 slots (its sparse need is 136): admitted none, its chunked Refreshes
    within the activation peak the profiler reserved, having measured none's chunked Refresh at
    max_model_len and the cached modes' only at the canvases such a pool can hold in them."""
    model = load_model("tiny", "float32", "cpu")
    model.rope.reserve(4096, model.device, model.dtype)
    budget_tokens, length = 64, 256
    kw = dict(cache="auto", retention=0.5, max_num_batched_tokens=budget_tokens, max_num_logits=16,
              max_model_len=length, guard_fraction=0.0)
    seen = []
    measure = profiler.LongRefresh

    def recording(model, req, *args):
        seen.append((req.cache, req.length))
        return measure(model, req, *args)
    monkeypatch.setattr(profiler, "LongRefresh", recording)
    probe = make_engine(model, memory_budget=64 * 2**20, **kw).profile
    assert sorted(seen) == [("dual", length), ("none", length), ("sparse", length)]
    budget = probe.weights_bytes + probe.activation_peak_bytes + 40 * probe.bytes_per_token
    seen.clear()
    eng = make_engine(model, memory_budget=budget, **kw)
    prof = eng.profile
    assert 40 <= prof.kv_pool_tokens < 136
    # Each cached mode measured at a canvas no shorter than any the pool holds in it (safe), no
    # longer than the largest pool could (dual's is within the token budget: not measured).
    most = (budget - prof.weights_bytes - max(prof.refresh_peak_bytes, prof.reuse_peak_bytes)) // prof.bytes_per_token
    assert ("none", length) in seen and [m for m, _ in seen] == ["none", "sparse"]
    assert all(kv_need(m, n + 1, 1, 0.5) > prof.kv_pool_tokens and kv_need(m, n, 1, 0.5) <= most
               for m, n in seen if m != "none")
    params = SamplingParams(gen_length=32, steps=8, block_length=16, seed=3)
    eng.add_request(random_prompts(1, length - 32, seed=2)[0], params)
    out, peaks, queries = metered_steps(eng)
    assert out.finished and out.cache == "none" and out.nfe == 8 and len(out.token_ids) == 32
    assert queries == [length] * 8                      # every step a whole Refresh, in chunks
    assert max(peaks) <= prof.activation_peak_bytes, (max(peaks), prof.to_dict())
    assert eng.pool.peak_used == 0
