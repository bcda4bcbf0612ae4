"""The engine against the machine: FLOPs counted from step shapes, the matmul peak measured in the
same process, host overhead with a near-zero model, and operator calls per step.

Used by `make bench-engine` (benchmarks/bench_engine.py); every function returns plain numbers.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from dispatch_count import OpCounter, SyncCounter

import engine.runner as runner_module
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.models import DenseLM, ModelConfig, build_model
from engine.request import Phase


def matmul_peak(dtype: torch.dtype, sizes=(256, 512, 1024), seconds: float = 1.0) -> float:
    """FLOP/s of the best n x n x n GEMM in `dtype` at the current thread count, called as the
    model calls its weights (`F.linear`, x Wᵀ: a CPU without native bf16 runs another kernel for
    a plain a @ b); the best over sizes and repeats."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        t_end = time.perf_counter() + seconds
        while True:
            t = time.perf_counter()
            F.linear(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - t))
            if time.perf_counter() > t_end:
                break
    return best


def layer_flops(cfg: ModelConfig, n_q: int, n_k: int) -> float:
    """One request's forward over all layers: GEMMs for n_q tokens plus attention over n_k keys."""
    d, hd = cfg.d_model, cfg.head_dim
    gemm = 2 * n_q * (d * cfg.n_heads * hd + 2 * d * cfg.kv_heads * hd + d * d + 3 * d * cfg.mlp_hidden_size)
    attn = 4 * n_q * n_k * cfg.n_heads * hd
    return cfg.n_layers * (gemm + attn)


def keys_of(req, phase: Phase, cache: str) -> int:
    if phase is not Phase.REUSE:
        return req.length
    return req.length if cache == "dual" else req.kv_tokens     # sparse: retained + the block's slots


class PhaseClock:
    """Wraps an engine's model: time and FLOPs of the layers per phase (steps are phase-pure when
    every request arrives at once with one shape) and of the LM head."""

    def __init__(self, eng: LLMEngine):
        self.eng, self.cfg = eng, eng.model.config
        self.time: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)
        self._phase = "refresh"
        run, hidden, head = eng.runner.run, eng.model.hidden_states, eng.model.lm_head

        def run_(batch):
            refresh = [p.is_refresh for _, p in batch]
            self._phase = "refresh" if all(refresh) else "reuse" if not any(refresh) else "mixed"
            f = sum(layer_flops(self.cfg, r.length if p.is_refresh else r.params.block_length,
                                keys_of(r, p, r.cache)) for r, p in batch)
            self.flops[self._phase] += f
            return run(batch)

        def hidden_(*a, **k):
            t = time.perf_counter()
            out = hidden(*a, **k)
            self.time[self._phase] += time.perf_counter() - t
            return out

        def head_(h):
            t = time.perf_counter()
            out = head(h)
            self.time["lm_head"] += time.perf_counter() - t
            self.flops["lm_head"] += 2 * h.shape[0] * self.cfg.d_model * self.cfg.padded_vocab
            return out

        eng.runner.run, eng.model.hidden_states, eng.model.lm_head = run_, hidden_, head_

    def restore(self) -> None:
        for name in ("hidden_states", "lm_head"):
            self.eng.model.__dict__.pop(name, None)


def saturation(model: DenseLM, cache: str, prompts, params: SamplingParams, peak: float) -> dict:
    """Every prompt at once (phase-pure steps): tokens/s, achieved FLOP/s and MFU, per phase."""
    eng = LLMEngine(EngineConfig(cache=cache, attention_backend="sdpa", device="cpu", sampling=False,
                                 max_num_batched_tokens=len(prompts) * (len(prompts[0]) + params.gen_length),
                                 max_num_seqs=len(prompts)), model=model)
    clock = PhaseClock(eng)
    try:
        t = time.perf_counter()
        eng.generate(prompts, params)
        wall = time.perf_counter() - t
    finally:
        clock.restore()
    total = sum(clock.flops.values())
    out = dict(wall=wall, tokens_per_s=len(prompts) * params.gen_length / wall, flops=total,
               mfu=total / wall / peak)
    for ph in ("refresh", "reuse", "lm_head"):
        if clock.time.get(ph):
            out[f"mfu_{ph}"] = clock.flops[ph] / clock.time[ph] / peak
    return out


def near_zero_model(n_layers: int = 32) -> DenseLM:
    """LLaDA-8B's layer count with d = 8 and a 64-token vocabulary: the math is negligible, what is
    left is host work. (The LM head's argmax and softmax run over rows x vocabulary elements, a
    GPU kernel's work that does not shrink with d: at 512 tokens they were ~0.4 ms of the step's
    CPU time at 64 requests.)"""
    cfg = ModelConfig(d_model=8, n_heads=2, n_kv_heads=1, n_layers=n_layers, mlp_hidden_size=16, vocab_size=64,
                      embedding_size=64, mask_token_id=63, eos_token_id=62, pad_token_id=62)
    return build_model(cfg).eval()


def staggered_steps(model: DenseLM, cache: str, n: int, measure: int = 32, count_ops: bool = False,
                    explain: bool = False):
    """n requests in 8 arrival waves (so every step mixes phases), then `measure` steps timed in
    CPU time of this thread (`time.thread_time`: with one torch thread all the step's work runs
    here, and time slices lost to other processes on a shared machine are not counted):
    [(total s, layers s, LM head + decode s, ops, host syncs, graph breaks)] per step; with
    `count_ops` the operator calls and host syncs are counted instead of time, with `explain`
    torch.compile's graph breaks in the step's model forward (TorchDynamo, nothing run)."""
    eng = LLMEngine(EngineConfig(cache=cache, attention_backend="sdpa", device="cpu", sampling=False,
                                 max_num_batched_tokens=1 << 20, max_num_seqs=max(n, 1)), model=model)
    params = SamplingParams(gen_length=64, steps=64, block_length=8)
    g = torch.Generator().manual_seed(n)
    waves = [n // 8 + (1 if i < n % 8 else 0) for i in range(8)]
    spent = {"layers": 0.0, "decode": 0.0}
    clock = time.thread_time

    def timed(fn, key):
        def wrapper(*a, **k):
            t = clock()
            out = fn(*a, **k)
            spent[key] += clock() - t
            return out
        return wrapper

    decode = runner_module.decode_rows
    if not explain:                  # a timer in the forward would itself be a graph break
        eng.model.hidden_states = timed(eng.model.hidden_states, "layers")
        runner_module.decode_rows = timed(decode, "decode")
    try:
        for w in waves:
            for _ in range(w):
                eng.add_request(torch.randint(0, 60, (64,), generator=g).tolist(), params)
            eng.step()
        rows = []
        for _ in range(measure):
            spent["layers"] = spent["decode"] = 0.0
            if explain:
                breaks = _graph_breaks(eng)
                eng.step()
                rows.append((0.0, 0.0, 0.0, 0, 0, breaks))
            elif count_ops:
                with OpCounter() as c:
                    eng.step()
                with SyncCounter() as s:
                    eng.step()
                rows.append((0.0, 0.0, 0.0, c.total, s.total, 0))
            else:
                t = clock()
                eng.step()
                rows.append((clock() - t, spent["layers"], spent["decode"], 0, 0, 0))
    finally:
        eng.model.__dict__.pop("hidden_states", None)
        runner_module.decode_rows = decode
    return rows


def host_overhead(cache: str, sizes=(1, 8, 32, 64), measure: int = 32) -> dict[int, dict]:
    """Median over `measure` steps per size: the step, its layers, and everything else (of which
    the LM head and the logit decode: math on the candidate rows, not bookkeeping)."""
    model = near_zero_model()
    out = {}
    for n in sizes:
        rows = staggered_steps(model, cache, n, measure)
        med = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
        out[n] = dict(step_ms=med(r[0] for r in rows), layers_ms=med(r[1] for r in rows),
                      other_ms=med(r[0] - r[1] for r in rows), decode_ms=med(r[2] for r in rows),
                      bookkeeping_ms=med(r[0] - r[1] - r[2] for r in rows))
    return out


def op_counts(cache: str, sizes=(1, 8, 64)) -> dict[int, tuple[int, int]]:
    """(operator calls, host syncs) of the busiest step at each size."""
    model = near_zero_model()
    out = {}
    for n in sizes:
        rows = staggered_steps(model, cache, n, measure=8, count_ops=True)
        out[n] = (max(r[3] for r in rows), max(r[4] for r in rows))
    return out


def graph_breaks(cache: str, n: int = 8, layers: int = 4) -> int:
    """Graph breaks TorchDynamo finds in the model forward of `n` staggered requests' steps
    (mixed phases and Reuse-only ones), summed."""
    rows = staggered_steps(near_zero_model(layers), cache, n, measure=8, explain=True)
    return sum(r[5] for r in rows)


def _graph_breaks(eng: LLMEngine) -> int:
    # Scheduling twice before a step gives the same batch: the first call's admissions are
    # running requests in the second, with the same phases and costs.
    batch = eng.scheduler.schedule(time.perf_counter())
    if not batch:
        return 0
    p = eng.runner.prepare(batch)
    saved = eng.pool.storage.clone()
    torch._dynamo.reset()
    with torch.no_grad():
        breaks = torch._dynamo.explain(eng.runner.forward)(p).graph_break_count
    eng.pool.storage.copy_(saved)
    return breaks
