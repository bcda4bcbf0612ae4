"""Fast-dLLM (NVlabs/Fast-dLLM llada/generate.py): block-wise approximate KV cache, as a
static-batch baseline.

Per block: one full forward over the whole canvas that refreshes the cache (its logits also
decide step 0 of the block), then window forwards against the cache until the block has no MASK
left. `dual` (default, generate_with_dual_cache) keeps every position's K/V and queries only the
block; `prefix` (generate_with_prefix_cache) keeps [0, block_start) and queries the block and
everything after it. Decisions use softmax(logits.float64) confidences: the linear schedule, or
parallel decoding with `threshold` / `factor`. Upstream equivalences and NFE semantics are in
`FastDLLM`; knobs in docs/SERVE.md ("Systems and variants").

On a Dream model (dream/model/generation_utils_block.py): the full forward commits block_start alone,
then the block's time grid by negative entropy, or `threshold`; no factor: docs/DREAM_BASELINES.md.
"""
from __future__ import annotations

import torch

from baselines.common import decide, full_forward, logits_of, project, residual
from baselines.dream_decide import commit_first, commit_step, commit_threshold, dream_rules, dream_sampling
from baselines.static_batch import Batch, Policy, StepResult
from engine.models import DenseLM

CACHES = ("dual", "prefix")
DREAM_ALG = "entropy"     # its Dream block sampler scores by negative entropy whatever alg is passed


class FastDLLM(Policy):
    """dual: a window forward queries only the current block, overwrites the block's K/V in place
    and attends over the full length (prefix and suffix stale since the block start). prefix: a
    window forward queries the current block *and every later block* with fresh K/V for them.
    threshold: the most confident candidate always, every other one reaching the threshold.

    NFE (NVlabs/Fast-dLLM@24cc59e generate.py): 1 full forward + window forwards while the block
    still has a MASK, so zero schedule entries (S > block_length) are skipped. The "no MASK left?"
    test runs before each window forward (`block_done`), as in the newer upstream generate.py; the
    pinned snapshot tests after it, which crashes at S = 1 without a threshold and spends one idle
    window forward when the full step already completed the block; tokens are the same.
    K is cached after RoPE, equivalent to upstream's pre-RoPE cache (RoPE is elementwise per
    absolute position, re-applied at the same positions 0..L-1 every forward). In a batch, a row
    whose block is complete (threshold mode) rides along without committing until every row's is:
    its tokens are unaffected (the next block refreshes).
    """

    name = "fast-dllm"

    def __init__(self, model: DenseLM, cache: str = "dual", threshold: float | None = None,
                 factor: float | None = None):
        super().__init__(model)
        if cache not in CACHES:
            raise ValueError(f"fast_dllm_cache must be one of {CACHES}, got {cache!r}")
        if threshold is not None and not isinstance(threshold, (int, float)):
            raise ValueError(f"threshold must be a number or None, got {threshold!r}")   # > 1: one per step
        if factor is not None and (not isinstance(factor, (int, float)) or factor <= 0):
            raise ValueError(f"factor must be a positive number or None, got {factor!r}")
        if factor is not None and threshold is not None:
            raise ValueError("threshold and factor are two parallel-decoding rules: give one")
        self.dream = dream_rules(model)
        if self.dream and factor is not None:
            raise ValueError("fast-dllm has no factor rule on Dream models (only its LLaDA code has one): use threshold")
        self.cache, self.threshold, self.factor = cache, threshold, factor
        self.knobs = dict(fast_dllm_cache=cache, threshold=threshold, factor=factor)
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def begin(self, batch: Batch) -> None:
        self.k, self.v = [], []
        self.dps = [dream_sampling(r.params, DREAM_ALG) for r in batch.reqs] if self.dream else []

    def check_request(self, params) -> None:
        if self.dream:
            dream_sampling(params, DREAM_ALG)

    def step(self, batch: Batch) -> StepResult:
        s, e = batch.block_range
        if batch.step_in_block == 0:
            self.k, self.v = [], []                 # drop the previous block's cache first
            # dual keeps all L positions; prefix keeps [0, s) (a view, as upstream's slice)
            keep = batch.length if self.cache == "dual" else s

            def store(i, q, k, v):
                self.k.append(k[:, :keep])
                self.v.append(v[:, :keep])

            logits = full_forward(self.model, batch.x, batch.pos, batch.key_mask, on_layer=store)
            q_start, refresh = 0, True
        else:
            logits, q_start = self._window(batch, s, e)
            refresh = False
        if self.dream:
            self._dream_commit(batch, logits, q_start)
        else:
            parallel = self.threshold is not None or self.factor is not None
            ks = None if parallel else batch.schedule_at(batch.step_in_block)
            decide(batch, logits, q_start, torch.float64, ks, threshold=self.threshold, factor=self.factor)
        return StepResult(batch.size * logits.shape[1], logits.shape[1], refresh)

    def _dream_commit(self, batch: Batch, logits: torch.Tensor, q_start: int) -> None:
        """Full step: block_start only. Window step i: the threshold rule, or step i of the block's
        time grid linspace(1, eps, S + 1) (S = steps per block) over the block's masks."""
        i = batch.step_in_block
        if i == 0:
            commit_first(batch, logits, q_start, self.dps)
        elif self.threshold is not None:
            commit_threshold(batch, logits, q_start, self.threshold, self.dps)
        else:
            s, e = batch.block_range
            commit_step(batch, logits, q_start, s, e, i, batch.steps_per_block, self.dps, alg=DREAM_ALG)

    def _window(self, batch: Batch, s: int, e: int):
        m = self.model
        q_start = s
        q_end = e if self.cache == "dual" else batch.length
        pos = batch.pos[:, q_start:q_end]
        km = batch.key_mask
        if km is not None and self.cache == "prefix":
            km = km[:, :q_end]                      # keys = [cached prefix ; fresh block + suffix]
        h = m.embed(batch.x[:, q_start:q_end])
        rope = m.rope.at(pos.reshape(-1), h.dtype)
        for i, blk in enumerate(m.blocks):
            q, k, v = project(blk, h, pos, rope)
            if self.cache == "dual":
                self.k[i][:, s:e] = k               # replace_position: fresh block K/V in place
                self.v[i][:, s:e] = v
                kk, vv = self.k[i], self.v[i]
            else:
                kk, vv = torch.cat([self.k[i], k], 1), torch.cat([self.v[i], v], 1)
            h = residual(blk, h, q, kk, vv, km)
        return logits_of(m, h), q_start

    def block_done(self, batch: Batch) -> bool:
        if not bool(batch.block_masked().any()):
            return True
        # Guard, only reachable when the model commits the MASK id itself (a random test model):
        # upstream would index past the schedule (threshold None) or could loop forever; here the
        # block ends after S forwards (threshold None) or max(S, block_length).
        parallel = self.threshold is not None or self.factor is not None
        cap = max(batch.steps_per_block, batch.block_length) if parallel else batch.steps_per_block
        return batch.step_in_block >= cap

    def fixed_forwards(self, batch: Batch) -> int:
        """Until no MASK is left. LLaDA: through the schedule's last nonzero step (a zero tail,
        S > block_length, is skipped). Dream: S (its grid's zero counts come first, step S - 1
        commits what is left), or the full forward alone for a one-token block."""
        if self.dream:
            return batch.steps_per_block if max(sum(s) for s in batch.schedules) > 1 else 1
        return max(1, *(max((i + 1 for i, k in enumerate(s) if k), default=0) for s in batch.schedules))

    def kv_row_tokens(self, batch: Batch) -> list[int]:
        if not self.k:
            return [0] * batch.size
        held = self.k[0].shape[1]
        return [max(0, held - p) for p in batch.pads]

    def cache_tensors(self) -> list[torch.Tensor]:
        return self.k + self.v
