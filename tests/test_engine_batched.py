"""The engine's step does host work independent of the batch (issue "engine efficiency").

* the batched attention of a step (`StepContext`: one padded call per phase group, keys read
  from the KV pool by slot tables) equals plain per-sequence SDPA in float64, on ragged batches
  of mixed phases (different Lq and Lk, GQA, sparse and dual Reuse), to 1e-12;
* the torch operator count of a step does not grow with the number of requests.
"""
from __future__ import annotations

import pytest
import torch

from benchmarks.dispatch_count import OpCounter
from engine import SamplingParams
from engine.attention import sdpa
from engine.request import Phase
from tests.helpers import make_engine, plain_attention, random_prompts, tiny_model

F64 = torch.float64


def _staggered(eng, prompts, params, check) -> int:
    """Add one request per step; call check(batch) before every step; return steps checked."""
    checked, i = 0, 0
    original = eng.runner.run

    def run(batch):
        nonlocal checked
        checked += check(batch)
        return original(batch)

    eng.runner.run = run
    while i < len(prompts) or eng.has_unfinished():
        if i < len(prompts):
            eng.add_request(prompts[i], params[i])
            i += 1
        eng.step()
    return checked


@pytest.mark.parametrize("cache,hkv,key_budget", [("sparse", 2, None), ("sparse", 1, None), ("dual", 2, None),
                                                  ("dual", 4, None), ("none", 2, None), ("sparse", 2, 40),
                                                  ("dual", 2, 40), ("none", 2, 40)])
def test_batched_attention_equals_per_sequence_sdpa(cache, hkv, key_budget):
    """key_budget=40 splits the phase groups into several chunks, whose outputs land in their
    rows of the step directly (ragged Refresh chunks drop their padding rows on the way)."""
    model = tiny_model(F64, n_kv_heads=hkv, seed=hkv)
    eng = make_engine(model, cache=cache, retention=0.5)
    if key_budget is not None:
        eng.runner.key_chunk = key_budget
    prompts = random_prompts(5, [3, 11, 6, 1, 17], seed=4)
    params = [SamplingParams(gen_length=g, steps=s, block_length=b)
              for g, s, b in [(8, 4, 4), (12, 6, 6), (8, 8, 2), (16, 8, 8), (6, 6, 3)]]
    g = torch.Generator().manual_seed(0)
    hq, d = model.config.n_heads, model.config.head_dim
    mixed = chunked = 0

    def check(batch) -> int:
        nonlocal mixed, chunked
        phases = {p.is_refresh for _, p in batch}
        mixed += len(phases) == 2
        prep = eng.runner.prepare(batch)
        chunked += len(prep.ctx.chunks) > len(phases)
        n = prep.meta.cu_q[-1]
        q = torch.randn(n, hq, d, dtype=F64, generator=g)
        k = torch.randn(n, hkv, d, dtype=F64, generator=g)
        v = torch.randn(n, hkv, d, dtype=F64, generator=g)
        saved = eng.pool.storage.clone()
        before = eng.pool.storage[0].clone()
        prep.ctx.finalize()
        out = prep.ctx(0, q, k, v)
        for i, (req, phase) in enumerate(batch):
            a, b = prep.meta.cu_q[i], prep.meta.cu_q[i + 1]
            if phase is Phase.REUSE:
                K, V = before[0, req.slots], before[1, req.slots]
                # the block's fresh K/V land in their slots: dual at the block's canvas
                # positions, sparse in the block slots after the retained ones
                s, e = req.block_range if cache == "dual" else (len(req.slots) - (b - a), len(req.slots))
                K[s:e], V[s:e] = k[a:b], v[a:b]
            else:
                K, V = k[a:b], v[a:b]
            want = sdpa(q[a:b].transpose(0, 1), K.transpose(0, 1), V.transpose(0, 1)).transpose(0, 1)
            torch.testing.assert_close(out[a:b], want, rtol=0, atol=1e-12)
            torch.testing.assert_close(out[a:b], plain_attention(q[a:b], K, V), rtol=0, atol=1e-12)
            if phase is Phase.REFRESH_STORE:            # dual: the Refresh stored every position
                torch.testing.assert_close(eng.pool.storage[0, 0, req.slots], k[a:b], rtol=0, atol=0)
            if phase is Phase.REUSE and cache == "sparse":  # the block's K/V stored in its block slots
                block_slots = req.slots[len(req.slots) - (b - a):]
                torch.testing.assert_close(eng.pool.storage[0, 0, block_slots], k[a:b], rtol=0, atol=0)
                torch.testing.assert_close(eng.pool.storage[0, 1, block_slots], v[a:b], rtol=0, atol=0)
        eng.pool.storage.copy_(saved)                   # the real step runs on the real K/V
        return len(batch) > 1

    assert _staggered(eng, prompts, params, check) > 0
    assert cache == "none" or mixed > 0                  # Refresh and Reuse groups in one step
    assert (chunked > 0) == (key_budget is not None)     # a group split into chunks, or never


def _max_ops(cache: str, n: int) -> int:
    model = tiny_model(torch.float32)
    eng = make_engine(model, cache=cache, retention=0.5, max_num_batched_tokens=4096, max_num_seqs=64)
    params = [SamplingParams(gen_length=32, steps=32, block_length=8)] * n
    counts = []

    def check(batch) -> int:
        return 0

    original = eng.step

    def step():
        with OpCounter() as c:
            out = original()
        counts.append(c.total)
        return out

    eng.step = step
    _staggered(eng, random_prompts(n, 24, seed=n), params, check)
    return max(counts)


@pytest.mark.parametrize("cache", ["dual", "sparse"])
def test_op_count_does_not_grow_with_requests(cache):
    """Staggered arrivals put 16 requests in every phase at once: the busiest step (two attention
    groups, Refresh and Reuse, where one request runs one) stays within 1.25x the busiest step of a
    single request, and going from 8 to 16 requests adds nothing per request."""
    one, eight, sixteen = _max_ops(cache, 1), _max_ops(cache, 8), _max_ops(cache, 16)
    assert sixteen <= 1.25 * one
    assert sixteen <= 1.05 * eight
