"""`make bench-engine`: engine throughput against the plain reference sampler, from one run.

Shape (fixed unless overridden): a random-weight preset in float32, 8 prompts of 64 tokens,
gen 64, block 16, steps 64 (one token per step), greedy. The reference sampler (LLaDA's
`generate`, engine.reference.reference_generate) decodes the prompts one after another; the engine decodes them
concurrently with cache=none (exact: its tokens must equal the reference's), dual (Fast-dLLM)
and sparse (dLLM-Serve). Ratios are generated tokens/s over the reference's.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch
from rich.console import Console
from rich.table import Table

from dllm_bench.checkpoints.load import load_model
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.reference import reference_generate


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--retention", type=float, default=0.5)
    # One thread by default: at this model size intra-op threads only add synchronisation, and on
    # a shared (loaded) machine two spinning OpenMP threads made the reference ~30x slower.
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    model = load_model(a.preset, "float32", "cpu")
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    hi = min(cfg.mask_token_id, cfg.eos_token_id, cfg.padded_vocab)
    prompts = [torch.randint(0, hi, (a.prompt_len,), generator=g).tolist() for _ in range(a.prompts)]
    params = SamplingParams(gen_length=a.gen, steps=a.steps, block_length=a.block)
    n_tokens = a.prompts * a.gen

    # Warm-up (RoPE tables, allocator, lazy imports) outside every timing.
    reference_generate(model, prompts[0], SamplingParams(gen_length=a.block, steps=2, block_length=a.block))

    t = time.perf_counter()
    ref = [reference_generate(model, p, params) for p in prompts]
    ref_s = time.perf_counter() - t
    ref_tokens = [r[0] for r in ref]
    rows = [("reference, sequential", ref_s, sum(r[1] for r in ref), "-")]

    for cache in ("none", "dual", "sparse"):
        eng = LLMEngine(EngineConfig(cache=cache, retention=a.retention, attention_backend="sdpa", device="cpu",
                                     max_num_batched_tokens=max(8192, a.prompts * (a.prompt_len + a.gen)),
                                     max_num_seqs=a.prompts), model=model)
        t = time.perf_counter()
        outs = eng.generate(prompts, params)
        secs = time.perf_counter() - t
        same = sum(o.token_ids == r for o, r in zip(outs, ref_tokens, strict=True))
        if cache == "none" and same != len(prompts):
            raise SystemExit(f"cache=none differs from the reference on {len(prompts) - same} prompts")
        label = {"none": "engine none (exact)", "dual": "engine dual",
                 "sparse": f"engine sparse r={a.retention}"}[cache]
        rows.append((label, secs, eng.counters["forwards"], f"{same}/{len(prompts)}"))

    table = Table(title=f"bench-engine: {a.preset} float32 random weights, {a.prompts} prompts x {a.prompt_len} "
                        f"tokens, gen {a.gen}, block {a.block}, steps {a.steps}, greedy")
    for col in ("system", "wall s", "tokens/s", "vs ref", "forwards", "= ref"):
        table.add_column(col, justify="left" if col == "system" else "right")
    for label, secs, fwd, same in rows:
        table.add_row(label, f"{secs:.2f}", f"{n_tokens / secs:.1f}", f"{ref_s / secs:.2f}x", str(fwd), same)
    console = Console()
    console.print(table)
    console.print("forwards: the reference's are per request (NFE); the engine's are batched steps. "
                  "= ref: requests whose tokens equal the reference's (required for none).")
    console.print(f"hardware: {cpu_name()} ({os.cpu_count()} logical CPUs), "
                  f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, "
                  f"model d={cfg.d_model} layers={cfg.n_layers} heads={cfg.n_heads}/{cfg.kv_heads} vocab={cfg.padded_vocab}")


if __name__ == "__main__":
    main()
