"""Exactness of the engine in float64 (issue "foundation").

* cache=none reproduces baselines.reference_llada.reference_generate (LLaDA's sampler) token for token, NFE = steps;
* batch invariance: requests decoded together get exactly the tokens each gets alone;
* cache=dual equals a plainly written Fast-dLLM dual cache (NVlabs/Fast-dLLM@24cc59e,
  tests/plain_dual.py) against the model's building blocks only (no engine.runner), and differs
  from cache=none;
* packed segments through padded SDPA (the CPU backend) equal a plain softmax(QK^T/sqrt(d))V, GQA and Lq != Lk included.
"""
from __future__ import annotations

import pytest
import torch

from baselines.reference_llada import reference_generate
from engine import SamplingParams
from engine.attention import choose_backend
from engine.models import dense_attention
from tests.helpers import make_engine, padded_varlen, plain_attention, random_prompts, run_alone, tiny_model
from tests.plain_dual import plain_dual_cache_generate

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_model(F64)


# (prompt_len, gen_length, block_length, steps, temperature, remasking, seed)
REF_CASES = [
    (5, 8, 8, 8, 0.0, "low_confidence", 0),      # one block, one token per step
    (7, 16, 4, 8, 0.0, "low_confidence", 0),     # 4 blocks, 2 tokens per step
    (3, 12, 4, 6, 0.7, "low_confidence", 3),     # Gumbel sampling, fixed seed
    (9, 8, 2, 8, 0.0, "random", 1),              # random remasking
    (4, 12, 6, 12, 1.0, "random", 5),            # both random streams at once
    (6, 8, 4, 16, 0.0, "low_confidence", 0),     # more steps than block tokens: zero-size steps
    (1, 4, 4, 1, 0.5, "low_confidence", 7),      # a whole block in one step
    (11, 6, 3, 4, 1.3, "low_confidence", 2),     # odd block, uneven schedule (2+1 per block)
]


@pytest.mark.parametrize("P,gen,block,steps,temp,remask,seed", REF_CASES)
def test_none_equals_reference(model, P, gen, block, steps, temp, remask, seed):
    params = SamplingParams(gen_length=gen, steps=steps, block_length=block, temperature=temp,
                            remasking=remask, seed=seed)
    prompt = random_prompts(1, P, seed=100 + P)[0]
    ref, ref_nfe = reference_generate(model, prompt, params)
    out = make_engine(model, cache="none", max_num_logits=3).generate([prompt], params)[0]
    assert out.token_ids == ref
    assert ref_nfe == steps and out.nfe == steps
    assert model.config.mask_token_id not in out.token_ids


def _mixed_workload():
    prompts = random_prompts(5, [3, 9, 5, 14, 1], seed=11)
    params = [
        SamplingParams(gen_length=8, steps=8, block_length=4, seed=1),
        SamplingParams(gen_length=12, steps=6, block_length=4, temperature=0.8, seed=2),
        SamplingParams(gen_length=4, steps=4, block_length=4, remasking="random", seed=3),
        SamplingParams(gen_length=16, steps=16, block_length=8, temperature=1.0, remasking="random", seed=4),
        SamplingParams(gen_length=6, steps=6, block_length=2, seed=5),
    ]
    return prompts, params


@pytest.mark.parametrize("cache", ["none", "dual", "sparse"])
def test_batch_invariance(model, cache):
    prompts, params = _mixed_workload()
    kw = dict(cache=cache, retention=0.5, max_num_logits=5)
    alone = [run_alone(model, p, sp, **kw) for p, sp in zip(prompts, params, strict=True)]
    eng = make_engine(model, **kw)
    together = eng.generate(prompts, params)
    assert [o.token_ids for o in together] == alone
    assert max(eng.batch_sizes) == len(prompts)          # really decoded concurrently
    # Staggered arrivals put requests in different phases in the same step.
    eng = make_engine(model, **kw)
    ids, outs = [], {}
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        ids.append(eng.add_request(p, sp))
        for _ in range(i + 1):
            outs.update({o.request_id: o for o in eng.step()})
    while eng.has_unfinished():
        outs.update({o.request_id: o for o in eng.step()})
    assert [outs[i].token_ids for i in ids] == alone


# ---------------------------------------------------------------- plain Fast-dLLM dual cache
DUAL_CASES = [  # (prompt_len, gen, block, steps, temperature, remasking, seed, n_kv_heads)
    (6, 16, 8, 16, 0.0, "low_confidence", 0, 2),
    (10, 12, 4, 6, 0.0, "low_confidence", 1, 4),
    (4, 16, 16, 8, 0.9, "low_confidence", 2, 2),
    (8, 8, 4, 8, 0.0, "random", 3, 1),
    (3, 12, 6, 12, 1.0, "low_confidence", 4, 2),
]


def test_dual_equals_plain_fast_dllm():
    differs = 0
    models = {h: tiny_model(F64, n_kv_heads=h, seed=h) for h in (1, 2, 4)}
    for P, gen, block, steps, temp, remask, seed, hkv in DUAL_CASES:
        m = models[hkv]
        params = SamplingParams(gen_length=gen, steps=steps, block_length=block, temperature=temp,
                                remasking=remask, seed=seed)
        prompt = random_prompts(1, P, seed=200 + seed)[0]
        want = plain_dual_cache_generate(m, prompt, params)
        out = make_engine(m, cache="dual", max_num_logits=4).generate([prompt], params)[0]
        assert out.token_ids == want, (P, gen, block, steps, temp, remask, hkv)
        assert out.nfe == steps and out.kv_tokens == P + gen
        differs += want != reference_generate(m, prompt, params)[0]
    assert differs >= 1      # the dual cache is an approximation: otherwise this test proves nothing


# ---------------------------------------------------------------- attention backends
@pytest.mark.parametrize("hkv", [4, 2, 1])
def test_varlen_sdpa_equals_plain_softmax(hkv):
    g = torch.Generator().manual_seed(hkv)
    hq, d = 4, 16
    lq, lk = [3, 5, 1, 8], [3, 9, 7, 8]                # Reuse-like (Lq < Lk) and Refresh-like segments
    cu = [0]
    for n in lq:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], hq, d, dtype=F64, generator=g)
    keys = [torch.randn(hkv, n, d, dtype=F64, generator=g) for n in lk]
    values = [torch.randn(hkv, n, d, dtype=F64, generator=g) for n in lk]
    out = padded_varlen(q, cu, keys, values)      # the padded SDPA a CPU attends with
    for i in range(len(lq)):
        want = plain_attention(q[cu[i] : cu[i + 1]], keys[i].transpose(0, 1), values[i].transpose(0, 1))
        torch.testing.assert_close(out[cu[i] : cu[i + 1]], want, rtol=0, atol=1e-12)
    # The model's own dense attention (reference sampler, baselines) agrees as well.
    kd, vd = keys[3].transpose(0, 1), values[3].transpose(0, 1)
    torch.testing.assert_close(dense_attention(0, q[cu[3]:], kd, vd), plain_attention(q[cu[3]:], kd, vd),
                               rtol=0, atol=1e-12)


def test_flash_attn_backend_rejected_on_cpu():
    with pytest.raises(ValueError, match="flash"):
        choose_backend("flash_attn", torch.device("cpu"))
