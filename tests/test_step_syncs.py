"""A step reads the device back once (its commit decisions), never inside the layers, and its
model forward traces into one graph (issue: the GPU path, not host-bound).

* the sync counter (`benchmarks/dispatch_count.py`) sees at most 2 host syncs per step at 1, 8 and 64
  requests, for two layer counts, every cache policy, with sampling, random remasking and a
  chunked logit budget in the mix, and it does count each kind of sync it names;
* the forward of a prepared step compiles with torch.compile(fullgraph=True,
  backend="aot_eager") for Reuse-only batches (sparse and dual) and mixed batches, and gives
  the eager result.
"""
from __future__ import annotations

import pytest
import torch

from benchmarks.dispatch_count import SyncCounter, syncs_per_step
from engine import SamplingParams
from engine.request import Phase
from tests.helpers import make_engine, random_prompts, tiny_model


def _params(i: int) -> SamplingParams:
    return SamplingParams(gen_length=16, steps=8 if i % 2 else 16, block_length=8, temperature=0.7 * (i % 3 == 1),
                          remasking="random" if i % 5 == 2 else "low_confidence", seed=i)


@pytest.mark.parametrize("n_layers", [1, 3])
@pytest.mark.parametrize("cache", ["sparse", "dual", "none"])
def test_at_most_two_syncs_per_step(cache, n_layers):
    model = tiny_model(torch.float32, n_layers=n_layers, seed=n_layers)
    for n in (1, 8, 64):
        eng = make_engine(model, cache=cache, max_num_batched_tokens=8192, max_num_seqs=64, max_num_logits=48)
        for i, p in enumerate(random_prompts(n, [4 + i % 9 for i in range(n)], seed=n)):
            eng.add_request(p, _params(i))
        counts = syncs_per_step(eng)
        assert counts and max(counts) <= 2, (n, counts)


def test_the_counter_counts_each_kind():
    x = torch.arange(6.0)
    mask = x > 2
    cases = {
        "item": lambda: x[0].item(),
        "bool": lambda: bool(x[1] > 0),
        "nonzero": lambda: torch.nonzero(mask),
        "boolean index": lambda: x[mask],
        "boolean index_put_": lambda: x.clone().__setitem__(mask, 0.0),
        "tolist": lambda: x.tolist(),
        "numpy": lambda: x.numpy(),
        "cpu": lambda: x.cpu(),
        "repeat_interleave": lambda: torch.repeat_interleave(torch.tensor([1, 2])),
    }
    for name, fn in cases.items():
        with SyncCounter() as s:
            fn()
        assert s.total == 1, (name, dict(s.by_kind))
    with SyncCounter() as s:                     # a readback and its numpy view: one sync
        x.cpu().numpy()
        x[torch.tensor([0, 2])] += 1             # integer indexing: none
    assert s.total == 1, dict(s.by_kind)
    assert x.tolist() == [1.0, 1.0, 3.0, 3.0, 4.0, 5.0]   # the methods are restored afterwards


def _step_kinds(cache: str):
    """(phases of a step, its prepared step, the engine) for each new kind of step of a staggered run."""
    model = tiny_model(torch.float32, seed=5)
    eng = make_engine(model, cache=cache, max_num_batched_tokens=8192, kv_pool_tokens=512)   # storage never moves
    seen, found = set(), []
    original = eng.runner.run

    def run(batch):
        kinds = frozenset(p for _, p in batch)
        if kinds not in seen:
            seen.add(kinds)
            found.append((kinds, eng.runner.prepare(batch), eng.pool.storage.clone()))
        return original(batch)

    eng.runner.run = run
    for p in random_prompts(4, [5, 9, 3, 12], seed=1):
        eng.add_request(p, SamplingParams(gen_length=16, steps=16, block_length=8))
        eng.step()
    while eng.has_unfinished():
        eng.step()
    return eng, found


@pytest.mark.parametrize("cache", ["sparse", "dual"])
def test_forward_compiles_without_graph_breaks(cache):
    eng, found = _step_kinds(cache)
    wanted = [k for k in found if k[0] == {Phase.REUSE} or len(k[0]) > 1]
    assert any(k[0] == {Phase.REUSE} for k in wanted) and any(len(k[0]) > 1 for k in wanted)
    for kinds, p, storage in wanted:
        torch._dynamo.reset()
        eng.pool.storage.copy_(storage)
        with torch.no_grad():
            want = eng.runner.forward(p)
            eng.pool.storage.copy_(storage)
            got = torch.compile(eng.runner.forward, fullgraph=True, backend="aot_eager")(p)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=str(kinds))
