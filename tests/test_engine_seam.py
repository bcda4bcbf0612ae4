"""The runner seam (engine.step): an injected runner drives the engine's own scheduler, KV pool
and logit budget without a model; the decisions it returns are what gets committed."""
from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.step import StepDecisions, StepStats
from tests.helpers import random_prompts, tiny_config


class CostRunner:
    """No model: each request commits token 5 at its first `schedule` candidates."""

    def __init__(self, commit: bool):
        self.model_config, self.dtype, self.device = tiny_config(), torch.float32, torch.device("cpu")
        self.commit, self.batches = commit, []

    def run(self, batch) -> StepStats:
        self.batches.append([(r.request_id, p) for r, p in batch])
        rows, pos = [], []
        for i, (req, _) in enumerate(batch):
            cand = req.candidates()[: req.schedule[req.step_in_block]]
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
