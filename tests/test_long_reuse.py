"""Canvases longer than the token budget cost the KV pool nothing an ordinary step does not
(docs/MEMORY.md, "A long Reuse"):

* attention over key chunks merged by log-sum-exp equals one softmax over every key;
* a long request's Reuse steps attend over key chunks of at most the token budget and give the
  float64 tokens of the same engine attending to all its keys at once (dual, sparse; GQA, MHA);
* the profiled KV pool of an engine serving canvases up to the model's length equals the pool of
  the same engine with max_model_len = its token budget, where the canvas's own state fits
  within the ordinary peak (tiny at a 1,024-token budget; the cpu-default preset).
"""
from __future__ import annotations

import pytest
import torch

from dllm_bench.checkpoints.load import load_model
from engine import SamplingParams, step_context
from engine.attention import attention_over_key_chunks, key_piece, sdpa
from tests.helpers import make_engine, random_prompts, tiny_model

F64 = torch.float64


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 4), (8, 1)])
def test_key_chunks_equal_one_softmax(hq, hkv):
    g = torch.Generator().manual_seed(hq + hkv)
    q, k, v = (torch.randn(n, h, 16, dtype=F64, generator=g) for n, h in ((7, hq), (50, hkv), (50, hkv)))
    want = sdpa(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)
    kt, vt = k.transpose(0, 1), v.transpose(0, 1)
    for n in (1, 7, 16, 50, 64):
        got = attention_over_key_chunks(q, ((kt[:, a : a + n], vt[:, a : a + n]) for a in range(0, 50, n)))
        # float64: the merge only reorders the softmax's sums (rounding at 1e-16, not a wrong key set)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_a_key_piece_takes_no_more_than_the_gathered_token_budget():
    for dtype in (torch.float32, torch.bfloat16, F64):
        es = torch.empty(0, dtype=dtype).element_size()
        for hq, hkv, d, lq in ((4, 2, 16, 32), (32, 8, 128, 32), (8, 8, 128, 256)):
            n = key_piece(2048, lq, hq, hkv, d, dtype)
            acc = 4 if dtype is torch.bfloat16 else es
            piece = n * (2 * hkv * d * es + (2 * hkv * d * 4 if acc != es else 0) + hq * lq * acc)
            assert 1 <= n < 2048 and piece <= 2048 * 2 * hkv * d * es


@pytest.mark.parametrize("cache,hkv", [("dual", 2), ("sparse", 2), ("dual", 4), ("sparse", 1)])
def test_long_reuse_over_key_chunks_gives_the_tokens_of_one_softmax(monkeypatch, cache, hkv):
    """A 64-token canvas under a 16-token budget: every Reuse step's keys (64 dual, 40 sparse)
    are over the budget, so they are attended in key chunks; the same engine attending to all
    of them at once (its key chunk unbounded) commits the same float64 tokens."""
    model = tiny_model(F64, n_kv_heads=hkv, seed=hkv)
    prompts = random_prompts(2, [48, 5], seed=11)
    params = [SamplingParams(gen_length=16, steps=8, block_length=8, seed=1),
              SamplingParams(gen_length=8, steps=4, block_length=4, temperature=0.7, seed=2)]
    calls = []

    def counted(q, pieces):
        pieces = list(pieces)
        calls.append(len(pieces))
        return attention_over_key_chunks(q, iter(pieces))

    outs = []
    for unbounded in (False, True):
        monkeypatch.setattr(step_context, "attention_over_key_chunks", counted)
        eng = make_engine(model, cache=cache, retention=0.5, max_num_batched_tokens=16, max_model_len=64)
        if unbounded:
            eng.runner.key_chunk = 10**6
        outs.append([o.token_ids for o in eng.generate(prompts, params)])
        assert (max(calls, default=0) > 1) is not unbounded      # several key chunks, or none at all
        calls.clear()
    assert outs[0] == outs[1]


def _pools(model, **kw) -> tuple[int, int]:
    """(the pool profiled with max_model_len the model's length, with max_model_len = the token budget)."""
    model.rope.reserve(model.config.max_sequence_length, model.device, model.dtype)
    long = make_engine(model, **kw).profile
    short = make_engine(model, max_model_len=kw["max_num_batched_tokens"], **kw).profile
    assert long.long_canvas and long.refresh_chunk_tokens is not None and short.refresh_chunk_tokens is None
    return long.kv_pool_tokens, short.kv_pool_tokens


def test_serving_the_models_length_leaves_the_pool_of_the_token_budget_tiny():
    """tiny at a 1,024-token budget (a quarter of its length), 256 logit rows: before key chunks a
    4,096-key Reuse's scores and gathered keys cost 1.4 % of the pool."""
    model = load_model("tiny", "float32", "cpu")
    long, short = _pools(model, cache="auto", memory_budget=64 * 2**20, max_num_batched_tokens=1024,
                         max_num_logits=256)
    assert long == short


@pytest.mark.slow
def test_serving_the_models_length_leaves_the_pool_of_the_token_budget_cpu_default():
    """The cpu-default preset (similar-1024, 1300 MiB, 2,048-token budget, 4,096-token length):
    before key chunks the pool was 9,730 tokens against 9,986."""
    model = load_model("similar-1024", "float32", "cpu")
    long, short = _pools(model, cache="auto", memory_budget=1300 * 2**20, max_num_batched_tokens=2048,
                         max_num_logits=256)
    assert long == short
