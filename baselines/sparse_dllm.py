"""Sparse-dLLM (OpenMOSS/Sparse-dLLM, llada_generate.py + modeling_llada.py CustomCache): dynamic
cache eviction with delayed selection, a new cache per block, as a static-batch baseline.

Step i of a block: i = 0 a plain full forward; i = 1 a full forward that, in every layer, scores
the context (everything outside the current block) and keeps a subset of its post-RoPE K/V, the
step's own attention still using everything (eviction delayed by one step); i >= 2 forwards only
the block, with RoPE at its absolute positions, against [kept K/V ; fresh block K/V]. The cache
is never updated again inside the block. The selection rule is `importance`'s; batching (upstream
is batch-1) is `SparseDLLM`'s. Knobs: docs/SERVE.md ("Systems and variants").

On a Dream model (opencompass/models/sparse_dllm/dream/generation_utils.py) the same cache runs
Dream's decoding: step 0 commits only block_start (the block-edge rule), steps 1..S-1 follow the
block's time grid with the request's alg (its `origin` is broken upstream: refused). Eviction is
the same rule (one token set for every KV head). Details: docs/DREAM_BASELINES.md.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from baselines.common import attend, decide, full_forward, logits_of, project
from baselines.dream_decide import commit_first, commit_step, dream_rules, dream_sampling
from baselines.static_batch import Batch, Policy, StepResult
from engine.models import DenseLM


def importance(q_block: torch.Tensor, k_ctx: torch.Tensor, kernel_size: int | None) -> torch.Tensor:
    """q_block [Lb, Hq, D], k_ctx [Lc, Hkv, D] -> pooled per-token importance [Lc].

    As upstream's CustomCache.filter_cache: q̄ = mean of the block's queries per head; a raw dot
    q̄·K (no 1/sqrt(d), no softmax) per head and context token; mean over heads (one score per
    token, shared by all heads; with GQA keys repeated to the query heads); max_pool1d(kernel_size,
    stride 1, padding k//2) along the context (the block removed, so its two neighbours are
    adjacent). The caller keeps the top int(L_ctx * keep_ratio), gathered in importance order.
    """
    rep = q_block.shape[1] // k_ctx.shape[1]
    k = k_ctx.repeat_interleave(rep, dim=1) if rep > 1 else k_ctx
    q_mean = q_block.mean(0)                                          # [Hq, D]
    scores = torch.matmul(q_mean.unsqueeze(1), k.permute(1, 2, 0)).squeeze(1)   # [Hq, Lc]
    imp = scores.mean(0)
    if kernel_size is not None:
        imp = F.max_pool1d(imp[None, None], kernel_size=kernel_size, stride=1, padding=kernel_size // 2)[0, 0]
    return imp


DREAM_ALG = "entropy"     # its Dream wrappers' diffusion_config


class SparseDLLM(Policy):
    """Token decisions as LLaDA's sampler (softmax in the logits dtype). Upstream is batch-1; here
    each row selects from its own context (left padding excluded), so rows may keep different
    counts: the kept cache is right-padded to the largest and the padding masked."""

    name = "sparse-dllm"

    def __init__(self, model: DenseLM, keep_ratio: float = 0.5, kernel_size: int | None = 3):
        super().__init__(model)
        if kernel_size is not None and (kernel_size < 1 or kernel_size % 2 == 0):
            # an even kernel makes max_pool1d(padding=k//2) return one extra element
            raise ValueError(f"kernel_size must be a positive odd number (or None), got {kernel_size}")
        if not 0 <= keep_ratio <= 1:
            raise ValueError(f"keep_ratio must be in [0, 1], got {keep_ratio}")
        self.keep_ratio, self.kernel_size = float(keep_ratio), kernel_size
        self.knobs = dict(keep_ratio=self.keep_ratio, kernel_size=kernel_size)
        self.kept: list[tuple] | None = None
        self.keep_counts: list[int] = []
        self.dream = dream_rules(model)

    def check_request(self, params) -> None:
        if self.dream and dream_sampling(params, DREAM_ALG).remasking == "origin":
            raise ValueError("sparse-dllm's Dream sampler has no working alg='origin' (upstream: 'do not "
                             "implement'): use maskgit_plus, topk_margin or entropy")

    def begin(self, batch: Batch) -> None:
        self.kept = None
        self.dps = [dream_sampling(r.params, DREAM_ALG) for r in batch.reqs] if self.dream else []

    def _commit(self, batch: Batch, logits: torch.Tensor, q_start: int, i: int) -> None:
        """LLaDA: the linear schedule. Dream: block_start alone at step 0, then the time grid."""
        if not self.dream:
            decide(batch, logits, q_start, logits.dtype, batch.schedule_at(i))
        elif i == 0:
            commit_first(batch, logits, q_start, self.dps)
        else:
            s, e = batch.block_range
            commit_step(batch, logits, q_start, s, e, i, batch.steps_per_block, self.dps)

    def step(self, batch: Batch) -> StepResult:
        i = batch.step_in_block
        s, e = batch.block_range
        if i <= 1:
            self.kept = None                            # a new CustomCache per block
            layers: list[tuple] = []
            hook = (lambda li, q, k, v: layers.append(self._select(batch, q, k, v))) if i == 1 else None
            logits = full_forward(self.model, batch.x, batch.pos, batch.key_mask, on_layer=hook)
            if i == 1:
                self.kept = layers
            self._commit(batch, logits, 0, i)
            return StepResult(batch.size * batch.length, batch.length, refresh=True)
        m = self.model
        h = m.embed(batch.x[:, s:e])
        pos = batch.pos[:, s:e]
        rope = m.rope.at(pos.reshape(-1), h.dtype)
        for li, blk in enumerate(m.blocks):
            q, k, v = project(blk, h, pos, rope)
            kk, vk, mk = self.kept[li]
            km = None if mk is None else torch.cat([mk, torch.ones_like(mk[:, :1]).expand(-1, e - s)], 1)
            h = h + blk.attn_out(attend(q, torch.cat([kk, k], 1), torch.cat([vk, v], 1), km))
            h = h + blk.mlp(h)
        logits = logits_of(m, h)
        self._commit(batch, logits, s, i)
        return StepResult(batch.size * (e - s), e - s, refresh=False,
                          key_tokens=batch.size * (self.kept[0][0].shape[1] + e - s))   # [kept ; block] per row

    def _select(self, batch: Batch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """One layer's kept (K, V, key mask or None), each row from its own real context."""
        s, e = batch.block_range
        dev = k.device
        picks = []
        for r in range(batch.size):
            ctx = torch.cat([torch.arange(batch.pads[r], s, device=dev), torch.arange(e, batch.length, device=dev)])
            n_keep = int(ctx.numel() * self.keep_ratio)
            imp = importance(q[r, s:e], k[r, ctx], self.kernel_size)
            picks.append(ctx[torch.topk(imp, n_keep).indices])     # importance order, as upstream
        self.keep_counts = [p.numel() for p in picks]
        n_max = max(self.keep_counts)
        kk = k.new_zeros(batch.size, n_max, *k.shape[2:])
        vk = v.new_zeros(batch.size, n_max, *v.shape[2:])
        mk = torch.zeros(batch.size, n_max, dtype=torch.bool, device=dev)
        for r, p in enumerate(picks):
            kk[r, : p.numel()], vk[r, : p.numel()], mk[r, : p.numel()] = k[r, p], v[r, p], True
        return kk, vk, (None if bool(mk.all()) else mk)

    def kv_row_tokens(self, batch: Batch) -> list[int]:
        return list(self.keep_counts) if self.kept is not None else [0] * batch.size

    def cache_tensors(self) -> list[torch.Tensor]:
        return [t for layer in (self.kept or []) for t in layer[:2]]
