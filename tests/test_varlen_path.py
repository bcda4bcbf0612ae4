"""The engine's path through torch's `varlen_attn`, run on the CPU through a stand-in
(tests/standins/torch_varlen.py) that asserts the function's contracts (shapes, int32 cu_seq on
q's device, fp16/bf16, GQA only with enable_gqa, int max_q/max_k bounding every segment) and
computes with SDPA; both torch signatures (2.11: no enable_gqa; 2.12+: enable_gqa).

* backend choice: auto takes varlen_attn where torch has it, flash-attn next, padded SDPA last,
  each with its reason; by name only where usable;
* per layer, every step's attention of a staggered run (Refresh and Reuse groups, ragged, GQA)
  matches the padded SDPA path's in bf16;
* Reuse keys are read in place: the key tensor is the pool layer, one call per group per layer;
  requests whose slot table is in pieces are gathered in a second call;
* float64 (the stand-in allowed float64): a whole run's tokens equal the SDPA engine's, eager and
  padded to buckets, with the pool in one piece, fragmented, or reordered under the batch.
"""
from __future__ import annotations

import sys

import pytest
import torch

from dllm_bench.stepprofile.summary import graph_buckets
from engine import SamplingParams
from engine.attention import PackedKernel, choose_backend
from engine.graphs import StepGraphs
from engine.step import Staging
from engine.step_context import StepContext
from tests.helpers import make_engine, random_prompts, tiny_model
from tests.standins import torch_varlen as standin
from tests.test_engine_batched import _staggered

BF16, F64 = torch.bfloat16, torch.float64
SIGNATURES = {"2.12": standin.varlen_attn, "2.11": standin.varlen_attn_2_11}


@pytest.fixture
def varlen(monkeypatch):
    """Put a stand-in in place of torch's varlen_attn: `varlen("2.11")` or `varlen("2.12")`."""
    import torch.nn.attention.varlen as tv

    def use(sig: str = "2.12", float64: bool = False):
        monkeypatch.setattr(tv, "varlen_attn", SIGNATURES[sig])
        monkeypatch.setattr(standin, "DTYPES", standin.DTYPES | ({F64} if float64 else set()))
        standin.calls.clear()
        return standin
    return use


def _in_place(call: dict) -> bool:
    """A call over a pool layer in place: each member preceded by its query-less segment."""
    return call["segments"] % 2 == 0 and not any(call["lq"][0::2])


def _params():
    return [SamplingParams(gen_length=g, steps=s, block_length=b)
            for g, s, b in [(8, 4, 4), (12, 6, 6), (8, 8, 2), (16, 8, 8), (6, 6, 3)]]


def test_backend_choice_and_its_reason(varlen, monkeypatch):
    import torch.nn.attention.varlen as tv

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    varlen("2.12")
    c = choose_backend("auto", cuda, BF16)
    assert c.name == "varlen" and c.line.startswith("attention: torch varlen_attn (torch ")
    assert "GQA" not in c.why and "GQA by repeated K/V heads" in _choice_211(varlen).why
    assert choose_backend("auto", cpu, BF16).name == "sdpa"            # auto never picks a kernel on a CPU
    f32 = choose_backend("auto", cuda, torch.float32)
    assert f32.name == "sdpa" and "float32" in f32.why
    assert choose_backend("varlen", cpu, BF16).name == "varlen"            # the stand-in runs on a CPU
    with pytest.raises(ValueError, match="float16/bfloat16"):
        choose_backend("varlen", cpu, torch.float32)
    monkeypatch.delattr(tv.varlen_attn, "RUNS_ON_CPU")                 # torch's own: CUDA-only
    with pytest.raises(ValueError, match="needs CUDA"):
        choose_backend("varlen", cpu, BF16)
    monkeypatch.delattr(tv, "varlen_attn")                             # a torch before 2.10
    monkeypatch.setitem(sys.modules, "flash_attn", None)               # and no flash-attn
    none = choose_backend("auto", cuda, BF16)
    assert none.name == "sdpa" and "no varlen_attn" in none.why and "flash-attn does not import" in none.why
    with pytest.raises(ValueError, match="torch >= 2.10"):
        choose_backend("varlen", cuda, BF16)


def _choice_211(varlen):
    varlen("2.11")
    return choose_backend("auto", torch.device("cuda"), BF16)


@pytest.mark.parametrize("sig, hkv, cache", [("2.12", 2, "sparse"), ("2.12", 4, "dual"), ("2.11", 2, "dual"),
                                             ("2.11", 4, "sparse"), ("2.12", 2, "none")])
def test_varlen_path_matches_the_padded_sdpa_path_in_bf16(sig, hkv, cache, varlen):
    sv = varlen(sig)
    model = tiny_model(BF16, n_kv_heads=hkv, seed=3)
    eng = make_engine(model, cache=cache, retention=0.5, attention_backend="varlen")
    assert eng.attention.name == "varlen"
    g = torch.Generator().manual_seed(1)
    hq, d = model.config.n_heads, model.config.head_dim
    r = eng.runner

    def check(batch) -> int:
        prep = r.prepare(batch)
        m = prep.padded_meta
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
    assert sv.calls and all(c["dtype"] == BF16 for c in sv.calls)
    in_place = [c for c in sv.calls if _in_place(c)]
    # in place unless GQA needs K/V heads repeated (torch 2.11 has no enable_gqa)
    assert bool(in_place) == (cache != "none" and (hkv == 4 or sig == "2.12"))
    assert all(c["gqa"] == (hkv < 4 and sig == "2.12") for c in sv.calls)


def test_reuse_keys_are_read_in_place_one_call_per_group_per_layer(varlen):
    sv = varlen("2.12")
    model = tiny_model(BF16, n_kv_heads=4, seed=2)
    eng = make_engine(model, cache="dual", attention_backend="varlen", max_num_batched_tokens=4096)
    eng.runner.key_budget = eng.runner.key_chunk = 8     # would split every padded group into chunks
    steps, original = [], eng.runner.run

    def run(batch):
        before = len(sv.calls)
        out = original(batch)
        mine = sv.calls[before:]
        groups = len({p.is_refresh for _, p in batch})
        reuse = [c for c in mine if _in_place(c) and c["key_rows"] == eng.pool.storage.shape[2]]
        steps.append((len(mine), groups * model.config.n_layers, len(reuse), any(not p.is_refresh for _, p in batch)))
        return out

    eng.runner.run = run
    outs = eng.generate(random_prompts(4, [5, 9, 3, 12], seed=2), SamplingParams(gen_length=8, steps=4, block_length=4))
    assert all(o.finished for o in outs)
    assert steps and all(calls == want for calls, want, _, _ in steps)
    assert all((n == model.config.n_layers) == has_reuse for _, _, n, has_reuse in steps)


def _fragment(eng) -> None:
    """Leave the pool's free slots as one-slot holes, so the next requests' tables come in pieces."""
    tables = [eng.pool.reserve(1) for _ in range(48)]
    for t in tables[::2]:
        eng.pool.release(1, t)


def _f64_engine(cache: str, graphs: bool, sdpa: bool):
    model = tiny_model(F64, n_kv_heads=2, seed=4)
    eng = make_engine(model, cache=cache, cuda_graphs=graphs, retention=0.5)
    if not sdpa:                         # the varlen path at float64: the stand-in allows it
        r = eng.runner
        r.backend, r.kernel = "varlen", PackedKernel("varlen")
        if graphs:
            r.graphs = StepGraphs(r)
    return eng


def _tokens(eng, fragment: bool = False, reorder: bool = False):
    """`reorder`: slots held until step 4 go to the request arriving at step 5, below the
    first three's: from then on the step's members lie in the pool in another order."""
    if fragment:
        _fragment(eng)
    hole = eng.pool.reserve(40) if reorder else None
    prompts = random_prompts(6, [3, 11, 6, 1, 17, 8], seed=4)
    params = [SamplingParams(gen_length=g, steps=s, block_length=4)
              for g, s in [(8, 8), (12, 12), (8, 8), (16, 16), (8, 4), (12, 6)]]
    arrivals = [0, 0, 0, 5, 6, 9]        # three at once: Reuse-only steps of 3 (bucket 4)
    ids, out, t = [], {}, 0
    while len(ids) < len(prompts) or eng.has_unfinished():
        if hole is not None and t == 4:
            eng.pool.release(40, hole)
        while len(ids) < len(prompts) and arrivals[len(ids)] <= t:
            ids.append(eng.add_request(prompts[len(ids)], params[len(ids)]))
        out.update((o.request_id, o.token_ids) for o in eng.step())
        t += 1
    return [out[x] for x in ids]


@pytest.mark.parametrize("cache, graphs, fragment, reorder", [
    ("dual", False, False, False), ("sparse", False, False, True), ("dual", True, False, True),
    ("sparse", True, False, False), ("dual", False, True, False), ("sparse", True, True, False)])
def test_float64_tokens_equal_the_sdpa_engines(cache, graphs, fragment, reorder, varlen):
    sv = varlen("2.12", float64=True)
    want = _tokens(_f64_engine(cache, graphs=False, sdpa=True), reorder=reorder)
    eng = _f64_engine(cache, graphs, sdpa=False)
    assert _tokens(eng, fragment, reorder) == want
    in_place = [c for c in sv.calls if _in_place(c)]
    gathered_reuse = [c for c in sv.calls if not _in_place(c) and max(c["lq"]) < max(c["lk"])]
    assert in_place                                            # Reuse groups read in place
    assert bool(gathered_reuse) == fragment                    # tables in pieces: gathered
    if graphs:
        g = eng.runner.graphs
        assert {k[1] for k in g.entries} <= {0}                # buckets read in place; a table in pieces: eager
        if not fragment:
            assert g.dummies > 0 and g.replays > len(g.entries)
            assert any(0 in c["lk"][1::2] for c in in_place)   # the dummies attend to nothing


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch's own varlen kernels run on CUDA only")
@pytest.mark.parametrize("cache", ["dual", "sparse"])
def test_on_cuda_the_kernel_in_place_and_its_graphs_match_padded_sdpa(cache):
    """On a GPU, torch's real varlen_attn: every step's attention read in place matches the
    padded SDPA path's (bf16), and graph steps (captured, timed, kept or not) match eager ones."""
    from engine.attention import torch_varlen

    if torch_varlen() is None:
        pytest.skip("this torch has no varlen_attn")
    model = tiny_model(BF16, n_kv_heads=4, seed=3).to("cuda")
    eng = make_engine(model, cache=cache, retention=0.5, attention_backend="varlen", device="cuda",
                      kv_pool_tokens=2048, cuda_graphs=True)
    r, g = eng.runner, torch.Generator(device="cuda").manual_seed(1)
    hq, d = model.config.n_heads, model.config.head_dim

    def check(batch) -> int:
        prep = r.prepare(batch)
        m = prep.padded_meta
        staging = Staging("cuda")
        sdpa_ctx = StepContext(m, r.policy, r.pool, "sdpa", r.key_budget, staging, r.dtype)
        staging.flush()
        n = int(m.cu_q[-1])
        q, k, v = (torch.randn(n, h, d, generator=g, device="cuda").to(BF16) for h in (hq, 4, 4))
        saved = eng.pool.storage.clone()
        prep.ctx.finalize()
        got = prep.ctx(0, q, k, v)
        eng.pool.storage.copy_(saved)
        sdpa_ctx.finalize()
        want = sdpa_ctx(0, q, k, v)
        eng.pool.storage.copy_(saved)
        torch.testing.assert_close(got.float(), want.float(), rtol=0.02, atol=0.02)
        return 1

    graph_steps, original = [], r.graphs.run

    def run(batch):
        # The eager step first (its prepare reuses the runner's staging, which the padded step's
        # commit plan then holds), on a copy of the pool's state
        saved = eng.pool.storage.clone()
        want = r.forward(r.prepare(batch))
        eng.pool.storage.copy_(saved)
        out = original(batch)
        if out is not None:
            p, hidden, replayed = out
            torch.testing.assert_close(hidden.float(), want.float(), rtol=0.05, atol=0.05)
            graph_steps.append(replayed)
        return out

    r.graphs.run = run
    assert _staggered(eng, random_prompts(5, [3, 11, 6, 1, 17], seed=5), _params(), check) > 0
    report = graph_buckets(r.graphs)
    assert report and all(x["graph_ms"] is not None and x["eager_ms"] is not None for x in report)
    assert all(x["keys"] == 0 for x in report)                    # read in place, no key buckets
    assert graph_steps or all(x["decision"] == "eager" for x in report)
