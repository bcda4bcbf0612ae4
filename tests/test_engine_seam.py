"""The runner seam (engine.step): an injected runner drives the engine's own scheduler, KV pool
and logit budget without a model; the decisions it returns are what gets committed."""
from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.step import StepDecisions, StepStats
from tests.helpers import candidates, random_prompts, tiny_config


class CostRunner:
    """No model: each request commits token 5 at its first `schedule` candidates."""

    def __init__(self, commit: bool):
        self.model_config, self.dtype, self.device = tiny_config(), torch.float32, torch.device("cpu")
        self.commit, self.batches = commit, []

    def run(self, batch) -> StepStats:
        self.batches.append([(r.request_id, p) for r, p in batch])
        rows, pos = [], []
        for i, (req, _) in enumerate(batch):
            cand = candidates(req)[: req.block_commits[req.step_in_block]]
            rows.append(torch.full((cand.numel(),), i))
            pos.append(cand)
        n = sum(p.is_refresh for _, p in batch)
        if not self.commit:
            return StepStats(1, 0, 0, n, len(batch) - n)
        row, p = torch.cat(rows), torch.cat(pos)
        d = StepDecisions(row, p, torch.full_like(p, 5), torch.ones(p.numel()), [1] * len(batch))
        return StepStats(1, len(batch), len(batch), n, len(batch) - n, d)


@pytest.mark.parametrize("commit", [True, False])
def test_injected_runner_drives_scheduler_and_pool(commit):
    runner = CostRunner(commit)
    eng = LLMEngine(EngineConfig(cache="sparse", kv_pool_tokens=30, max_num_batched_tokens=200), runner=runner)
    params = SamplingParams(gen_length=8, steps=4, block_length=4)
    outs = eng.generate(random_prompts(3, 20, seed=1), params)
    assert [o.finished for o in outs] == [True] * 3
    assert max(len(b) for b in runner.batches) < 3          # the pool (30 slots, 12 each) queued one
    assert eng.pool.used == 0
    if commit:
        assert all(o.token_ids == [5] * 8 and o.nfe == 4 and o.logits_rows == 4 for o in outs)
    else:
        assert all(o.token_ids == [runner.model_config.mask_token_id] * 8 and o.nfe == 0 for o in outs)


def test_injected_runner_needs_a_pool_size_to_profile():
    with pytest.raises(ValueError, match="kv_pool_tokens"):
        LLMEngine(EngineConfig(memory_budget=2**30), runner=CostRunner(True))


def test_stalled_steps_are_counted():
    """A running request left out of a step (its Refresh does not fit behind the others) is a
    stall; blocks of different lengths drift the requests' Refreshes into the same step."""
    eng = LLMEngine(EngineConfig(cache="dual", max_num_batched_tokens=40), runner=CostRunner(True))
    stalls, original = [], eng.scheduler.schedule

    def schedule(now):
        batch = original(now)
        stalls.append(len(eng.scheduler.running) - len(batch))
        return batch

    eng.scheduler.schedule = schedule
    shapes = [(8, 8, 4), (9, 9, 3), (10, 10, 5)]        # (gen, steps, block): 4, 3, 2 steps a block
    prompts = random_prompts(3, 10, seed=2)
    eng.generate(prompts, [SamplingParams(gen_length=g, steps=s, block_length=b) for g, s, b in shapes])
    assert sum(stalls) > 0
    assert eng.counters["stalled_requests"] == sum(stalls)
    assert eng.counters["stalled_steps"] == sum(1 for s in stalls if s)


def test_engine_open_is_the_one_constructor():
    """engine.open builds one device's engine from the config (a context manager, like the one
    over several ranks), and refuses a loaded model for several ranks (each loads its shard)."""
    import engine
    from tests.helpers import tiny_model

    model = tiny_model()
    cfg = EngineConfig(dtype="float64", device="cpu")
    params = SamplingParams(gen_length=8, steps=8, block_length=4)
    prompts = random_prompts(2, 6, seed=3)
    with engine.open(cfg, model=model) as eng:
        assert type(eng) is LLMEngine
        got = [o.token_ids for o in eng.generate(prompts, params)]
    assert got == [o.token_ids for o in LLMEngine(cfg, model=model).generate(prompts, params)]
    with pytest.raises(ValueError, match="give no loaded model"):
        engine.open(EngineConfig(dtype="float64", device="cpu", tensor_parallel_size=2), model=model)
    with pytest.raises(ValueError, match=r"engine\.open"):
        LLMEngine(EngineConfig(dtype="float64", device="cpu", tensor_parallel_size=2), model=model)
