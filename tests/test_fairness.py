"""Fair comparisons between the engine and the baselines (issue 12, item 0), float64 exactness.

* Retention: the engine keeps ⌊r·L_ctx⌋ context tokens per head, as Sparse-dLLM's code
  (`int(L_ctx * keep_ratio)` in CustomCache.filter_cache) — so with `selection=uniform` and the
  same knobs the engine emits the Sparse-dLLM baseline's tokens on ragged context lengths.
"""
from __future__ import annotations

import pytest
import torch

from baselines import make_system
from engine import SamplingParams
from engine.kv_cache import retained_tokens
from tests.helpers import make_engine, random_prompts, tiny_model

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_model(F64)


@pytest.mark.parametrize("context_len,retention", [(7, 0.5), (11, 0.5), (10, 0.3), (9, 0.75), (3, 0.25), (100, 0.29)])
def test_retention_rounds_down_as_upstream(context_len, retention):
    assert retained_tokens(context_len, retention) == int(context_len * retention)


@pytest.mark.parametrize("retention", [0.5, 0.3])
def test_uniform_engine_equals_sparse_dllm_baseline_on_ragged_contexts(model, retention):
    # prompt lengths chosen so r * L_ctx is fractional for most of them: ⌈⌉ and ⌊⌋ differ there
    lengths = [5, 9, 12, 7, 14]
    prompts = random_prompts(len(lengths), lengths, seed=31)
    params = SamplingParams(gen_length=12, steps=12, block_length=4, seed=5)
    fractional = [(p + params.gen_length - params.block_length) * retention for p in lengths]
    assert sum(f != int(f) for f in fractional) >= 3
    eng = make_engine(model, cache="sparse", selection="uniform", retention=retention, pool_window=3,
                      delay_step=1, score_query="mean", max_num_logits=None)
    engine_tokens = [o.token_ids for o in eng.generate(prompts, params)]
    base = make_system("sparse-dllm", model, max_batch_size=1, keep_ratio=retention, kernel_size=3)
    base_tokens = [o.token_ids for o in base.generate(prompts, params)]
    assert engine_tokens == base_tokens


def test_context_too_short_to_keep_a_token_matches_the_baseline(model):
    """⌊0.5·1⌋ = 0: the Reuse steps attend to the block alone, in both implementations."""
    prompts = random_prompts(2, [1, 1], seed=3)
    params = SamplingParams(gen_length=4, steps=4, block_length=4, seed=2)
    eng = make_engine(model, cache="sparse", selection="uniform", retention=0.5, max_num_logits=None)
    base = make_system("sparse-dllm", model, max_batch_size=1, keep_ratio=0.5, kernel_size=3)
    assert [o.token_ids for o in eng.generate(prompts, params)] == [o.token_ids for o in base.generate(prompts, params)]
