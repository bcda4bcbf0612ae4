"""`make bench-engine`: the engine's throughput, MFU, host work and operator calls per step.

From one run: generated tokens/s of the engine (cache=none, which must reproduce the reference's
tokens exactly, dual and sparse) over LLaDA's own sampler (baselines.reference_llada) decoding the same
prompts one after another; then (benchmarks/engine_efficiency.py) the sparse engine's MFU at
saturation against this machine's measured matmul peak, host time per step with a near-zero
model, and operator calls, host syncs and torch.compile graph breaks per step. Ratios, not
absolute speeds, are the result. Every figure goes to a run directory (kind bench-engine,
benchmarks/bench_result.py) and the summary table is printed from it. Sections, options and how
to read them: docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import bench_result
import engine_efficiency as eff
import torch
from rich.console import Console
from rich.table import Table

from baselines.reference_llada import reference_generate
from dllm_bench.checkpoints.load import load_model
from dllm_bench.doctor.checks import BF16_CPU_FLAGS, cpu_flags
from engine import EngineConfig, LLMEngine, SamplingParams


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
    # MFU on the scale-similar serving preset (docs/SCALING.md) at its serving shapes: LiveBench-length
    # prompts, 4 blocks of 32, on the serving thread count; `--mfu-preset serve-126k --mfu-prompt-len 64
    # --mfu-gen 32 --mfu-block 8 --mfu-threads 1` is the earlier, LM-head-dominated shape.
    ap.add_argument("--mfu-preset", default="similar-1024")
    ap.add_argument("--mfu-prompts", type=int, default=4)
    ap.add_argument("--mfu-prompt-len", type=int, default=600)
    ap.add_argument("--mfu-gen", type=int, default=128)
    ap.add_argument("--mfu-block", type=int, default=32)
    ap.add_argument("--mfu-threads", type=int, default=2)
    ap.add_argument("--mfu-dtypes", default=None,
                    help="comma list of dtypes for the MFU section (default float32, and bfloat16 where the CPU "
                         "computes it natively: amx_bf16 or avx512_bf16)")
    ap.add_argument("--skip", default="", help="comma list of sections to skip: throughput,mfu,host,ops")
    bench_result.add_arguments(ap)
    a = ap.parse_args()
    bench_result.check(a)
    skip = set(filter(None, a.skip.split(",")))
    # Emulated bf16 runs ~10x slower than float32 and measures the emulation, not the engine.
    a.bf16_native = sorted(cpu_flags() & set(BF16_CPU_FLAGS))
    if a.mfu_dtypes is None:
        a.mfu_dtypes = "float32,bfloat16" if a.bf16_native else "float32"
        if not a.bf16_native:
            print("MFU: bfloat16 skipped (emulated on this CPU: no amx_bf16 or avx512_bf16); "
                  "--mfu-dtypes float32,bfloat16 measures it anyway")
    torch.set_num_threads(a.threads)

    console = Console()
    summary = {}
    if "throughput" not in skip:
        summary["throughput"] = throughput(a, console)
    if "mfu" not in skip:
        torch.set_num_threads(a.mfu_threads)
        summary["mfu"] = mfu(a, console)
        torch.set_num_threads(a.threads)
    if "host" not in skip:
        summary["host"] = host(console)
    if "ops" not in skip:
        summary["ops"] = ops(console)
    console.print(f"hardware: {cpu_name()} ({os.cpu_count()} logical CPUs), torch {torch.__version__}, "
                  f"{torch.get_num_threads()} torch threads")
    config = {k: v for k, v in vars(a).items() if k not in ("result_dir", "run_id")} | {"cpu": cpu_name()}
    bench_result.save("bench-engine", a, config, summary)


def throughput(a, console) -> dict:
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
    engines = []

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
        engines.append(dict(cache=cache, seconds=secs, forwards=eng.counters["forwards"], same=f"{same}/{len(prompts)}"))

    table = Table(title=f"bench-engine: {a.preset} float32 random weights, {a.prompts} prompts x {a.prompt_len} "
                        f"tokens, gen {a.gen}, block {a.block}, steps {a.steps}, greedy")
    for col in ("system", "wall s", "tokens/s", "vs ref", "forwards", "= ref"):
        table.add_column(col, justify="left" if col == "system" else "right")
    for label, secs, fwd, same in rows:
        table.add_row(label, f"{secs:.2f}", f"{n_tokens / secs:.1f}", f"{ref_s / secs:.2f}x", str(fwd), same)
    console.print(table)
    console.print("forwards: the reference's are per request (NFE); the engine's are batched steps. "
                  "= ref: requests whose tokens equal the reference's (required for none). "
                  f"model d={cfg.d_model} layers={cfg.n_layers} heads={cfg.n_heads}/{cfg.kv_heads} vocab={cfg.padded_vocab}")
    return dict(reference_s=ref_s, tokens=n_tokens, engines=engines)


def mfu(a, console) -> dict:
    g = torch.Generator().manual_seed(1)
    params = SamplingParams(gen_length=a.mfu_gen, steps=a.mfu_gen, block_length=a.mfu_block)
    table = Table(title=f"MFU at saturation: {a.mfu_preset}, engine sparse r=0.5, {a.mfu_prompts} requests x "
                        f"{a.mfu_prompt_len} prompt tokens, gen {a.mfu_gen}, block {a.mfu_block}, all at once, "
                        f"{torch.get_num_threads()} threads")
    for col in ("dtype", "matmul peak GFLOP/s", "tokens/s", "GFLOP/s", "MFU", "Refresh", "Reuse", "LM head"):
        table.add_column(col, justify="right")
    tps, peaks, out = {}, {}, {}
    dtypes = [t.strip() for t in a.mfu_dtypes.split(",") if t.strip()]
    for dtype in dtypes:
        model = load_model(a.mfu_preset, dtype, "cpu")
        hi = min(model.config.mask_token_id, model.config.eos_token_id, model.config.padded_vocab)
        prompts = [torch.randint(0, hi, (a.mfu_prompt_len,), generator=g).tolist() for _ in range(a.mfu_prompts)]
        peak = peaks[dtype] = eff.matmul_peak(model.dtype)
        eff.saturation(model, "sparse", prompts[:2], params, peak)            # warm-up
        r = eff.saturation(model, "sparse", prompts, params, peak)
        tps[dtype] = r["tokens_per_s"]
        out[dtype] = r | {"peak": peak}
        pct = lambda k, r=r: f"{100 * r[k]:.1f}%" if k in r else "-"  # noqa: E731
        table.add_row(dtype, f"{peak / 1e9:.1f}", f"{r['tokens_per_s']:.1f}", f"{r['flops'] / r['wall'] / 1e9:.1f}",
                      pct("mfu"), pct("mfu_refresh"), pct("mfu_reuse"), pct("mfu_lm_head"))
    console.print(table)
    if {"bfloat16", "float32"} <= tps.keys():
        # The tokens/s ratio can only reach the ratio of the two GEMM peaks (AMX ~4x, AVX-512 BF16 ~2x).
        console.print(f"bf16 / fp32 tokens/s: {tps['bfloat16'] / tps['float32']:.2f}x "
                      f"(matmul peaks: {peaks['bfloat16'] / peaks['float32']:.2f}x)")
    return out


def host(console) -> dict:
    table = Table(title="host time per step, near-zero model (32 layers, d=8, vocab 64), 8 staggered arrival waves: "
                        "median CPU ms of 32 steps")
    for col in ("cache", "requests", "step", "layers", "everything else", "of which LM head + decode",
                "of which bookkeeping"):
        table.add_column(col, justify="right")
    out = {}
    for cache in ("sparse", "dual"):
        out[cache] = {str(n): r for n, r in eff.host_overhead(cache).items()}
        for n, r in out[cache].items():
            table.add_row(cache, str(n), f"{r['step_ms']:.2f}", f"{r['layers_ms']:.2f}", f"{r['other_ms']:.2f}",
                          f"{r['decode_ms']:.2f}", f"{r['bookkeeping_ms']:.2f}")
    console.print(table)
    console.print("everything else = step - layers: scheduling, packing and index building, LM head and logit "
                  "decode, commit, cursor and cache bookkeeping; bookkeeping = everything else - LM head + decode")
    return out


def ops(console) -> dict:
    table = Table(title="per step (busiest step), near-zero model, mixed phases: torch operator calls, host syncs; "
                        "graph breaks of the step forward under torch.compile")
    for col in ("cache", "ops: 1 request", "8", "64", "64 / 1", "64 / 8", "syncs: 1", "8", "64", "graph breaks"):
        table.add_column(col, justify="right")
    out = {}
    for cache in ("sparse", "dual"):
        c = eff.op_counts(cache)
        ops_, syncs = {n: v[0] for n, v in c.items()}, {n: v[1] for n, v in c.items()}
        breaks = eff.graph_breaks(cache)
        out[cache] = dict(ops={str(n): v for n, v in ops_.items()}, syncs={str(n): v for n, v in syncs.items()},
                          graph_breaks=breaks)
        table.add_row(cache, str(ops_[1]), str(ops_[8]), str(ops_[64]), f"{ops_[64] / ops_[1]:.2f}",
                      f"{ops_[64] / ops_[8]:.2f}", str(syncs[1]), str(syncs[8]), str(syncs[64]), str(breaks))
    console.print(table)
    console.print("host syncs: device values read on the host (item, nonzero, boolean masks, copies to the host); "
                  "the engine reads its commit decisions back once per step. Graph breaks: TorchDynamo over the "
                  "model forward of every step of 8 staggered requests (Refresh, Reuse-only and mixed steps).")
    return out


if __name__ == "__main__":
    main()
