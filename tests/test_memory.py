"""The memory meter, the offline profiler's bound and what the logit budget buys (issue "mechanisms").

* MemoryMeter against known allocations: sizes, views, frees, peak vs current, and tensors
  from before the meter (weights, KV pool) not counted even through views;
* a real step with the token and logit budgets full stays within profile.activation_peak_bytes;
* monolithic logits grow the step peak by Δrows × vocab × element size; budgeted logits don't.
"""
from __future__ import annotations

import time

import pytest
import torch

from engine import SamplingParams
from engine.profiler import MemoryMeter
from engine.request import Status
from tests.helpers import (
    live_bytes,
    make_engine,
    predicted_logits_bytes,
    random_prompts,
    tensor_bytes,
    tiny_model,
)

F32 = torch.float32


def test_meter_counts_known_allocations():
    with MemoryMeter() as m:
        a = torch.zeros(1000, dtype=torch.float64)                 # 8000 bytes
        assert live_bytes(m) == 8000
        v1, v2 = a[10:], a.view(10, 100).t()                      # views share a's storage
        a.add_(1)                                                  # in place: no new storage
        assert live_bytes(m) == 8000
        b = torch.ones(500, dtype=F32)                             # + 2000
        assert live_bytes(m) == 10000
        del b
        assert live_bytes(m) == 8000
        del a
        assert live_bytes(m) == 8000                             # the views keep the storage alive
        del v1, v2
        assert live_bytes(m) == 0
        c = torch.empty(250, dtype=torch.int64)                    # 2000 < the 10000 peak
        assert live_bytes(m) == 2000
    assert m.peak_bytes == 10000
    assert tensor_bytes([c]) == 2000


def test_meter_ignores_tensors_from_before_it_started():
    weight = torch.randn(1000, 100)                                # 400 KB, exists before the meter
    kv = torch.zeros(2, 2, 3, 50, 16)
    x = torch.randn(10, 100)
    with MemoryMeter() as m:
        y = torch.nn.functional.linear(x, weight)                  # 10 x 1000 fp32 = 40 KB
        assert live_bytes(m) == 40000
        layer = kv[1, 0]                                           # a view into the "pool"
        layer[:, 5:10] = 1.0
        keys = torch.cat([layer, layer], dim=1)                    # a real allocation: 2 x 3 x 50 x 16 fp32
        assert live_bytes(m) == 40000 + tensor_bytes([keys])
        del layer, keys, y
    assert m.peak_bytes == 40000 + 2 * 3 * 50 * 16 * 4


def _warm(model):
    """Grow RoPE tables etc. once, so a measurement sees only the step's own transients."""
    make_engine(model, cache="none").generate(random_prompts(1, 4), SamplingParams(gen_length=4, steps=1, block_length=4))


def _measured_steps(eng) -> list[tuple[int, int, int]]:
    """Drive the engine to completion, metering the model work of every step (admission, which
    allocates KV storage in the pool, happens outside the meter): (peak, query tokens, logit rows)."""
    peaks = []
    while eng.has_unfinished():
        batch = eng.scheduler.schedule(time.perf_counter())
        with MemoryMeter() as m:
            st = eng.runner.run(batch)
        peaks.append((m.peak_bytes, st.query_tokens, st.max_logits_rows))
        now = time.perf_counter()
        for req, _ in batch:
            req.advance(now)
            if req.status is Status.FINISHED:
                eng.scheduler.finish(req)
    return peaks


@pytest.mark.parametrize("cache", ["none", "sparse", "dual", "auto"])
def test_full_step_within_profiled_bound(cache):
    model = tiny_model(F32, vocab_size=2048, embedding_size=2048)
    _warm(model)
    budget_tokens, logits = 128, 8
    eng = make_engine(model, cache=cache, max_num_batched_tokens=budget_tokens, max_num_logits=logits,
                      memory_budget=256 * 2**20, max_model_len=budget_tokens)
    prof = eng.profile
    assert prof is not None and prof.max_num_logits == logits and prof.kv_pool_tokens > 0
    # The token budget full of Refresh canvases whose whole generation is one block (many candidate
    # rows, sampled: Gumbel noise in the peak), then their Reuse steps.
    params = SamplingParams(gen_length=32, steps=4, block_length=32, temperature=1.0)
    for p in random_prompts(4, 32, seed=3):
        eng.add_request(p, params)
    steps = _measured_steps(eng)
    assert steps[0][1:] == (budget_tokens, logits)                # both budgets full in step 0
    peak = max(p for p, _, _ in steps)
    assert peak <= prof.activation_peak_bytes
    assert peak >= 0.5 * prof.refresh_peak_bytes                  # the bound is not vacuous


def _one_step_peak(model, n_requests: int, max_num_logits):
    """Peak of one Refresh step of n canvases of 64 tokens (60 prompt + one block of 4)."""
    eng = make_engine(model, cache="none", max_num_logits=max_num_logits, max_num_batched_tokens=4096)
    for p in random_prompts(n_requests, 60, seed=n_requests):
        eng.add_request(p, SamplingParams(gen_length=4, steps=4, block_length=4))
    batch = eng.scheduler.schedule(time.perf_counter())
    assert len(batch) == n_requests
    with MemoryMeter() as m:
        st = eng.runner.run(batch)
    return m.peak_bytes, st


def test_monolithic_peak_grows_with_rows_times_vocab():
    vocab = 8192
    model = tiny_model(F32, d_model=32, n_heads=2, n_kv_heads=1, mlp_hidden_size=64,
                       vocab_size=vocab, embedding_size=vocab)
    _warm(model)
    (mono2, st2), (mono4, st4) = _one_step_peak(model, 2, None), _one_step_peak(model, 4, None)
    assert (st2.max_logits_rows, st4.max_logits_rows) == (128, 256)      # every query row gets logits
    predicted = predicted_logits_bytes(256 - 128, vocab, F32)
    assert predicted == 128 * vocab * 4
    assert 1.0 <= (mono4 - mono2) / predicted <= 1.3, (mono2, mono4, predicted)
    (bud2, sb2), (bud4, sb4) = _one_step_peak(model, 2, 8), _one_step_peak(model, 4, 8)
    assert sb2.max_logits_rows == sb4.max_logits_rows == 8
    assert abs(bud4 - bud2) < 0.1 * predicted                                 # ~constant in rows
    assert bud4 < mono4 - predicted


def test_reuse_step_with_long_sparse_caches_within_profiled_bound():
    """Many short-block Reuse requests with long sparse caches: the SDPA path concatenates
    [cache; block] K/V for one request at a time, so the step stays within the profiled peak
    (this failed when the runner built every request's keys for a layer at once)."""
    model = tiny_model(F32, vocab_size=2048, embedding_size=2048)
    _warm(model)
    eng = make_engine(model, cache="sparse", retention=1.0, max_num_batched_tokens=256, max_num_logits=8,
                      memory_budget=256 * 2**20, max_model_len=128)
    for p in random_prompts(24, 124, seed=3):            # max_model_len-long canvases, 4-token blocks
        eng.add_request(p, SamplingParams(gen_length=4, steps=64, block_length=4))
    while len(eng.scheduler.running) < 20:               # admissions: a Refresh + the running Reuses
        eng.step()
    assert eng.pool.used < eng.pool.capacity // 100      # the pool is far from full: a legal state
    batch = eng.scheduler.schedule(time.perf_counter())
    with MemoryMeter() as m:
        eng.runner.run(batch)
    peak = m.peak_bytes
    assert peak <= eng.profile.activation_peak_bytes, (peak, eng.profile.to_dict())
