"""dLLM-Serve's mechanisms (issue "mechanisms"), exactness in float64 unless noted.

* logit budgeting: chunking the LM head (max_num_logits 1, 2, 3, 7, None) never changes tokens;
* sparse KV: retention 1.0 gives the same tokens under head and uniform selection; uniform
  selection equals a plain Sparse-dLLM selection (OpenMOSS/Sparse-dLLM@3fd8986: the block
  queries' mean scores the context, one kept set shared by every head); head-centric
  selection under GQA equals a plain per-head loop; the runner's Refresh-select step packs
  exactly the K/V rows a plain selection over the step's own queries and keys picks;
* the request-level scheduler policy charges whole canvases and admits fewer requests;
* abort() of a waiting and of a running request releases its KV reservation.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from engine import SamplingParams
from engine.kv_cache import kv_need, retained_tokens
from engine.request import Status
from tests.helpers import (
    kv_of,
    make_engine,
    plain_attention,
    random_prompts,
    run_alone,
    select_one,
    tiny_model,
)

F64 = torch.float64


@pytest.fixture(scope="module")
def model():
    return tiny_model(F64)


def _workload():
    prompts = random_prompts(4, [5, 12, 2, 8], seed=21)
    params = [
        SamplingParams(gen_length=8, steps=8, block_length=8, seed=1),
        SamplingParams(gen_length=12, steps=6, block_length=4, temperature=0.9, seed=2),
        SamplingParams(gen_length=8, steps=4, block_length=2, remasking="random", seed=3),
        SamplingParams(gen_length=16, steps=8, block_length=8, temperature=1.0, remasking="random", seed=4),
    ]
    return prompts, params


@pytest.mark.parametrize("cache", ["none", "dual", "sparse"])
def test_logit_chunking_never_changes_tokens(model, cache):
    prompts, params = _workload()
    tokens, max_rows = {}, {}
    for m in (1, 2, 3, 7, None):
        eng = make_engine(model, cache=cache, max_num_logits=m)
        tokens[m] = [o.token_ids for o in eng.generate(prompts, params)]
        max_rows[m] = eng.counters["max_logits_rows_in_step"]
    assert all(t == tokens[None] for t in tokens.values())
    for m in (1, 2, 3, 7):
        assert max_rows[m] == m                                  # the budget was the binding limit
    assert max_rows[None] == sum(len(p) + sp.gen_length for p, sp in zip(prompts, params, strict=True))


def test_sparse_full_retention_same_tokens_head_and_uniform(model):
    prompts, params = _workload()
    out = {}
    for sel in ("head", "uniform"):
        eng = make_engine(model, cache="sparse", retention=1.0, selection=sel)
        res = eng.generate(prompts, params)
        out[sel] = [o.token_ids for o in res]
        assert [o.kv_tokens for o in res] == [len(p) + sp.gen_length    # the whole context + one block
                                              for p, sp in zip(prompts, params, strict=True)]
    assert out["head"] == out["uniform"]
    # ... while partial retention is an approximation the two selections make differently.
    part = {sel: [run_alone(model, p, sp, cache="sparse", retention=0.25, selection=sel)
                  for p, sp in zip(prompts, params, strict=True)] for sel in ("head", "uniform")}
    assert part["head"] != part["uniform"]


# ---------------------------------------------------------------- plain selections
def plain_uniform_selection(q_block, k_ctx, keep_ratio, kernel):
    """Sparse-dLLM state 1: mean block query per head, raw dot product with every candidate key,
    mean over heads, max_pool1d(kernel, stride 1, padding kernel//2), top int(Lc * keep_ratio)."""
    hq, hkv, lc = q_block.shape[1], k_ctx.shape[0], k_ctx.shape[1]
    q_bar = q_block.mean(0)                                                  # [Hq, D]
    per_head = [[float(q_bar[h] @ k_ctx[h // (hq // hkv), j]) for j in range(lc)] for h in range(hq)]
    score = torch.tensor(per_head, dtype=F64).mean(0)
    if kernel is not None:
        score = F.max_pool1d(score[None, None], kernel, stride=1, padding=kernel // 2)[0, 0]
    return set(torch.topk(score, int(lc * keep_ratio)).indices.tolist())


def plain_head_selection(q_block, k_ctx, n_keep, window):
    """dLLM-Serve head-centric: per KV head, score = max over its query group of q̄·k / sqrt(d),
    max-pooled along positions, own top-n_keep."""
    hq, (hkv, lc, d) = q_block.shape[1], k_ctx.shape
    g = hq // hkv
    q_bar = q_block.mean(0)
    sets = []
    for h in range(hkv):
        score = torch.tensor([max(float(q_bar[h * g + i] @ k_ctx[h, j]) for i in range(g)) / math.sqrt(d)
                              for j in range(lc)], dtype=F64)
        score = F.max_pool1d(score[None, None], window, stride=1, padding=window // 2)[0, 0]
        sets.append(set(torch.topk(score, n_keep).indices.tolist()))
    return sets


def _random_qk(seed, lb, hq, hkv, lc, d=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(lb, hq, d, dtype=F64, generator=g), torch.randn(hkv, lc, d, dtype=F64, generator=g)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
def test_uniform_selection_equals_plain_sparse_dllm(hq, hkv):
    for seed in range(6):
        for lc, keep, kernel in [(20, 0.5, 3), (37, 0.25, 5), (16, 0.75, None), (9, 1.0, 3)]:
            q, k = _random_qk(seed, 4, hq, hkv, lc)
            n = int(lc * keep)
            idx = select_one(q, k, n, "uniform", kernel or 1)
            assert idx.shape == (hkv, n)
            assert all(set(row.tolist()) == plain_uniform_selection(q, k, keep, kernel) for row in idx)
            assert bool((idx.diff(dim=-1) > 0).all())                        # position order


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 1), (6, 3), (4, 4)])
def test_head_selection_equals_plain_per_head_loop(hq, hkv):
    distinct = 0
    for seed in range(6):
        for lc, n, window in [(20, 10, 3), (33, 7, 5), (12, 12, 1), (15, 4, 3)]:
            q, k = _random_qk(100 + seed, 3, hq, hkv, lc)
            idx = select_one(q, k, n, "head", window)
            want = plain_head_selection(q, k, n, window)
            assert [set(row.tolist()) for row in idx] == want
            distinct += len({frozenset(s) for s in want}) > 1
    assert hkv == 1 or distinct > 0                                          # heads do choose differently


def plain_max_query_selection(q_block, k_ctx, n_keep, window, selection):
    """score_query="max": a token's score is the best q.k over the block's queries (and over a
    KV head's query group); head keeps per KV head, uniform averages the KV heads' scores."""
    lb, hq = q_block.shape[:2]
    hkv, lc, d = k_ctx.shape
    g = hq // hkv
    per_head = torch.tensor([[max(float(q_block[b, h * g + i] @ k_ctx[h, j]) for b in range(lb) for i in range(g))
                              for j in range(lc)] for h in range(hkv)], dtype=F64) / math.sqrt(d)
    rows = per_head if selection == "head" else per_head.mean(0, keepdim=True)
    rows = F.max_pool1d(rows[:, None], window, stride=1, padding=window // 2)[:, 0]
    sets = [set(torch.topk(r, n_keep).indices.tolist()) for r in rows]
    return sets if selection == "head" else sets * hkv


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 4), (6, 3)])
@pytest.mark.parametrize("selection", ["head", "uniform"])
def test_max_query_selection_equals_plain_loop(hq, hkv, selection):
    differs = 0
    for seed in range(5):
        for lc, n, window in [(20, 10, 3), (33, 7, 5), (15, 4, 1)]:
            q, k = _random_qk(200 + seed, 4, hq, hkv, lc)
            idx = select_one(q, k, n, selection, window, "max")
            assert [set(row.tolist()) for row in idx] == plain_max_query_selection(q, k, n, window, selection)
            differs += [set(r.tolist()) for r in idx] != [set(r.tolist()) for r in select_one(q, k, n, selection, window)]
    assert differs > 0                                       # max really is another rule than mean


def test_score_query_is_validated():
    from engine import EngineConfig

    with pytest.raises(ValueError, match="score_query"):
        EngineConfig(score_query="avg")


def _plain_layer_qkv(model, x):
    """Per-layer RoPE'd q, k (and v) of a full forward over canvas x, written plainly."""
    pos = torch.arange(x.numel())
    h, out = model.embed(x), []
    for block in model.blocks:
        q, k, v = block.qkv(h, pos, model.rope)
        out.append((q, k, v))
        h = h + block.attn_out(plain_attention(q, k, v).reshape(h.shape[0], -1))
        h = h + block.mlp(h)
    return out


def check_refresh_select(model, prompt: list[int], selection: str) -> int:
    """One sparse request (retention 0.5, delay 1) over two blocks: at each select step every
    layer's kept K/V are, per KV head, the plainly selected context rows of that step's canvas
    (scored with the block's own queries). -> how many layers' KV heads chose different sets."""
    params, r = SamplingParams(gen_length=16, steps=8, block_length=8), 0.5
    eng = make_engine(model, cache="sparse", retention=r, selection=selection, delay_step=1)
    eng.add_request(prompt, params)
    differ = 0
    for step in range(6):                     # block 0: steps 0-3, select at 1; block 1: select at 5
        req = eng.scheduler.running[0] if eng.scheduler.running else eng.scheduler.waiting[0]
        canvas, (s, e) = req.canvas.clone(), req.block_range
        eng.step()
        if step not in (1, 5):
            continue
        lc = req.length - params.block_length
        keep = retained_tokens(lc, r)
        assert kv_of(req).shape[3] == keep + params.block_length and keep == int(lc * r)
        kept = kv_of(req)[:, :, :, :keep]                              # the block's slots follow
        ctx = torch.cat([torch.arange(0, s), torch.arange(e, req.length)])
        with torch.no_grad():
            layers = _plain_layer_qkv(model, canvas)
        for li, (q, k, v) in enumerate(layers):
            k_ctx = k[ctx].transpose(0, 1)
            if selection == "uniform":
                sets = [plain_uniform_selection(q[s:e], k_ctx, r, eng.config.pool_window)] * k.shape[1]
            else:
                sets = plain_head_selection(q[s:e], k_ctx, keep, eng.config.pool_window)
            differ += len({frozenset(c) for c in sets}) > 1
            for h, chosen in enumerate(sets):
                pos = ctx[sorted(chosen)]
                torch.testing.assert_close(kept[li, 0, h], k[pos, h], rtol=0, atol=1e-9)
                torch.testing.assert_close(kept[li, 1, h], v[pos, h], rtol=0, atol=1e-9)
    return differ


@pytest.mark.parametrize("selection", ["uniform", "head"])
def test_refresh_select_packs_the_plainly_selected_rows(model, selection):
    """The delayed select step scores the context with the block's own queries of that step."""
    check_refresh_select(model, random_prompts(1, 8, seed=5)[0], selection)


# ---------------------------------------------------------------- scheduler policy, abort
def test_request_policy_charges_canvas_and_admits_fewer(model):
    # float64 (the module's rule): the two policies batch the rows differently, and a float32 GEMM
    # rounds a row differently with the batch on some CPU kernels, which could flip a near-tie.
    prompts = random_prompts(6, 12, seed=8)
    params = SamplingParams(gen_length=16, steps=16, block_length=4)
    runs = {}
    for policy in ("phase", "request"):
        eng = make_engine(model, cache="dual", scheduler=policy, max_num_batched_tokens=60)
        costs, original = [], eng.scheduler.schedule

        def schedule(now, eng=eng, costs=costs, original=original):
            batch = original(now)
            costs.append([(eng.scheduler.policy.cost(r, p), r.length, p.is_refresh) for r, p in batch])
            return batch

        eng.scheduler.schedule = schedule
        runs[policy] = ([o.token_ids for o in eng.generate(prompts, params)], costs, max(eng.batch_sizes))
    toks_p, costs_p, conc_p = runs["phase"]
    toks_r, costs_r, conc_r = runs["request"]
    assert all(c == length for step in costs_r for c, length, _ in step)     # whole canvas, every phase
    assert any(not refresh for step in costs_r for _, _, refresh in step)     # ... also in Reuse steps
    assert all(c == (length if refresh else 4) for step in costs_p for c, length, refresh in step)
    assert all(sum(c for c, _, _ in step) <= 60 for step in costs_p + costs_r)
    assert conc_r == 2 and conc_p > conc_r
    assert len(costs_p) < len(costs_r)                                        # fewer engine steps
    assert toks_p == toks_r                                                   # scheduling changes no token


@pytest.mark.parametrize("cache", ["dual", "sparse"])
def test_abort_releases_kv(model, cache):
    params = SamplingParams(gen_length=8, steps=8, block_length=4)
    a, b, c = random_prompts(3, 12, seed=9)
    eng = make_engine(model, cache=cache, retention=1.0, kv_pool_tokens=20)
    ra = eng.add_request(a, params)
    eng.step()
    req_a = eng.scheduler.running[0]
    assert eng.pool.used == req_a.kv_tokens == kv_need(cache, req_a.length, req_a.block_length, 1.0) > 0
    rb = eng.add_request(b, params)                      # waits: the pool can't hold both
    eng.step()
    req_b = eng.scheduler.waiting[0]
    assert req_b.request_id == rb and req_b.status is Status.WAITING
    eng.abort(rb)                                        # waiting: nothing reserved, nothing leaks
    assert eng.pool.used == req_a.kv_tokens and not eng.scheduler.waiting
    assert req_b.status is Status.ABORTED
    rc = eng.add_request(c, params)
    eng.abort(ra)                                        # running: its reservation is returned
    assert eng.pool.used == 0 and req_a.status is Status.ABORTED and kv_of(req_a) is None
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert [o.request_id for o in outs] == [rc]          # the next request got the freed pool
    assert eng.pool.used == 0 and eng.pool.peak_used <= 20
    assert outs[0].token_ids == run_alone(model, c, params, cache=cache, retention=1.0)
