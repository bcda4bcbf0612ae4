"""Dream's own sampler (its checkpoint's generation_utils.py `diffusion_generate`), no cache, as a
static-batch system: one full forward over prompt + generation per step, `steps` in all, no blocks
(one time grid over the whole generation). Each row follows baselines.reference_dream exactly."""
from __future__ import annotations

from baselines.common import full_forward
from baselines.dream_decide import commit_step, dream_sampling
from baselines.static_batch import Batch, Policy, StepResult
from engine.sampling import SamplingParams

DEFAULT_ALG = "origin"    # the Instruct checkpoint's generation_config.json


class DreamSampler(Policy):
    """diffusion_generate: a request's block_length is ignored (upstream has none); its alg, eps,
    alg_temp, top_p and top_k are its own (`dream_decide.dream_sampling`)."""

    name = "dream"

    def block_length(self, params: SamplingParams) -> int:
        return params.gen_length

    def check_request(self, params: SamplingParams) -> None:
        dream_sampling(params, DEFAULT_ALG)

    def begin(self, batch: Batch) -> None:
        self.dps = [dream_sampling(r.params, DEFAULT_ALG) for r in batch.reqs]

    def step(self, batch: Batch) -> StepResult:
        logits = full_forward(self.model, batch.x, batch.pos, batch.key_mask)
        commit_step(batch, logits, 0, batch.prompt_len, batch.length, batch.step_in_block, batch.params.steps, self.dps)
        return StepResult(batch.size * batch.length, batch.length, refresh=True)
