"""A tiny, decision-sensitive Dream for the engine tests (GQA 7:1 as Dream-7B's 28:4, q/k/v
biases, shift 1), its HF checkpoint, and Fast-dLLM's dual cache written plainly under the
engine's block-edge rule (docs/ENGINE.md, "A shifted family's block edge")."""
from __future__ import annotations

import json

import torch

from engine.models import DenseLM, build_model, config_from_dict, hf_state_dict
from engine.sampling import SamplingParams
from tests.helpers import plain_attention, random_prompts, randomized

F64 = torch.float64
MASK, EOS, BOS = 97, 96, 95
DREAM = {"model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 112, "num_attention_heads": 14,
         "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 98,
         "rope_theta": 1e6, "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "mask_token_id": MASK,
         "eos_token_id": EOS, "pad_token_id": EOS, "bos_token_id": BOS, "tie_word_embeddings": False}


def tiny_dream(seed: int = 0, **overrides) -> DenseLM:
    """Weights ~ N(0, 0.5²) (biases too), norms ~ 1: logits spread widely, so a wrong row or key
    set changes decisions."""
    return randomized(build_model(config_from_dict({**DREAM, **overrides})), seed).to(F64).eval()


def dream_prompts(n: int, lengths, seed: int = 0) -> list[list[int]]:
    return random_prompts(n, lengths, seed=seed, vocab=BOS)


def write_dream_checkpoint(model: DenseLM, path):
    """The model in Dream's HF layout (config.json, checkpoint weight names)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_hf()))
    save_file({k: v.contiguous() for k, v in hf_state_dict(model).items()}, str(path / "model.safetensors"))
    return path


def _no_rope(t, positions):
    return t


@torch.no_grad()
def plain_full(model: DenseLM, x: torch.Tensor):
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
def plain_window(model: DenseLM, x: torch.Tensor, cache, s: int, e: int) -> torch.Tensor:
    """A dual-cache step under the edge rule: rows [s-1, e) are queried; the block's fresh K/V
    overwrite its cache rows, row s-1's are not stored; every query attends over all L cached
    positions. -> final-normed hidden of positions s-1 .. e-1."""
    L = x.numel()
    q_pos, all_pos = torch.arange(s - 1, e), torch.arange(L)
    h = model.embed(x[s - 1 : e])
    for li, block in enumerate(model.blocks):
        q, k, v = block.qkv(h, q_pos, _no_rope)
        cache[li][0][s:e], cache[li][1][s:e] = k[1:], v[1:]
        K, V = cache[li]
        a = plain_attention(model.rope(q, q_pos), model.rope(K, all_pos), V)
        h = h + block.attn_out(a.reshape(h.shape[0], -1))
        h = h + block.mlp(h)
    return model.final_norm(h)


@torch.no_grad()
def plain_shifted_dual_generate(model: DenseLM, prompt: list[int], params: SamplingParams) -> list[int]:
    """tests/test_engine_exact.plain_dual_cache_generate for a shifted family: candidate p reads
    the hidden at p - 1 (the block's full forward: the canvas's row; later steps: the window's
    edge row for p = s). LLaDA's decisions and random streams."""
    P, bl, S = len(prompt), params.block_length, params.steps_per_block
    x = torch.tensor(list(prompt) + [MASK] * params.gen_length)
    g_noise = torch.Generator().manual_seed(params.seed)
    g_remask = torch.Generator().manual_seed(params.seed ^ 0x5DEECE66D)
    for b in range(params.num_blocks):
        s, e = P + b * bl, P + (b + 1) * bl
        n = int((x[s:e] == MASK).sum())
        sched = [n // S + (1 if i < n % S else 0) for i in range(S)]
        cache = None
        for i in range(S):
            if i == 0:
                hidden, cache = plain_full(model, x)
                base = 0
            else:
                hidden, base = plain_window(model, x, cache, s, e), s - 1
            cand = torch.nonzero(x[s:e] == MASK).squeeze(-1) + s
            lg = model.lm_head(hidden[cand - 1 - base]).to(F64)
            score = lg
            if params.temperature > 0:
                u = torch.rand(lg.shape, dtype=F64, generator=g_noise)
                score = lg.exp() / (-torch.log(u)) ** params.temperature
            x0 = score.index_fill(-1, torch.tensor([MASK]), -torch.inf).argmax(-1)
            if params.remasking == "random":
                conf = torch.rand(cand.numel(), dtype=F64, generator=g_remask)
            else:
                conf = lg.softmax(-1).gather(-1, x0[:, None])[:, 0]
            if sched[i] > 0:
                pick = torch.topk(conf, sched[i]).indices
                x[cand[pick]] = x0[pick]
    return x[P:].tolist()
