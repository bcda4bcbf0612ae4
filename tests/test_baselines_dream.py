"""The baselines on a Dream model (float64, a tiny Dream config built in code) against plain versions
written from each upstream's Dream code (tests/dream_plain.py; docs/DREAM_BASELINES.md): the plain
Dream system and dLLM-Cache against Dream's sampler oracle (baselines.reference_dream), Fast-dLLM and
Sparse-dLLM against a block sampler with emulated caches; the block-edge rule, batches, families."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from baselines import SYSTEMS, make_system, systems_for
from baselines.reference_dream import dense_logits, reference_generate
from engine.models import ModelConfig, build_model
from tests.dream_plain import (
    MASK,
    DreamParams,
    plain_fast,
    plain_sparse,
    sampling,
    tiny_dream,
)
from tests.plain_caches import dllm_cache_logits


@pytest.fixture(scope="module")
def model():
    return tiny_dream(2)


@pytest.fixture(scope="module")
def model1():
    return tiny_dream(1, seed=1)


def prompt(n, seed=0):
    return torch.randint(0, 94, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def run(model, name, p, sp, **knobs):
    return make_system(name, model, max_batch_size=1, **knobs).generate([p], sp)[0]


# ---------------------------------------------------------------- the plain Dream system
WHOLE = [  # (prompt len, gen, steps, alg, T, alg_temp, top_p, top_k, seed)
    (6, 12, 12, "origin", 0.0, None, None, None, 0),
    (9, 16, 8, "maskgit_plus", 0.0, None, None, None, 1),
    (5, 12, 12, "topk_margin", 0.0, None, 0.9, None, 2),
    (7, 16, 16, "entropy", 0.0, None, None, 5, 3),
    (4, 12, 6, "entropy", 0.7, 0.5, 0.95, None, 4),
    (6, 8, 8, "origin", 1.0, None, None, None, 5),
    (8, 12, 12, "maskgit_plus", 0.5, None, None, 7, 6),
]


def whole(setting, block=None) -> tuple[list[int], DreamParams]:
    P, gen, steps, alg, T, at, tp, tk, seed = setting
    return prompt(P, seed), DreamParams(gen_length=gen, steps=steps, block_length=block or gen, temperature=T,
                                        seed=seed, alg=alg, alg_temp=at, top_p=tp, top_k=tk)


@pytest.mark.parametrize("setting", WHOLE)
def test_dream_system_equals_dream_sampler(model, setting):
    p, sp = whole(setting, block=4)            # a request's block_length is ignored: Dream has no blocks
    out = run(model, "dream", p, sp)
    ref, nfe = reference_generate(dense_logits(model), p, sampling(sp), MASK)
    assert out.token_ids == ref and out.nfe == nfe == sp.steps


def test_dream_system_batched_equals_each_alone(model):
    """Mixed prompt lengths (left padding masked, own positions), algs, temperatures and seeds."""
    settings = [s for s in WHOLE if s[1] == 12 and s[2] == 12]
    reqs = [whole(s) for s in settings]
    sysm = make_system("dream", model, max_batch_size=8)
    outs = sysm.generate([p for p, _ in reqs], [sp for _, sp in reqs])
    assert sysm.stats()["batch_sizes"][0] == len(reqs) >= 3
    for o, (p, sp) in zip(outs, reqs, strict=True):
        assert o.token_ids == reference_generate(dense_logits(model), p, sampling(sp), MASK)[0]


# ---------------------------------------------------------------- dLLM-Cache on Dream
@pytest.mark.parametrize("ratio", [0.0, 0.25])
def test_dllm_cache_refreshing_every_step_is_dreams_sampler(model, ratio):
    for setting in WHOLE[:5]:
        p, sp = whole(setting, block=4)
        out = run(model, "dllm-cache", p, sp, prompt_interval=1, gen_interval=1, transfer_ratio=ratio)
        assert out.token_ids == reference_generate(dense_logits(model), p, sampling(sp), MASK)[0]
        assert out.nfe == sp.steps


@pytest.mark.parametrize("knobs", [dict(prompt_interval=3, gen_interval=2, transfer_ratio=0.25),
                                   dict(prompt_interval=2, gen_interval=5, transfer_ratio=0.5),
                                   dict(prompt_interval=4, gen_interval=3, transfer_ratio=0.0),
                                   dict(prompt_interval=25, gen_interval=2, transfer_ratio=0.25)])   # gsm8k Instruct
def test_dllm_cache_equals_its_dream_hook(model, knobs):
    differs = 0
    for setting in WHOLE:
        p, sp = whole(setting)
        out = run(model, "dllm-cache", p, sp, **knobs)
        fn = dllm_cache_logits(model, len(p), knobs["prompt_interval"], knobs["gen_interval"], knobs["transfer_ratio"])
        assert out.token_ids == reference_generate(fn, p, sampling(sp), MASK)[0]
        differs += out.token_ids != run(model, "dream", p, sp).token_ids
    assert differs >= 2


# ---------------------------------------------------------------- Fast-dLLM and Sparse-dLLM on Dream
BLOCKS = [  # (prompt len, gen, block, steps, alg, T, top_p, seed)
    (6, 16, 8, 8, "entropy", 0.0, None, 0),
    (9, 16, 4, 16, "maskgit_plus", 0.0, None, 1),
    (5, 16, 8, 16, "topk_margin", 0.8, 0.95, 2),
    (7, 8, 8, 24, "entropy", 0.0, None, 3),         # S > block_length: grid steps that commit nothing
    (4, 12, 4, 6, "maskgit_plus", 1.0, None, 4),
    (3, 8, 4, 2, "entropy", 0.0, None, 5),          # S = 1: block_start alone, the block keeps its masks
]


def blocks(setting) -> tuple[list[int], DreamParams]:
    P, gen, block, steps, alg, T, tp, seed = setting
    return prompt(P, seed), DreamParams(gen_length=gen, block_length=block, steps=steps, temperature=T, seed=seed,
                                        alg=alg, top_p=tp)


@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_fast_dllm_equals_its_dream_block_sampler(model, cache):
    differs = 0
    for setting in BLOCKS:
        p, sp = blocks(setting)
        out = run(model, "fast-dllm", p, sp, fast_dllm_cache=cache)
        toks, nfe = plain_fast(model, p, sp, cache)
        assert out.token_ids == toks and out.nfe == nfe
        # Dream's grid puts its zero counts first: a block ends at its last step (1 full + S - 1 windows)
        assert nfe == sp.steps
        differs += toks != plain_fast(model, p, sp, no_cache=True)[0]
    assert differs >= 1                              # the caches are approximate on two layers
    assert MASK in toks                              # S = 1 leaves masks, as upstream
    nfes = {}
    for thr in (0.1, 0.6):           # no step cap: a window commits until the block has no mask
        p, sp = blocks(BLOCKS[0])
        out = run(model, "fast-dllm", p, sp, fast_dllm_cache=cache, threshold=thr)
        toks, nfes[thr] = plain_fast(model, p, sp, cache, threshold=thr)
        assert out.token_ids == toks and out.nfe == nfes[thr] and MASK not in toks
    assert nfes[0.1] < sp.steps < nfes[0.6]          # a low threshold decodes in parallel


@pytest.mark.parametrize("keep_ratio,kernel", [(0.5, 3), (0.3, 5), (0.6, None), (1.0, 3)])
def test_sparse_dllm_equals_its_dream_sampler(model, keep_ratio, kernel):
    differs = 0
    for setting in BLOCKS:
        p, sp = blocks(setting)
        out = run(model, "sparse-dllm", p, sp, keep_ratio=keep_ratio, kernel_size=kernel)
        assert (out.token_ids, out.nfe) == plain_sparse(model, p, sp, keep_ratio, kernel)
        assert out.nfe == sp.steps                   # exactly S forwards per block
        differs += out.token_ids != run(model, "sparse-dllm", p, sp, keep_ratio=1.0).token_ids
    assert differs >= 1 or keep_ratio == 1.0         # eviction changes tokens


def test_one_layer_caches_are_exact(model1):
    """One layer: K/V depend only on token and position, so a cache of unchanged tokens is exact.
    Fast-dLLM dual == prefix == its sampler without cache == Sparse-dLLM keeping every token (entropy)."""
    for setting in BLOCKS:
        p, sp = blocks(setting)
        sp = replace(sp, remasking="entropy")
        nocache = plain_fast(model1, p, sp, no_cache=True)[0]
        for cache in ("dual", "prefix"):
            assert run(model1, "fast-dllm", p, sp, fast_dllm_cache=cache).token_ids == nocache
        if sp.steps_per_block >= 2:   # Sparse-dLLM spends all S steps; the grid is the same
            assert run(model1, "sparse-dllm", p, sp, keep_ratio=1.0).token_ids == nocache


@pytest.mark.parametrize("name,knobs", [("fast-dllm", {}), ("fast-dllm", dict(fast_dllm_cache="prefix")),
                                        ("fast-dllm", dict(threshold=0.5)), ("sparse-dllm", {})])
def test_the_full_step_commits_block_start_alone(model, name, knobs):
    """The block-edge rule: after a block's first forward exactly block_start changed, to the
    argmax (never the mask) of its full-canvas row, the head of the hidden at block_start - 1."""
    p, sp = blocks(BLOCKS[0])
    sysm = make_system(name, model, max_batch_size=1, **knobs)
    sysm.add_request(p, sp)
    for b in range(sp.num_blocks):
        before = sysm.batch.x[0].clone() if sysm.batch is not None else torch.tensor(p + [MASK] * sp.gen_length)
        sysm.step()
        x = sysm.batch.x[0]
        s = len(p) + b * sp.block_length
        assert torch.nonzero(x != before).squeeze(-1).tolist() == [s]
        row = model(before[None])[0, s].clone()
        row[MASK] = -torch.inf
        assert int(x[s]) == int(row.argmax())
        while sysm.batch is not None and sysm.batch.step_in_block:
            sysm.step()


@pytest.mark.parametrize("name,knobs", [("dream", {}), ("fast-dllm", {}), ("fast-dllm", dict(threshold=0.3)),
                                        ("dllm-cache", dict(prompt_interval=3, gen_interval=2)),
                                        ("sparse-dllm", {})])
def test_mixed_batch_matches_alone(model, name, knobs):
    T_alg = ((0.0, "entropy"), (0.7, "maskgit_plus"), (0.0, "topk_margin"), (1.0, "entropy"))
    sps = [DreamParams(gen_length=16, block_length=8, steps=16, temperature=T, seed=i, alg=a, top_p=0.9 if i else None)
           for i, (T, a) in enumerate(T_alg)]
    prompts = [prompt(n, i) for i, n in enumerate((5, 11, 8, 3))]
    sysm = make_system(name, model, max_batch_size=8, **knobs)
    outs = sysm.generate(prompts, sps)
    assert sysm.stats()["batch_sizes"][0] == 4
    for o, p, sp in zip(outs, prompts, sps, strict=True):
        assert o.token_ids == run(model, name, p, sp, **knobs).token_ids


def test_dream_system_batches_requests_that_differ_only_in_block_length(model):
    """Dream's sampler has no blocks, so block_length does not split a static batch."""
    reqs = [whole(WHOLE[0], block=b) for b in (4, 6, 12)]
    sysm = make_system("dream", model, max_batch_size=8)
    outs = sysm.generate([p for p, _ in reqs], [sp for _, sp in reqs])
    assert sysm.stats()["batch_sizes"] == [3] * WHOLE[0][2]
    assert len({tuple(o.token_ids) for o in outs}) == 1


def test_every_dream_system_profiles_its_largest_batch():
    """The memory meter runs each Dream system (float32) and a larger batch holds more."""
    from baselines.profile import measure_run

    m32 = tiny_dream(2).to(torch.float32)
    for name in systems_for("Dream"):
        kw = dict(prompt_len=6, gen_length=8, block_length=4, steps=8, system=name, run_steps=None)
        measure_run(m32, 1, **kw)            # one-time allocations (RoPE tables) out of the way
        assert measure_run(m32, 3, **kw) > measure_run(m32, 1, **kw) > 0, name


# ---------------------------------------------------------------- families and refusals
def test_each_system_runs_the_families_its_upstream_code_has(model):
    llada = build_model(ModelConfig(d_model=16, n_heads=2, n_layers=1, mlp_hidden_size=32, vocab_size=40,
                                    embedding_size=40, mask_token_id=39, eos_token_id=38, pad_token_id=38))
    assert systems_for("Dream") == ["dream", "fast-dllm", "dllm-cache", "sparse-dllm"]
    assert systems_for("llada") == ["llada", "fast-dllm", "dllm-cache", "sparse-dllm"]
    with pytest.raises(ValueError, match="does not run Dream models"):
        make_system("llada", model)
    with pytest.raises(ValueError, match="does not run llada models"):
        make_system("dream", llada)
    assert "factor" in SYSTEMS["fast-dllm"].knobs_for("llada")
    assert "factor" not in SYSTEMS["fast-dllm"].knobs_for("Dream")
    with pytest.raises(ValueError, match="no factor rule on Dream"):
        make_system("fast-dllm", model, factor=1.0)
    make_system("fast-dllm", llada, factor=1.0)
    # dLLM-Cache's defaults on each family: its gsm8k Instruct script's intervals
    assert make_system("dllm-cache", model).policy.knobs == dict(prompt_interval=25, gen_interval=2, transfer_ratio=0.25)
    assert make_system("dllm-cache", llada).policy.knobs == dict(prompt_interval=50, gen_interval=7, transfer_ratio=0.25)
    sysm = make_system("sparse-dllm", model)
    with pytest.raises(ValueError, match="alg='origin'"):
        sysm.add_request(prompt(4), DreamParams(gen_length=8, block_length=8, steps=8, alg="origin"))
    with pytest.raises(ValueError, match="remasking must be one of"):
        make_system("dream", model).add_request(prompt(4), DreamParams(gen_length=8, steps=8, block_length=8, alg="x"))


@pytest.mark.parametrize("family", ["llada", "Dream"])
def test_fast_dllm_has_the_same_cache_modes_on_either_family(model, family, tmp_path, monkeypatch, capsys):
    """Upstream Fast-dLLM also decodes without a cache on either family (llada/generate.py
    `generate`; Dream's generation_utils.py `alg='confidence_threshold'`); the fast-dllm system has
    its two cached modes on both alike, and `none` is refused in one line, on either model."""
    from baselines.fast_dllm import CACHES
    from tests.helpers import one_error_line, run_cli, tiny_model

    m = model if family == "Dream" else tiny_model()
    assert CACHES == ("dual", "prefix")
    for cache in CACHES:
        assert make_system("fast-dllm", m, fast_dllm_cache=cache).policy.cache == cache
    with pytest.raises(ValueError, match=r"fast_dllm_cache must be one of \('dual', 'prefix'\), got 'none'"):
        make_system("fast-dllm", m, fast_dllm_cache="none")
    r = run_cli(monkeypatch, capsys, "serve", "--model", "tiny-dream" if family == "Dream" else "tiny",
                "--systems", "fast-dllm:fast_dllm_cache=none", "--num-prompts", "1", "--rps", "inf",
                "--result-dir", str(tmp_path), "--run-id", "bad")
    one_error_line(r, "fast_dllm_cache must be one of")
    assert not (tmp_path / "bad").exists()
