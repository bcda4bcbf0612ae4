"""dLLM-Cache (maomaocun/dLLM-cache, cache_hook_LLaDA.py + utils/generate_function.py): adaptive
feature caching as a static-batch baseline.

Every step feeds the whole canvas, but each layer recomputes only part of it: the prompt segment
every `prompt_interval` forwards, the generated segment every `gen_interval` forwards and, with
0 < transfer_ratio <= 1, the generated tokens whose V moved most in between ("V-verify"); the
rest comes from cached K, V and per-layer attention/MLP deltas. The exact refresh rule, the
sampler and the upstream equivalences are in `DLLMCache`; its knobs in docs/SERVE.md
("Systems and variants").

On a Dream model (cache_hook_Dream.py) the hook is the same code; the sampler is Dream's own
`diffusion_generate` over the whole canvas (no blocks; `steps` forwards) with the request's alg,
on logits shifted over all L rows. Details: docs/DREAM_BASELINES.md.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from baselines.common import attend, decide, logits_of, project
from baselines.dream_decide import commit_step, dream_rules, dream_sampling
from baselines.static_batch import Batch, Policy, StepResult
from engine.models import DenseLM, rms_norm

# Upstream scripts' settings for LLaDA-8B-Instruct: (prompt_interval, gen_interval,
# transfer_ratio, gen_length, block_length, steps). The default is gsm8k's (block 8 upstream).
TASK_DEFAULTS = {
    "demo": (100, 7, 0.25, 256, 8, 256),
    "gsm8k": (50, 7, 0.25, 256, 8, 256),
    "humaneval": (50, 8, 0.25, 512, 32, 512),
    "mbpp": (100, 5, 0.25, 512, 32, 512),
    "bbh": (50, 6, 0.25, 256, 256, 256),
    "gpqa": (50, 6, 0.25, 128, 64, 128),
    "minerva_math": (50, 1, 0.25, 256, 256, 256),
    "mmlu_pro": (51, 3, 0.25, 256, 256, 256),
    "mmlu_generative": (100, 7, 0.25, 3, 3, 3),
    "long_bench": (100, 8, 0.25, 32, 32, 32),
    "no_cache": (-1, -1, 0.0, None, None, None),   # (t-1) % -1 == 0: refresh every step
}
# Its scripts/run_Dream_*_Instruct.sh: (prompt_interval, gen_interval, transfer_ratio), gen 256 =
# steps, whole canvas, alg entropy, temperature 0.2, top_p 0.95 (DC @17235bf).
DREAM_TASK_DEFAULTS = {
    "gsm8k": (25, 2, 0.25), "humaneval": (50, 1, 0.25), "mbpp": (10, 8, 0.25), "bbh": (10, 2, 0.25),
    "gpqa": (10, 8, 0.25), "minerva_math": (50, 1, 0.25), "mmlu_generative": (100, 8, 0.25), "mmlu_pro": (5, 1, 0.25),
}
DREAM_ALG = "entropy"     # every Dream script's alg


class DLLMCache(Policy):
    """Per layer and segment (prompt = [0, prompt_len) of the padded canvas, gen = the rest) caches
    K, V, the attention delta (after attn_out) and the MLP delta (after ff_out); a layer's output is
    always x_in + attn delta + mlp delta with the *current* x_in. At the t-th forward of a
    generation (t counted across blocks, never reset) a layer refreshes the prompt if
    (t-1) % prompt_interval == 0 and the gen part if (t-1) % gen_interval == 0; layer 0 always
    refreshes both; V-verify in between: `_verify`.

    Sampler (upstream's own generate): logits over the whole canvas, decisions on
    logits[:, prompt_len:]; argmax of exp(logits) at T = 0, noise and softmax in the logits dtype.
    K is cached after RoPE, equivalent to upstream's pre-RoPE cache (RoPE is elementwise per
    absolute position, re-applied at the same positions). Cached slices are views that later
    in-place updates write through, as upstream's scatter_ does; nothing reads the aliased parts.
    CFG (upstream's cfg_interval_steps) is not implemented: rejected at add_request.
    """

    name = "dllm-cache"

    def __init__(self, model: DenseLM, prompt_interval: int = 50, gen_interval: int = 7, transfer_ratio: float = 0.25):
        super().__init__(model)
        if prompt_interval == 0 or gen_interval == 0:
            raise ValueError("prompt_interval and gen_interval must be non-zero")
        # Upstream (maomaocun/dLLM-cache@5aa31dd, cache_hook_LLaDA.py) runs V-verify only for
        # 0 < ratio <= 1 and silently turns it off for any other value; here "off" is spelt 0, so
        # a ratio outside [0, 1] (5 meant as 5 %?) is an error rather than a quiet change of method.
        if not 0.0 <= float(transfer_ratio) <= 1.0:
            raise ValueError(f"transfer_ratio must be in [0, 1] (0 = no V-verify), got {transfer_ratio}")
        self.pi, self.gi, self.ratio = int(prompt_interval), int(gen_interval), float(transfer_ratio)
        self.knobs = dict(prompt_interval=self.pi, gen_interval=self.gi, transfer_ratio=self.ratio)
        self.c: list[dict] = []
        self.dream = dream_rules(model)

    def block_length(self, params) -> int:
        return params.gen_length if self.dream else params.block_length

    def check_request(self, params) -> None:
        if self.dream:
            dream_sampling(params, DREAM_ALG)

    def begin(self, batch: Batch) -> None:
        self.c = [{} for _ in self.model.blocks]     # reset_cache(prompt_length) per generation
        self.dps = [dream_sampling(r.params, DREAM_ALG) for r in batch.reqs] if self.dream else []

    def step(self, batch: Batch) -> StepResult:
        t = batch.forwards + 1                         # the global step counter, 1-based
        m, P = self.model, batch.prompt_len
        h = m.embed(batch.x)
        for i, blk in enumerate(m.blocks):
            rp = (t - 1) % self.pi == 0 or i == 0
            rg = (t - 1) % self.gi == 0 or i == 0
            h = self._layer(blk, self.c[i], h, rp, rg, batch)
        logits = logits_of(m, h)                       # the hooked model still returns all L rows
        if self.dream:                                 # Dream's sampler, whole canvas: step t - 1 of `steps`
            commit_step(batch, logits, 0, P, batch.length, t - 1, batch.params.steps, self.dps)
        else:
            decide(batch, logits[:, P:], P, logits.dtype, batch.schedule_at(batch.step_in_block), exp_argmax=True)
        full = (t - 1) % self.pi == 0 and (t - 1) % self.gi == 0
        return StepResult(batch.size * batch.length, batch.length, refresh=full)

    def _layer(self, blk, c: dict, h: torch.Tensor, rp: bool, rg: bool, batch: Batch) -> torch.Tensor:
        P, pos, km, rope = batch.prompt_len, batch.pos, batch.key_mask, self.model.rope
        transfer = 0 < self.ratio <= 1
        idx = None
        if rp and rg:                                  # 1: plain layer, cache everything
            q, k, v = project(blk, h, pos, rope)
            a = blk.attn_out(attend(q, k, v, km))
            c.update(kp=k[:, :P], vp=v[:, :P], kg=k[:, P:], vg=v[:, P:], ap=a[:, :P], ag=a[:, P:])
        elif rg:                                       # 2: gen queries over [cached prompt ; fresh gen]
            q, kg, vg = project(blk, h[:, P:], pos[:, P:], rope)
            c.update(kg=kg, vg=vg)
            c["ag"] = blk.attn_out(attend(q, torch.cat([c["kp"], kg], 1), torch.cat([c["vp"], vg], 1), km))
            a = torch.cat([c["ap"], c["ag"]], 1)
        elif rp:                                       # 3: fresh prompt (+ selected gen) queries
            qp, kp, vp = project(blk, h[:, :P], pos[:, :P], rope)
            c.update(kp=kp, vp=vp)
            if transfer:
                idx, qsel = self._verify(blk, c, h, batch)
                o = blk.attn_out(attend(torch.cat([qp, qsel], 1), torch.cat([kp, c["kg"]], 1),
                                        torch.cat([vp, c["vg"]], 1), km))
                c["ap"] = o[:, :P]
                _scatter(c["ag"], idx, o[:, P:])
            else:
                c["ap"] = blk.attn_out(attend(qp, torch.cat([kp, c["kg"]], 1), torch.cat([vp, c["vg"]], 1), km))
            a = torch.cat([c["ap"], c["ag"]], 1)
        else:                                          # 4: cached deltas (+ selected gen)
            if transfer:
                idx, qsel = self._verify(blk, c, h, batch)
                o = blk.attn_out(attend(qsel, torch.cat([c["kp"], c["kg"]], 1), torch.cat([c["vp"], c["vg"]], 1), km))
                _scatter(c["ag"], idx, o)
            a = torch.cat([c["ap"], c["ag"]], 1)
        h = h + a
        # MLP on the (possibly cached) attention output, for the same tokens as the attention.
        if rp and rg:
            f = blk.mlp(h)
            c.update(mp=f[:, :P], mg=f[:, P:])
        elif rg:
            c["mg"] = blk.mlp(h[:, P:])
        elif rp:
            if idx is not None:
                f = blk.mlp(torch.cat([h[:, :P], _gather(h[:, P:], idx)], 1))
                c["mp"] = f[:, :P]
                _scatter(c["mg"], idx, f[:, P:])
            else:
                c["mp"] = blk.mlp(h[:, :P])
        elif idx is not None:
            _scatter(c["mg"], idx, blk.mlp(_gather(h[:, P:], idx)))
        return h + torch.cat([c["mp"], c["mg"]], 1)

    def _verify(self, blk, c: dict, h: torch.Tensor, batch: Batch):
        """V-verify: fresh V for all gen tokens; fresh K and RoPE'd Q for the int(G * ratio)
        least similar ones (cosine to the cached V; per row; topk order). Updates the gen K/V cache; returns (idx, q_sel)."""
        P, B = batch.prompt_len, batch.size
        n_normed = rms_norm(h[:, P:], blk.attn_norm.weight, blk.eps)
        G = n_normed.shape[1]
        v_new = blk.v_proj(n_normed)
        sim = F.cosine_similarity(v_new, c["vg"].reshape(B, G, -1), dim=-1)
        idx = torch.topk(sim, int(G * self.ratio), dim=-1, largest=False).indices   # [B, n]
        sel = _gather(n_normed, idx)
        n = idx.shape[1]
        psel = batch.pos[:, P:].gather(1, idx).reshape(-1)
        rope = self.model.rope
        qsel = rope(blk.q_proj(sel).view(B * n, blk.n_heads, blk.head_dim), psel).view(B, n, blk.n_heads, blk.head_dim)
        ksel = rope(blk.k_proj(sel).view(B * n, blk.n_kv, blk.head_dim), psel).view(B, n, blk.n_kv, blk.head_dim)
        c["vg"] = v_new.view(B, G, blk.n_kv, blk.head_dim)     # V replaced for ALL gen tokens
        _scatter(c["kg"], idx, ksel)                            # K only at the selected ones
        return idx, qsel

    def kv_row_tokens(self, batch: Batch) -> list[int]:
        if not self.c or not self.c[0]:
            return [0] * batch.size
        return [batch.row_length(i) for i in range(batch.size)]

    def kv_token_bytes(self) -> int:
        """K and V (the engine's `bytes_per_token`) plus the attention and MLP deltas, every layer."""
        cf = self.model.config
        return super().kv_token_bytes() + cf.n_layers * 2 * cf.d_model * self.model.dtype.itemsize

    def cache_tensors(self) -> list[torch.Tensor]:
        return [t for c in self.c for t in c.values()]


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """t [B, T, ...] at idx [B, n] -> [B, n, ...]."""
    return t[torch.arange(t.shape[0], device=t.device)[:, None], idx]


def _scatter(t: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> None:
    """In place: t[b, idx[b, j]] = src[b, j] (upstream's scatter_ along the token axis)."""
    t[torch.arange(t.shape[0], device=t.device)[:, None], idx] = src
