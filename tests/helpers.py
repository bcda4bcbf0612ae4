"""Shared helpers for the engine tests: a tiny, decision-sensitive LLaDA and random prompts."""
from __future__ import annotations

import math

import numpy as np
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.attention import key_bias, padded_attention
from engine.models import DenseLM, ModelConfig, build_model

MASK, EOS = 299, 298


def tiny_config(**overrides) -> ModelConfig:
    kw = dict(d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=128, vocab_size=300,
              embedding_size=300, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=EOS)
    kw.update(overrides)
    return ModelConfig(**kw)


def tiny_model(dtype: torch.dtype = torch.float64, n_kv_heads: int = 2, seed: int = 0, **overrides) -> DenseLM:
    """Random LLaDA with weights ~ N(0, 0.5²): large logits spread, so a changed computation
    (stale cache, wrong key set, wrong row) changes decisions and a test can fail."""
    return randomized(build_model(tiny_config(n_kv_heads=n_kv_heads, **overrides)), seed).to(dtype).eval()


def randomized(model, seed: int):
    """The model with weights ~ N(0, 0.5²) (biases too) and norms ~ 1 + N(0, 0.1²), seeded."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    return model


def random_prompts(n: int, lengths, seed: int = 0, vocab: int = 298) -> list[list[int]]:
    """n prompts of the given lengths (an int or a list), ids in [0, vocab) (no MASK/EOS)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [lengths] * n if isinstance(lengths, int) else list(lengths)
    return [torch.randint(0, vocab, (L,), generator=g).tolist() for L in lengths]


def make_engine(model: DenseLM, **kw) -> LLMEngine:
    kw.setdefault("attention_backend", "sdpa")
    kw.setdefault("device", "cpu")
    kw.setdefault("cache", "sparse")          # the mechanism these tests were written against
    return LLMEngine(EngineConfig(**kw), model=model)


def run_alone(model, prompt, params: SamplingParams, **kw) -> list[int]:
    return make_engine(model, **kw).generate([prompt], params)[0].token_ids


def plain_attention(q, k, v):
    """q [Lq, Hq, D], k/v [Lk, Hkv, D]: softmax(QK^T / sqrt(D)) V, query head h uses KV head h // G."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def padded_varlen(q, cu_q: list[int], keys, values):
    """q [Nq, Hq, D] packed; segment i attends over keys[i] / values[i] ([Hkv, Lk_i, D]) through the
    engine's padded SDPA (engine.attention.padded_attention, key_bias) -> [Nq, Hq, D]."""
    lq, lk = [b - a for a, b in zip(cu_q, cu_q[1:])], [t.shape[1] for t in keys]
    G = len(keys)
    qp = q.new_zeros(G, max(lq), *q.shape[1:])
    kp = q.new_zeros(G, max(lk), keys[0].shape[0], q.shape[-1])
    vp = torch.zeros_like(kp)
    mask = torch.zeros(G, max(lk), dtype=torch.bool, device=q.device)
    for i in range(G):
        qp[i, : lq[i]] = q[cu_q[i] : cu_q[i + 1]]
        kp[i, : lk[i]] = keys[i].transpose(0, 1)
        vp[i, : lk[i]] = values[i].transpose(0, 1)
        mask[i, : lk[i]] = True
    o = padded_attention(qp, kp, vp, key_bias(mask, q.dtype))
    return torch.cat([o[i, : lq[i]] for i in range(G)])


def run_cli(monkeypatch, capsys, *args: str):
    """`dllm-bench ARGS` through the real entry point in this process -> CompletedProcess (exit
    code, stdout, stderr), without a subprocess's seconds of imports."""
    import subprocess
    import sys

    from dllm_bench import cli as entry

    monkeypatch.setattr(sys, "argv", ["dllm-bench", *args])
    code = 0
    try:
        entry.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)


def one_error_line(r, *words: str) -> str:
    """Bad input as every command reports it: exit 2 and exactly one `error:` line on stderr,
    naming each of `words` (r: a CompletedProcess) -> the line."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr[-2000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def metered_steps(eng: LLMEngine):
    """Runs a one-request engine step by step under the memory meter: the request's output, each
    step's measured peak bytes and each step's query rows."""
    import time

    from engine.profiler import MemoryMeter

    peaks, queries, out = [], [], None
    while eng.has_unfinished():
        batch = eng.scheduler.schedule(time.perf_counter())
        with MemoryMeter() as m:
            st = eng.runner.run(batch)
        eng.commit(batch, st.decisions)
        for req in eng.advance(batch, time.perf_counter()):
            eng.scheduler.finish(req)
            out = req.output()
        peaks.append(m.peak_bytes)
        queries.append(st.query_tokens)
    return out, peaks, queries


def live_bytes(meter) -> int:
    """The bytes a CPU `MemoryMeter` counts live now (0 on CUDA)."""
    return meter.mode.current if meter.mode is not None else 0


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def predicted_logits_bytes(rows: int, vocab: int, dtype: torch.dtype) -> int:
    """What one [rows, vocab] logits tensor costs: the term the logit budget bounds."""
    return rows * vocab * torch.empty(0, dtype=dtype).element_size()


def select_one(q_block, k_ctx, n_keep: int, selection: str, window: int, query: str = "mean") -> torch.Tensor:
    """`engine.sparse.select_many` for one sequence: q_block [Lb, Hq, D], k_ctx [Hkv, Lc, D] -> [Hkv, n_keep]."""
    from engine import sparse

    return sparse.select_many(q_block[None], k_ctx[None], [(k_ctx.shape[1], n_keep, None)], n_keep, selection,
                              window, query)[0]


def candidates(req) -> torch.Tensor:
    """Positions of the request's current block's masked tokens (a CPU tensor)."""
    s, e = req.block_range
    return torch.from_numpy(np.flatnonzero(req.host_canvas[s:e] == req.mask_id) + s)


def kv_of(req) -> torch.Tensor | None:
    """A request's cache as [layers, 2, H_kv, slots, head_dim] (a copy); None once released."""
    return None if req.slots is None else req.kv_pool.storage[:, :, req.slots].transpose(2, 3)
