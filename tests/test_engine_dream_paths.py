"""The engine's other paths on a shifted family (tiny Dream, float64; tests/dream_helpers.py).

* a chunked Refresh (a canvas longer than the token budget) gives the unchunked engine's tokens
  for none / dual / sparse, and cache=none still equals the full-canvas sampler: the chunked
  Refresh hands over the row before the block with the block's;
* Reuse steps padded to CUDA-graph buckets (plain calls on a CPU) give the unpadded tokens for
  dual and sparse: the dummies query as many rows as a member (block + edge row);
* tensor parallel, CPU gloo, 2 processes: TP = 2 gives TP = 1's tokens and logit rows for the
  none, dual, sparse (head-centric, chunked logits) and auto caches, and a parallel size the KV
  heads cannot split is one line.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from baselines.reference_llada import reference_generate
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.models import config_from_dict
from engine.parallel.driver import Cluster, ParallelEngine
from engine.parallel.model import RankConfig
from tests.dream_helpers import DREAM, dream_prompts, tiny_dream, write_dream_checkpoint
from tests.helpers import make_engine

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_dream(seed=1)


# ---------------------------------------------------------------- chunked Refresh
def _long_workload():
    """Two canvases longer than the budgets below (61 and 45 tokens) and a short one."""
    prompts = dream_prompts(3, [45, 33, 5], seed=7)
    params = [SamplingParams(gen_length=16, steps=8, block_length=8, seed=1),
              SamplingParams(gen_length=12, steps=6, block_length=4, temperature=0.8, remasking="random", seed=2),
              SamplingParams(gen_length=8, steps=8, block_length=4, seed=3)]
    return prompts, params


@pytest.mark.parametrize("cache", ["none", "dual", "sparse"])
def test_chunked_refresh_equals_unchunked(model, cache):
    prompts, params = _long_workload()
    kw = dict(cache=cache, retention=0.5, max_num_logits=5)
    whole = make_engine(model, max_num_batched_tokens=128, **kw).generate(prompts, params)
    for budget, chunk in ((24, 5), (32, 16)):                        # 5 divides neither canvas
        eng = make_engine(model, max_num_batched_tokens=budget, max_model_len=128, refresh_chunk_tokens=chunk, **kw)
        out = eng.generate(prompts, params)
        assert [o.token_ids for o in out] == [o.token_ids for o in whole], (budget, chunk)
        assert [o.logits_rows for o in out] == [o.logits_rows for o in whole]
        assert max(q for _, _, q in eng.step_log) > budget               # a chunked Refresh ran


def test_chunked_none_equals_the_full_canvas_sampler(model):
    prompt = dream_prompts(1, 50, seed=9)[0]
    params = SamplingParams(gen_length=12, steps=6, block_length=4, temperature=0.5, seed=4)
    out = make_engine(model, cache="none", max_num_batched_tokens=16, max_model_len=64,
                      refresh_chunk_tokens=7).generate([prompt], params)[0]
    assert out.token_ids == reference_generate(model, prompt, params)[0]


# ---------------------------------------------------------------- CUDA-graph padding
def _staggered(model, cache: str, graphs: bool):
    eng = make_engine(model, cache=cache, cuda_graphs=graphs)
    prompts = dream_prompts(5, [3, 11, 6, 1, 8], seed=4)
    params = [SamplingParams(gen_length=g, steps=s, block_length=4) for g, s in [(8, 8), (12, 12), (16, 16),
                                                                                 (16, 16), (12, 6)]]
    arrivals = [0, 0, 0, 0, 17]          # Reuse-only steps of 4, then of 3 (bucket 4, one dummy), ...
    ids, out, t = [], {}, 0
    while len(ids) < len(prompts) or eng.has_unfinished():
        while len(ids) < len(prompts) and arrivals[len(ids)] <= t:
            ids.append(eng.add_request(prompts[len(ids)], params[len(ids)]))
        out.update((o.request_id, o.token_ids) for o in eng.step())
        t += 1
    return [out[x] for x in ids], eng


@pytest.mark.parametrize("cache", ["dual", "sparse"])
def test_bucketed_steps_give_the_tokens_of_unpadded_ones(model, cache):
    want, _ = _staggered(model, cache, graphs=False)
    got, eng = _staggered(model, cache, graphs=True)
    g = eng.runner.graphs
    assert got == want
    assert g.replays > len(g.entries) > 0 and g.dummies > 0        # really padded, replayed


# ---------------------------------------------------------------- tensor parallel
PROMPTS = dream_prompts(4, [3, 11, 6, 1], seed=4)
SHAPES = [(8, 4, 4), (12, 6, 6), (9, 9, 3), (10, 10, 5)]      # (gen_length, steps, block_length)
GREEDY = [SamplingParams(gen_length=g, steps=s, block_length=b) for g, s, b in SHAPES]
CASES = {
    "none": dict(cache="none"),
    "dual": dict(cache="dual"),
    "sparse-head-chunked": dict(cache="sparse", selection="head", retention=0.5, max_num_logits=3),
    "auto-mixed": dict(cache="auto", retention=0.5, kv_pool_tokens=50, max_num_seqs=4, ridge_rows=10**6),
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_dream_checkpoint(tiny_dream(seed=2), tmp_path_factory.mktemp("tp") / "dream")


@pytest.fixture(scope="module")
def cluster():
    c = Cluster.spawn(2, "cpu")
    yield c
    c.close()


def _config(ckpt, **kw) -> EngineConfig:
    return EngineConfig(model=str(ckpt), dtype="float64", device="cpu", attention_backend="sdpa", **kw)


@pytest.mark.parametrize("case", CASES)
def test_tp2_gives_tp1_tokens(cluster, ckpt, case):
    cfg = _config(ckpt, **CASES[case])
    ref = LLMEngine(cfg).generate(PROMPTS, GREEDY)
    eng = ParallelEngine(dataclasses.replace(cfg, tensor_parallel_size=2), cluster=cluster)
    try:
        out = eng.generate(PROMPTS, GREEDY)
        stats = eng.stats()
    finally:
        eng.close()
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    assert [o.logits_rows for o in out] == [o.logits_rows for o in ref]
    assert [o.cache for o in out] == [o.cache for o in ref]
    if case == "auto-mixed":
        assert stats["requests_dual"] > 0 and stats["requests_sparse"] > 0


def test_a_parallel_size_the_kv_heads_cannot_split_is_one_line():
    """Dream-7B's shape: 28 query heads split 7 ways, its 4 KV heads do not."""
    big = config_from_dict({**DREAM, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
                            "intermediate_size": 18944, "vocab_size": 152064})
    with pytest.raises(ValueError) as err:
        RankConfig.of(big, 7)
    assert str(err.value) == "tensor-parallel size 7 does not divide n_kv_heads = 4"
