"""`make bench-mechanisms`: the dLLM-Serve mechanisms measured, as ratios from one run.

1. Peak activation memory of a Refresh step with the token budget full (mini-126k: LLaDA's
   vocabulary and head size), logit budget vs monolithic logits.
2. KV capacity: at one memory budget, requests the logit-aware profile admits vs a monolithic
   profile (paper Fig 2).
3. Reuse-step attention at retention 0.1 vs dense Reuse, 2048 context tokens, LLaDA-8B's
   32 heads x 128.
4. Scheduler and bookkeeping share of step time at 32 concurrent requests.
The run directory (kind bench-mechanisms, benchmarks/bench_result.py) holds every figure; the
summary table is printed from it.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import bench_result
import torch
from rich.console import Console

from dllm_bench.checkpoints.load import load_model
from dllm_bench.profiling.run import requests_that_fit
from engine import EngineConfig, LLMEngine, SamplingParams
from engine import logits as logits_mod
from engine.attention import padded_attention
from engine.kv_cache import retained_tokens
from engine.profiler import profile_kv_pool

GiB = 2**30


def bench_memory(model, tokens: int, budget: int, max_model_len: int, logit_rows: int) -> dict:
    out = {}
    for label, rows in (("budgeted", logit_rows), ("monolithic", None)):
        cfg = EngineConfig(memory_budget=budget, max_num_batched_tokens=tokens, max_num_logits=rows,
                           max_num_seqs=256, max_model_len=max_model_len, cache="sparse", sampling=False)
        t = time.perf_counter()
        p = profile_kv_pool(model, cfg, "sdpa", max_model_len)
        out[label] = dict(refresh_peak=p.refresh_peak_bytes, activation_peak=p.activation_peak_bytes,
                          kv_pool_tokens=p.kv_pool_tokens, fit=requests_that_fit(p, 256, 256, 32, capped=False),
                          seconds=time.perf_counter() - t)
    return out


def bench_reuse_attention(context: int = 2048, block: int = 32, heads: int = 32, head_dim: int = 128,
                          requests: int = 8, retention: float = 0.1, reps: int = 20) -> dict:
    """Each request's block queries over its context and block keys, through the engine's padded SDPA."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(requests, block, heads, head_dim, generator=g)
    res = {}
    for label, n_ctx in (("dense", context), ("sparse", retained_tokens(context, retention))):
        keys = torch.randn(requests, n_ctx + block, heads, head_dim, generator=g)
        vals = torch.randn(requests, n_ctx + block, heads, head_dim, generator=g)
        padded_attention(q, keys, vals, None)  # warm-up
        t = time.perf_counter()
        for _ in range(reps):
            padded_attention(q, keys, vals, None)
        res[label] = (time.perf_counter() - t) / reps
    return res | dict(context=context, requests=requests, retention=retention, block=block, reps=reps)


def bench_bookkeeping(model, concurrent: int = 32, prompt: int = 64, gen: int = 64, block: int = 16, steps: int = 40) -> dict:
    compute, calls = [0.0], {"forward": 0, "decode": 0}

    def timed(fn, name):
        def wrapper(*a, **k):
            calls[name] += 1
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                compute[0] += time.perf_counter() - t
        return wrapper

    # The model's forward and the logits decode are the compute; everything else in a step is
    # the scheduler's and the bookkeeping's. The runner binds its decode when it is built (a
    # model's own `decode_rows` first), so both are wrapped on the model before the engine exists.
    model.hidden_states = timed(model.hidden_states, "forward")
    model.decode_rows = timed(logits_mod.decode_rows, "decode")
    try:
        eng = LLMEngine(EngineConfig(cache="sparse", retention=0.5, max_num_batched_tokens=16384,
                                     max_num_seqs=concurrent, max_num_logits=1024, sampling=False), model=model)
        sp = SamplingParams(gen_length=gen, steps=gen, block_length=block)
        g = torch.Generator().manual_seed(0)
        for _ in range(concurrent):
            eng.add_request(torch.randint(0, min(1000, model.config.vocab_size), (prompt,), generator=g).tolist(), sp)
        eng.step()  # warm-up
        compute[0], calls["forward"], calls["decode"] = 0.0, 0, 0
        t = time.perf_counter()
        for _ in range(steps):
            eng.step()
        total = time.perf_counter() - t
    finally:
        del model.hidden_states, model.decode_rows
    if not all(calls.values()):
        raise RuntimeError(f"a timing hook was never called ({calls}): the engine's compute moved elsewhere")
    return dict(total=total, compute=compute[0], bookkeeping=total - compute[0], steps=steps, requests=concurrent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mini-126k")
    ap.add_argument("--tokens", type=int, default=8192, help="query tokens in the worst step")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--logit-rows", type=int, default=1024)
    ap.add_argument("--budget-gib", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print every figure as one JSON document")
    bench_result.add_arguments(ap)
    args = ap.parse_args()
    bench_result.check(args)
    torch.set_num_threads(args.threads)
    con = Console(stderr=True)
    model = load_model(args.model, "float32", "cpu")
    con.print(f"[bold]bench-mechanisms[/bold] · {args.model} · {platform.processor() or platform.machine()} · "
              f"{torch.get_num_threads()} threads · torch {torch.__version__}")
    con.print("1-2. profiling the worst Refresh/Reuse steps (budgeted, then monolithic) ...")
    mem = bench_memory(model, args.tokens, int(args.budget_gib * GiB), args.max_model_len, args.logit_rows)
    con.print("3. Reuse attention, 2048 context tokens ...")
    att = bench_reuse_attention()
    con.print("4. scheduler/bookkeeping at 32 concurrent requests ...")
    bk = bench_bookkeeping(model)
    summary = dict(memory=mem, reuse_attention=att, bookkeeping=bk)
    config = {k: getattr(args, k) for k in ("model", "tokens", "max_model_len", "logit_rows", "budget_gib", "threads")}
    bench_result.save("bench-mechanisms", args, config, summary)
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
