"""The mask id is never a proposal (engine.unmask.proposal_argmax), in every decoder.

A random model whose LM head always puts the mask id on top is the worst case: under LLaDA's
upstream rule every "committed" position would stay masked. Here each decoder must still fill
every position with a real token, and engine, reference and the LLaDA baseline must agree.
"""
from __future__ import annotations

import pytest
import torch

from baselines import make_system
from baselines.reference_llada import reference_generate
from engine import SamplingParams
from engine.models import DenseLM
from engine.unmask import gumbel_argmax, proposal_argmax
from tests.helpers import MASK, make_engine, random_prompts, tiny_model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_proposal_argmax_excludes_mask_and_restores(dtype):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=g).to(dtype)
    logits[:3, MASK] = 50.0                      # mask on top in half the rows
    logits[3, MASK] = logits[3].max()            # a tie with the real maximum
    before = logits.clone()
    x0 = proposal_argmax(logits, MASK)
    assert torch.equal(logits, before)           # restored bit for bit (the caller reads it next)
    assert (x0 != MASK).all()
    want = torch.cat([before[:, :MASK], before[:, MASK + 1:]], -1).argmax(-1)   # MASK is the last id
    assert torch.equal(x0, want)
    for T in (0.0, 1.0):
        x0 = gumbel_argmax(logits, T, torch.Generator().manual_seed(1), MASK)
        assert (x0 != MASK).all() and torch.equal(logits, before)


@pytest.fixture(scope="module")
def mask_loving_model():
    """tiny_model whose LM head lifts the mask id's logit 5 above the row maximum."""
    model = tiny_model(torch.float64)

    def lm_head(h):
        out = DenseLM.lm_head(model, h)
        out[..., MASK] = out.max(-1).values + 5.0
        return out

    model.lm_head = lm_head
    return model


CASES = [  # (gen, block, steps, temperature, remasking, seed)
    (8, 4, 8, 0.0, "low_confidence", 0),
    (12, 4, 6, 1.0, "low_confidence", 1),
    (8, 8, 4, 0.7, "random", 2),
]


@pytest.mark.parametrize("gen,block,steps,T,remasking,seed", CASES)
def test_mask_favouring_model_still_fills_every_position(mask_loving_model, gen, block, steps, T, remasking, seed):
    m = mask_loving_model
    sp = SamplingParams(gen_length=gen, steps=steps, block_length=block, temperature=T, remasking=remasking, seed=seed)
    p = random_prompts(1, 5, seed=seed)[0]
    ref, _ = reference_generate(m, p, sp)
    assert MASK not in ref
    for kw in (dict(cache="none", max_num_logits=3), dict(cache="none", max_num_logits=None),
               dict(cache="dual"), dict(cache="sparse", retention=0.5)):
        out = make_engine(m, **kw).generate([p], sp)[0].token_ids
        assert MASK not in out, kw
        if kw["cache"] == "none":
            assert out == ref, kw                # exact mode still equals the oracle
    assert make_system("llada", m, max_batch_size=1).generate([p], sp)[0].token_ids == ref
    for name in ("fast-dllm", "dllm-cache", "sparse-dllm"):
        assert MASK not in make_system(name, m, max_batch_size=1).generate([p], sp)[0].token_ids, name
