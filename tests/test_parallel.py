"""Tensor parallelism (engine.parallel) on CPU: gloo, 2 processes x 1 thread, float64.

* TP = 2 gives exactly TP = 1's tokens for the none, dual, sparse (head-centric and uniform
  selection) and auto caches (dual and sparse requests in one step), on a mixed batch (different prompt and generation lengths, blocks, steps),
  under the logit budget's chunking (requests straddling chunks) and monolithic logits, greedy
  and sampled (Gumbel noise, random remasking);
* a checkpoint loads shard-wise: each rank holds exactly its slices, half the bytes of every
  sharded tensor;
* the profiler per rank: at the same per-rank budget the KV pool holds about twice the tokens;
* a worker killed mid-run ends the run with one RankFailure line, at once.

The cluster (one spawned worker) is started once for the module and each engine is built on it
(again after the test that kills its worker).
"""
from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch
from safetensors.torch import save_file

from dllm_bench.systems.profiles import on_every_rank
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.models import load_model
from engine.parallel.driver import Cluster, ParallelEngine, RankFailure, build_rank
from engine.parallel.model import load_sharded, slice_of
from engine.profiler import profile_kv_pool
from tests.helpers import random_prompts, tiny_model

F64 = torch.float64
PROMPTS = random_prompts(5, [3, 11, 6, 1, 17], seed=4)
SHAPES = [(8, 4, 4), (12, 6, 6), (8, 8, 2), (16, 8, 8), (6, 6, 3)]      # (gen_length, steps, block_length)
GREEDY = [SamplingParams(gen_length=g, steps=s, block_length=b) for g, s, b in SHAPES]
SAMPLED = [SamplingParams(gen_length=g, steps=s, block_length=b, temperature=0.8, seed=i,
                          remasking="random" if i % 2 else "low_confidence") for i, (g, s, b) in enumerate(SHAPES)]
CASES = {
    "none": dict(cache="none"),
    "dual": dict(cache="dual"),
    "sparse-head": dict(cache="sparse", selection="head", retention=0.5),
    "sparse-uniform": dict(cache="sparse", selection="uniform", retention=0.5),
    "sparse-uniform-max": dict(cache="sparse", selection="uniform", score_query="max", retention=0.3),
    "sparse-head-chunked": dict(cache="sparse", max_num_logits=3),
    "dual-monolithic": dict(cache="dual", max_num_logits=None),
    # cache=auto in a pool too small for everyone as dual, at most 4 at once (so some shapes fill
    # it as well dual): both modes, which reach the workers in the plan
    "auto-mixed": dict(cache="auto", retention=0.5, kv_pool_tokens=60, max_num_seqs=4),
}


def write_checkpoint(model, path):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(dataclasses.asdict(model.config)))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tiny_model(F64), tmp_path_factory.mktemp("tp") / "tiny")


@pytest.fixture(scope="module")
def _clusters():
    held = []
    yield held
    for c in held:
        c.close()


@pytest.fixture
def cluster(_clusters):
    """The module's cluster, started again if a test ended it (one process group per process)."""
    if not _clusters or _clusters[-1].closed:
        _clusters.append(Cluster.spawn(2, "cpu"))
    return _clusters[-1]


def _config(ckpt, **kw) -> EngineConfig:
    kw.setdefault("cache", "sparse")          # the mechanism (and pool sizes) these tests were written against
    return EngineConfig(model=str(ckpt), dtype="float64", device="cpu", attention_backend="sdpa", **kw)


def _both(cluster, ckpt, params, **kw):
    cfg = _config(ckpt, **kw)
    ref = LLMEngine(cfg).generate(PROMPTS, params)
    eng = ParallelEngine(dataclasses.replace(cfg, tensor_parallel_size=2), cluster=cluster)
    try:
        out = eng.generate(PROMPTS, params)
        stats = eng.stats()
    finally:
        eng.close()
    return ref, out, stats


@pytest.mark.parametrize("case", CASES)
def test_tp2_gives_tp1_tokens(cluster, ckpt, case):
    ref, out, stats = _both(cluster, ckpt, GREEDY, **CASES[case])
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    assert [o.logits_rows for o in out] == [o.logits_rows for o in ref]
    assert [o.cache for o in out] == [o.cache for o in ref]
    if case == "auto-mixed":
        assert stats["requests_dual"] > 0 and stats["requests_sparse"] > 0
    if CASES[case].get("max_num_logits") == 3:
        assert stats["max_logits_rows_in_step"] == 3


def test_tp2_gives_tp1_tokens_when_sampling(cluster, ckpt):
    """Each rank draws the request's whole noise row from the driver's generator state."""
    ref, out, _ = _both(cluster, ckpt, SAMPLED, cache="sparse", max_num_logits=5)
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]


DREAM = [SamplingParams.dream(gen_length=8, steps=4, alg="origin", temperature=0.9, top_p=0.9, seed=1),
         SamplingParams.dream(gen_length=12, steps=6, alg="entropy", temperature=0.7, alg_temp=0.5, seed=2),
         SamplingParams(gen_length=8, steps=8, block_length=2, temperature=0.8, seed=3),    # LLaDA's rule
         SamplingParams.dream(gen_length=16, steps=8, alg="topk_margin", top_k=5, seed=4),
         SamplingParams.dream(gen_length=6, steps=6, alg="maskgit_plus", decoding="threshold:0.5")]


@pytest.mark.parametrize("max_num_logits", [3, None])
def test_tp2_gives_tp1_tokens_with_dreams_rule(cluster, ckpt, max_num_logits):
    """Dream's algs (docs/DREAM_SAMPLER.md) read their rows' whole vocabulary, gathered across ranks,
    beside LLaDA's rule in the same chunks."""
    ref, out, _ = _both(cluster, ckpt, DREAM, cache="none", max_num_logits=max_num_logits)
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]


def _held(tp, path: str) -> dict:
    return {k: v.clone() for k, v in load_sharded(path, tp, torch.float32).state_dict().items()}


def test_checkpoint_loads_shard_wise(cluster, tmp_path):
    """A two-file bf16 checkpoint: each rank holds exactly its slices, cast to the run dtype."""
    from dllm_bench.checkpoints.make import make_checkpoint

    path = make_checkpoint("tiny", tmp_path / "tiny", shards=2)
    full = load_model(path, torch.float32).state_dict()
    ranks = on_every_rank(cluster, _held, str(path))
    sharded = [k for k in full if ranks[0][k].shape != full[k].shape]
    assert len(sharded) == 2 + 7 * load_model(path).config.n_layers
    for r, held in enumerate(ranks):
        assert held.keys() == full.keys()
        for k, v in held.items():
            assert torch.equal(v, full[k][slice_of(k, tuple(full[k].shape), r, 2)]), (r, k)
        assert sum(held[k].nbytes for k in sharded) * 2 == sum(full[k].nbytes for k in sharded)
    assert not torch.equal(ranks[0]["model.transformer.ff_out.weight"], ranks[1]["model.transformer.ff_out.weight"])


def _profile(tp, path: str, budget: int) -> dict:
    cfg = _config(path, memory_budget=budget, max_num_batched_tokens=256, max_model_len=128, max_num_seqs=8,
                  tensor_parallel_size=tp.size)
    runner, profile = build_rank(tp, dataclasses.replace(cfg, cuda_graphs=False))
    return profile.to_dict() | {"capacity": runner.config.kv_pool_tokens}


def test_kv_pool_per_rank_holds_twice_the_tokens(cluster, ckpt):
    """Same per-rank budget: each rank stores half of every token's KV (its heads) next to half
    the weights, so its pool holds at least twice TP = 1's tokens — barely more when the budget
    dwarfs the weights and activations, as here."""
    budget = 32 * 2**20
    one = profile_kv_pool(load_model(ckpt, F64), _config(ckpt, memory_budget=budget, max_num_batched_tokens=256,
                                                         max_model_len=128, max_num_seqs=8), "sdpa", 128)
    ranks = on_every_rank(cluster, _profile, str(ckpt), budget)
    assert ranks[0]["capacity"] == ranks[1]["capacity"] == min(r["kv_pool_tokens"] for r in ranks)
    for r in ranks:
        assert r["bytes_per_token"] * 2 == one.bytes_per_token
        assert one.weights_bytes / 2 < r["weights_bytes"] < one.weights_bytes * 0.51      # norms are replicated
        assert 0 < r["activation_peak_bytes"] < one.activation_peak_bytes
    assert 2.0 <= ranks[0]["capacity"] / one.kv_pool_tokens <= 2.2


def test_a_killed_worker_ends_the_run_with_one_error(cluster, ckpt):
    eng = ParallelEngine(_config(ckpt, cache="sparse", tensor_parallel_size=2), cluster=cluster)
    for p, sp in zip(PROMPTS, GREEDY):
        eng.add_request(p, sp)
    eng.step()
    eng.step()
    worker = eng.cluster.procs[0]
    worker.kill()
    worker.join()
    with pytest.raises(RankFailure, match=r"^tensor-parallel rank 1 exited mid-run \(exit code -9\)$"):
        while eng.has_unfinished():
            eng.step()
    assert eng.cluster.closed


def test_the_single_device_engine_refuses_a_tensor_parallel_config(ckpt):
    with pytest.raises(ValueError, match="build it with engine.open"):
        LLMEngine(_config(ckpt, tensor_parallel_size=2))


def test_a_worker_dying_while_starting_is_one_error():
    """Killed as soon as it exists (long before it could join the group): the driver, waiting
    for its workers to be ready, names it instead of waiting for the join's timeout."""
    import multiprocessing
    import threading

    out = {}

    def start():
        try:
            out["cluster"] = Cluster.spawn(2, "cpu")
        except RankFailure as e:
            out["error"] = str(e)

    others = set(multiprocessing.active_children())          # e.g. the module cluster's worker
    t = threading.Thread(target=start)
    t.start()
    while t.is_alive() and not set(multiprocessing.active_children()) - others:
        time.sleep(0.001)
    for p in set(multiprocessing.active_children()) - others:
        p.kill()
    t.join(60)
    assert not t.is_alive()
    assert out == {"error": "tensor-parallel rank 1 exited while starting (exit code -9)"}
