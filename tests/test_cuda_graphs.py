"""Reuse-only steps padded to batch buckets (engine.graphs), as CUDA graphs capture and replay
them; on a CPU the replay is a plain call of the forward on the captured step, whose tensors
alias the bucket's staging buffer, so these tests check what a replay relies on.

* float64: a staggered run with bucketing gives exactly the tokens of one without, for the
  dual and sparse caches (the dummies' keys and stores stay in the scratch slot);
* replays read the new step's metadata: the same run with each bucket's buffer swapped for a
  fresh one after capture gives other tokens (so the equality above can fail);
* bucket sizes (vLLM's: 1, 2, 4, 8, then every 8), key widths (at most 1/8 above) and the
  padding rule;
* a bucket keeps its graph only if it measured faster than eager (a fake capturer times them):
  slower graphs leave every bucket eager and unpadded, and the tokens stay exact either way.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dllm_bench.stepprofile.summary import graph_buckets
from engine import SamplingParams
from engine.graphs import PadSpec, StepGraphs, batch_buckets, bucket, key_width
from engine.step import Staging
from tests.helpers import make_engine, random_prompts, tiny_model

F64 = torch.float64
MODEL = tiny_model(F64, seed=4)


def _run(cache: str, graphs: bool, sabotage: bool = False, capturer=None):
    eng = make_engine(MODEL, cache=cache, cuda_graphs=graphs)
    if capturer is not None:
        eng.runner.graphs = StepGraphs(eng.runner, capturer)
    prompts = random_prompts(6, [3, 11, 6, 1, 17, 8], seed=4)
    params = [SamplingParams(gen_length=g, steps=s, block_length=4)
              for g, s in [(8, 8), (12, 12), (8, 8), (16, 16), (8, 4), (12, 6)]]
    arrivals = [0, 0, 0, 5, 6, 9]            # steps; three at once make Reuse-only steps of 3 (bucket 4)
    ids, out, t = [], {}, 0
    while len(ids) < len(prompts) or eng.has_unfinished():
        while len(ids) < len(prompts) and arrivals[len(ids)] <= t:
            ids.append(eng.add_request(prompts[len(ids)], params[len(ids)]))
        if sabotage and eng.runner.graphs is not None:
            for e in eng.runner.graphs.entries.values():
                e.staging = Staging("cpu", capacity=e.staging.used, buffered=True)
        out.update((o.request_id, o.token_ids) for o in eng.step())
        t += 1
    return [out[x] for x in ids], eng


@pytest.mark.parametrize("cache", ["dual", "sparse"])
def test_bucketed_steps_give_the_tokens_of_unpadded_ones(cache):
    want, plain = _run(cache, graphs=False)
    assert plain.runner.graphs is None
    got, eng = _run(cache, graphs=True)
    g = eng.runner.graphs
    assert got == want
    assert g.replays > len(g.entries) > 0                      # captured once per bucket, replayed after
    assert g.dummies > 0                                       # some steps really were padded
    assert {k[0] for k in g.entries} <= set(g.buckets)
    assert all(row["decision"] == "plain" and row["graph_ms"] is None for row in graph_buckets(g))


def test_a_replay_reads_the_new_steps_metadata():
    want, _ = _run("dual", graphs=False)
    got, _ = _run("dual", graphs=True, sabotage=True)
    assert got != want


def test_buckets_and_key_widths():
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert batch_buckets(20) == (1, 2, 4, 8, 16, 20) and batch_buckets(3) == (1, 2, 3)
    b = batch_buckets(64)
    assert [bucket(n, b) for n in (1, 2, 3, 5, 9, 17, 33, 64, 65)] == [1, 2, 4, 8, 16, 24, 40, 64, None]
    assert [key_width(n) for n in (1, 16, 17, 100, 128, 129, 1000, 1025)] == [16, 16, 32, 112, 128, 144, 1024, 1152]


@pytest.mark.parametrize("max_num_seqs", [1, 7, 8, 20, 64, 256, 300])
def test_every_batch_lands_in_a_bucket_with_few_dummies(max_num_seqs):
    """< 8 dummies per step from 9 requests on, under twice the batch below."""
    buckets = batch_buckets(max_num_seqs)
    assert buckets[-1] == max_num_seqs
    for n in range(1, max_num_seqs + 1):
        b = bucket(n, buckets)
        assert b >= n and (b - n < 8 if n > 8 else b < 2 * n), (n, b)


def test_key_widths_pad_at_most_an_eighth_beyond_small_sizes():
    for n in range(1, 20000):
        w = key_width(n)
        assert w >= n and w - n < (n / 8 if n >= 128 else 16), (n, w)


def test_padding_rule_uses_only_the_scratch_slot():
    eng = make_engine(MODEL, cache="dual", cuda_graphs=True)
    seen = []
    original = eng.runner.run

    def run(batch):
        p = eng.runner.prepare(batch, PadSpec(bucket(len(batch), eng.runner.graphs.buckets) * 2, 64, eng.pool.scratch))
        real, m = p.meta, p.padded_meta
        n = len(m.n_q) - len(real.n_q)
        dummy_slots = m.slots[len(real.slots):]
        seen.append(n)
        assert n > 0 and (dummy_slots == eng.pool.scratch).all()
        assert (m.n_q[len(real.n_q):] == real.block_len[0]).all() and (m.k[len(real.n_q):] == 0).all()
        assert np.array_equal(m.cu_q[: len(real.cu_q)], real.cu_q)
        assert eng.pool.scratch not in real.slots
        return original(batch)

    eng.runner.run = run
    eng.generate(random_prompts(3, 5, seed=1), SamplingParams(gen_length=8, steps=8, block_length=4))
    assert seen


def test_profiler_reserves_the_graph_pool():
    """With graphs, the KV pool gives up the largest Reuse step's peak once more: captured graphs
    keep their intermediates in their own memory pool beside the eager steps'."""
    from engine.config import EngineConfig
    from engine.profiler import profile_kv_pool

    model = tiny_model(torch.float32, seed=1)
    cfg = dict(cache="dual", memory_budget=8 << 20, max_num_batched_tokens=256, device="cpu")
    plain = profile_kv_pool(model, EngineConfig(**cfg, cuda_graphs=False), "sdpa", 64)
    graphs = profile_kv_pool(model, EngineConfig(**cfg, cuda_graphs=True), "sdpa", 64)
    for p in (plain, graphs):
        assert p.reuse_peak_bytes > 0
    assert plain.activation_peak_bytes == max(plain.refresh_peak_bytes, plain.reuse_peak_bytes)
    assert graphs.activation_peak_bytes == max(graphs.refresh_peak_bytes, graphs.reuse_peak_bytes) + graphs.reuse_peak_bytes
    free = graphs.budget_bytes - graphs.weights_bytes - graphs.activation_peak_bytes - graphs.guard_bytes
    assert graphs.kv_pool_tokens == free // graphs.bytes_per_token


class FakeGraph:
    """A captured forward replayed as a plain call writing into the captured output."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())


class FakeCapture:
    """`engine.graphs.CudaCapture`'s two methods on a CPU: timings as given, per kind."""

    def __init__(self, graph_ms: float, eager_ms: float):
        self.ms = {"graph": graph_ms, "eager": eager_ms}
        self.timed: list[str] = []

    def capture(self, fn):
        out = fn()
        return FakeGraph(fn, out), out

    def time_ms(self, fn, what: str) -> float:
        fn()
        self.timed.append(what)
        return self.ms[what]


@pytest.mark.parametrize("graph_ms, eager_ms, kept", [(5.0, 4.0, False), (3.0, 4.0, True)])
def test_a_bucket_keeps_its_graph_only_if_it_measured_faster(graph_ms, eager_ms, kept):
    want, _ = _run("dual", graphs=False)
    cap = FakeCapture(graph_ms, eager_ms)
    stats = []
    got, eng = _run("dual", graphs=True, capturer=cap)
    assert got == want                                         # exact whichever way each bucket ran
    g = eng.runner.graphs
    report = graph_buckets(g)
    assert report and all(r["decision"] == ("graph" if kept else "eager") for r in report)
    assert all((r["graph_ms"], r["eager_ms"]) == (graph_ms, eager_ms) for r in report)
    assert cap.timed == ["eager", "graph"] * len(report)       # once per bucket, at its first step
    assert sum(r["steps"] for r in report) > len(report)       # later steps reuse the decision
    if kept:
        assert g.replays == sum(r["steps"] for r in report) and g.dummies > 0
    else:                                                      # eager buckets run unpadded
        assert g.replays == 0 and g.dummies == 0 and all(e.staging is None for e in g.entries.values())
    eng2 = make_engine(MODEL, cache="dual", cuda_graphs=True)
    eng2.runner.graphs = StepGraphs(eng2.runner, FakeCapture(graph_ms, eager_ms))
    original = eng2.runner.run
    eng2.runner.run = lambda batch: stats.append(original(batch)) or stats[-1]
    eng2.generate(random_prompts(3, [4, 6, 5], seed=2), SamplingParams(gen_length=8, steps=8, block_length=4))
    padded = [s for s in stats if s.padded_requests > s.refresh + s.reuse]
    assert all(s.graph == kept for s in padded) and bool(padded) == kept
    assert all(s.padded_requests == 4 for s in padded)         # 3 requests run as the bucket of 4
    assert not any(s.graph for s in stats if s.padded_requests == s.refresh + s.reuse)
