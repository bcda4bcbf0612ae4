"""LLaDA's own sampler (ML-GSAI/LLaDA generate.py, low-confidence remasking), no cache: every
step is one full forward over prompt + generation with full-sequence logits (NFE = steps)."""
from __future__ import annotations

from baselines.common import decide, full_forward
from baselines.static_batch import Batch, Policy, StepResult


class LLaDASampler(Policy):
    """LLaDA generate.py: S full forwards per block, confidence softmax in the logits dtype."""

    name = "llada"

    def step(self, batch: Batch) -> StepResult:
        logits = full_forward(self.model, batch.x, batch.pos, batch.key_mask)
        decide(batch, logits, 0, logits.dtype, batch.schedule_at(batch.step_in_block))
        return StepResult(batch.size * batch.length, batch.length, refresh=True)
