"""Fast-dLLM's dual cache (NVlabs/Fast-dLLM@24cc59e `generate_with_dual_cache`, threshold=None)
written plainly for one sequence against the model's building blocks only, for either family: a
shifted one (Dream) under the engine's block-edge rule (docs/ENGINE.md), its windows querying the
`shift` rows before the block too without storing them. The engine's cache=dual is held to it
(tests/test_engine_exact.py, tests/test_engine_dream.py)."""
from __future__ import annotations

import torch

from engine.sampling import SamplingParams
from tests.helpers import plain_attention

F64 = torch.float64


def _no_rope(t, positions):
    return t


@torch.no_grad()
def plain_full(model, x: torch.Tensor):
    """A full forward over canvas x -> (final-normed hidden [L, d], per layer [pre-RoPE K, V])."""
    pos = torch.arange(x.numel())
    h, cache = model.embed(x), []
    for block in model.blocks:
        q, k, v = block.qkv(h, pos, _no_rope)
        cache.append([k.clone(), v.clone()])
        a = plain_attention(model.rope(q, pos), model.rope(k, pos), v)
        h = h + block.attn_out(a.reshape(h.shape[0], -1))
        h = h + block.mlp(h)
    return model.final_norm(h), cache


@torch.no_grad()
def plain_window(model, x: torch.Tensor, cache, s: int, e: int) -> torch.Tensor:
    """A dual-cache step: rows [s - shift, e) are queried; the block's fresh K/V overwrite its cache
    rows, the edge rows' are not stored; every query attends over all L cached positions (RoPE
    re-applied at 0..L-1). -> final-normed hidden of positions s - shift .. e - 1."""
    shift = model.config.shift
    q_pos, all_pos = torch.arange(s - shift, e), torch.arange(x.numel())
    h = model.embed(x[s - shift : e])
    for li, block in enumerate(model.blocks):
        q, k, v = block.qkv(h, q_pos, _no_rope)
        cache[li][0][s:e], cache[li][1][s:e] = k[shift:], v[shift:]
        K, V = cache[li]
        a = plain_attention(model.rope(q, q_pos), model.rope(K, all_pos), V)
        h = h + block.attn_out(a.reshape(h.shape[0], -1))
        h = h + block.mlp(h)
    return model.final_norm(h)


@torch.no_grad()
def plain_dual_cache_generate(model, prompt: list[int], params: SamplingParams) -> list[int]:
    """At each block start a full forward caches every layer's pre-RoPE K and V for all L positions;
    the block's other steps feed only the block (and its edge rows). Candidate p reads the hidden
    at p - shift. Randomness follows engine.unmask's contract: noise / uniforms drawn for the
    block's masked rows in position order; confidences in float64, as Fast-dLLM."""
    mask, shift = model.config.mask_token_id, model.config.shift
    P, bl, S = len(prompt), params.block_length, params.steps_per_block
    x = torch.tensor(list(prompt) + [mask] * params.gen_length)
    g_noise = torch.Generator().manual_seed(params.seed)
    g_remask = torch.Generator().manual_seed(params.seed ^ 0x5DEECE66D)
    for b in range(params.num_blocks):
        s, e = P + b * bl, P + (b + 1) * bl
        n = int((x[s:e] == mask).sum())
        sched = [n // S + (1 if i < n % S else 0) for i in range(S)]
        cache = None
        for i in range(S):
            if i == 0:
                hidden, cache = plain_full(model, x)
                base = 0
            else:
                hidden, base = plain_window(model, x, cache, s, e), s - shift
            cand = torch.nonzero(x[s:e] == mask).squeeze(-1) + s     # positions >= e excluded
            lg = model.lm_head(hidden[cand - shift - base]).to(F64)
            score = lg
            if params.temperature > 0:
                u = torch.rand(lg.shape, dtype=F64, generator=g_noise)
                score = lg.exp() / (-torch.log(u)) ** params.temperature
            x0 = score.index_fill(-1, torch.tensor([mask]), -torch.inf).argmax(-1)   # never the mask id
            if params.remasking == "random":
                conf = torch.rand(cand.numel(), dtype=F64, generator=g_remask)
            else:
                conf = lg.softmax(-1).gather(-1, x0[:, None])[:, 0]
            if sched[i] > 0:
                pick = torch.topk(conf, sched[i]).indices
                x[cand[pick]] = x0[pick]
    return x[P:].tolist()
