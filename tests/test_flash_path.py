"""The engine's flash-attn path, run on the CPU through a stand-in `flash_attn` package
(tests/standins) that asserts flash_attn_varlen_func's contracts (fp16/bf16, contiguous
q/k/v, int32 cu_seqlens on q's device, int max_seqlen, shapes) and computes with SDPA.

* per layer, the flash path's attention of every step of a staggered run (mixed Refresh and
  Reuse groups, ragged lengths, GQA, sparse and dual caches) matches the padded SDPA path's in
  bf16;
* a whole generation in bf16 makes one varlen call per phase group per layer, never split by
  the CPU key budget;
* backend choice: flash-attn only with a half dtype and an importable package, and for auto
  only where torch has no varlen_attn (tests/test_varlen_path.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from engine import SamplingParams
from engine.attention import choose_backend
from engine.step_context import StepContext
from tests.helpers import make_engine, random_prompts, tiny_model
from tests.test_engine_batched import _staggered

BF16 = torch.bfloat16
STANDINS = str(Path(__file__).parent / "standins")


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.syspath_prepend(STANDINS)
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    import flash_attn

    flash_attn.calls.clear()
    yield flash_attn
    monkeypatch.undo()                       # the path first, then forget the module for good
    sys.modules.pop("flash_attn", None)


def _params():
    return [SamplingParams(gen_length=g, steps=s, block_length=b)
            for g, s, b in [(8, 4, 4), (12, 6, 6), (8, 8, 2), (16, 8, 8), (6, 6, 3)]]


@pytest.mark.parametrize("cache", ["sparse", "dual", "none"])
def test_flash_path_matches_the_padded_sdpa_path_in_bf16(cache, standin):
    model = tiny_model(BF16, n_kv_heads=2, seed=3)
    eng = make_engine(model, cache=cache, retention=0.5, attention_backend="flash_attn")
    assert eng.attention.name == "flash_attn"
    g = torch.Generator().manual_seed(1)
    hq, hkv, d = model.config.n_heads, model.config.kv_heads, model.config.head_dim
    r = eng.runner

    def check(batch) -> int:
        prep = r.prepare(batch)
        m = prep.padded_meta
        from engine.step import Staging

        sdpa_ctx = StepContext(m, r.policy, r.pool, "sdpa", r.key_budget, Staging("cpu"), r.dtype)
        n = int(m.cu_q[-1])
        q, k, v = (torch.randn(n, h, d, generator=g).to(BF16) for h in (hq, hkv, hkv))
        saved = eng.pool.storage.clone()
        prep.ctx.finalize()
        got = prep.ctx(0, q, k, v)
        eng.pool.storage.copy_(saved)
        sdpa_ctx.finalize()
        want = sdpa_ctx(0, q, k, v)
        eng.pool.storage.copy_(saved)
        torch.testing.assert_close(got.float(), want.float(), rtol=0.02, atol=0.02)
        return 1

    assert _staggered(eng, random_prompts(5, [3, 11, 6, 1, 17], seed=5), _params(), check) > 0
    assert standin.calls and all(c["dtype"] == BF16 for c in standin.calls)


def test_one_varlen_call_per_group_per_layer(standin):
    model = tiny_model(BF16, seed=2)
    eng = make_engine(model, cache="dual", attention_backend="flash_attn", max_num_batched_tokens=4096)
    eng.runner.key_budget = eng.runner.key_chunk = 8     # would split every padded group into chunks
    steps = []
    original = eng.runner.run

    def run(batch):
        before = len(standin.calls)
        out = original(batch)
        groups = len({p.is_refresh for _, p in batch})
        steps.append((len(standin.calls) - before, groups * model.config.n_layers))
        return out

    eng.runner.run = run
    outs = eng.generate(random_prompts(4, [5, 9, 3, 12], seed=2), SamplingParams(gen_length=8, steps=4, block_length=4))
    assert all(o.finished for o in outs)
    assert steps and all(calls == want for calls, want in steps)


def test_backend_choice(standin, monkeypatch):
    cpu = torch.device("cpu")
    assert choose_backend("auto", cpu, BF16).name == "sdpa"                # auto never picks it on a CPU
    assert choose_backend("flash_attn", cpu, BF16).name == "flash_attn"    # the stand-in runs on a CPU
    with pytest.raises(ValueError, match="float16/bfloat16"):
        choose_backend("flash_attn", cpu, torch.float32)
    cuda = torch.device("cuda")
    import torch.nn.attention.varlen as torch_varlen

    monkeypatch.delattr(torch_varlen, "varlen_attn")                  # a torch before 2.10: flash-attn next
    assert choose_backend("auto", cuda, BF16).name == "flash_attn"
    assert choose_backend("auto", cuda, torch.float32).name == "sdpa"      # fp32 model: SDPA, with a reason
    monkeypatch.setitem(sys.modules, "flash_attn", None)              # found but not importable
    assert choose_backend("auto", cuda, BF16).name == "sdpa"
    with pytest.raises(ValueError, match="flash-attn package"):
        choose_backend("flash_attn", cuda, BF16)


@pytest.mark.parametrize("cache, in_place", [("dual", True), ("sparse", True), ("dual", False), ("sparse", False)])
def test_bucketed_flash_steps_match_unpadded_ones(cache, in_place, standin):
    """Graph steps on the flash path: keys read in place from the pool (a static number of
    segments, dummies attending to nothing) or gathered and padded to a static total with
    max_seqlen_k static; each bucketed step's hidden states match the unpadded step's (bf16)."""
    model = tiny_model(BF16, seed=6)
    eng = make_engine(model, cache=cache, attention_backend="flash_attn", cuda_graphs=True)
    eng.runner.in_place_keys = in_place
    graphs, checked = eng.runner.graphs, []
    original = graphs.run

    def run(batch):
        saved = eng.pool.storage.clone()
        p, hidden, replayed = original(batch)
        eng.pool.storage.copy_(saved)
        want = eng.runner.forward(eng.runner.prepare(batch))
        torch.testing.assert_close(hidden.float(), want.float(), rtol=0.02, atol=0.02)
        checked.append(len(p.padded_meta.n_q) - len(batch))
        assert not replayed                                    # no capture on a CPU: plain calls
        return p, hidden, replayed

    graphs.run = run
    prompts = random_prompts(5, [4, 9, 6, 3, 7], seed=3)
    outs = eng.generate(prompts, SamplingParams(gen_length=8, steps=8, block_length=4))
    assert all(o.finished for o in outs)
    assert checked and max(checked) > 0                        # padded steps among them
    assert all(c["lk"] for c in standin.calls)
    assert {k[1] == 0 for k in graphs.entries} == {in_place}   # static keys: 0 = read in place
