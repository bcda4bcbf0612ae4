"""The flags of a serving run, declared once for `serve`, `simulate`, `ablate`, `sweep` (and the
ones `server` shares: --dtype, --device, --cuda-graphs, --tensor-parallel-size).

Each alias is a parameter type with its Typer option (`num_prompts: f.NumPrompts = None`); the
parameter names are ServeOptions' field names, so a command builds its options with
`ServeOptions.pick(locals())`. A command whose default or help differs in meaning (ablate's
saturation `--rps inf`, simulate's GPU budget: commands/simulate_flags.py) declares that flag
itself.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dllm_bench.errors import UserError
from dllm_bench.serve.presets import DEFAULT_PRESET, GPU_PRESET, PRESETS

Systems = Annotated[str | None, typer.Option(
    "--systems", help="systems and variants: engine,fast-dllm,dllm-cache,sparse-dllm (default), llada; "
    "variants name[:k=v,...] e.g. 'engine:cache=dual,fast-dllm:batch=1' (batch=upstream: the batch its "
    "upstream code runs)")]
BaselineBatch = Annotated[str, typer.Option(
    "--baseline-batch", help="baselines without batch=: max-fit (largest static batch in the budget), "
    "upstream (the batch their upstream code runs: Fast-dLLM 1, Sparse-dLLM 1, dLLM-Cache 2), or both side by side")]
Rps = Annotated[str | None, typer.Option(
    "--rps", "--request-rate",
    help="arrival rate(s), req/s: 0.5, or a sweep 0.1,0.25,0.5,1.0; inf = all at t=0 [preset: 0.5]")]
Dataset = Annotated[str | None, typer.Option(
    "--dataset", "--dataset-name", help="livebench | osc | burstgpt | random, or a list livebench,osc,burstgpt")]
DatasetPath = Annotated[Path | None, typer.Option("--dataset-path", help="replay a BurstGPT CSV or a JSONL file")]
Arrivals = Annotated[str | None, typer.Option(
    "--arrivals", help="poisson | gamma | trace (default: poisson, gamma if --burstiness != 1)")]
TimeScale = Annotated[float, typer.Option("--time-scale", help="trace replay speed-up (60 = a minute per second)")]
BurstgptModel = Annotated[str | None, typer.Option(
    "--burstgpt-model", help="BurstGPT CSV rows of one model: ChatGPT | GPT-4")]
NumPrompts = Annotated[int | None, typer.Option("--num-prompts", help="requests per point [preset]")]
Duration = Annotated[float | None, typer.Option("--duration", help="bound arrivals by time (s) instead of count")]
Burstiness = Annotated[float, typer.Option("--burstiness", help="gamma shape: 1 = Poisson, < 1 burstier")]
Model = Annotated[str | None, typer.Option(
    "--model", help="model preset (dllm-bench models list) or LLaDA checkpoint dir [preset]")]
Preset = Annotated[str | None, typer.Option(
    "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET}, or the one for --model)")]
ServePreset = Annotated[str | None, typer.Option(
    "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET}, or the one for --model; "
    f"a checkpoint dir on CUDA: {GPU_PRESET})")]
MaxNumBatchedTokens = Annotated[int | None, typer.Option(
    "--max-num-batched-tokens", help="engine token budget per step [preset; paper: scaled with the GPU]")]
MaxNumLogits = Annotated[str | None, typer.Option(
    "--max-num-logits", help="engine logit budget (rows per step), or none [preset; paper: max-num-seqs x block]")]
MaxNumSeqs = Annotated[int | None, typer.Option("--max-num-seqs", help="engine max concurrent requests [preset]")]
Retention = Annotated[float | None, typer.Option(
    "--retention", help="sparse KV retention (engine and sparse-dllm keep_ratio) [preset]")]
LengthScale = Annotated[float | None, typer.Option("--length-scale", help="multiply dataset token counts [preset]")]
GenCap = Annotated[int | None, typer.Option("--gen-cap", help="max gen_length in tokens [preset]")]
GenLength = Annotated[int | None, typer.Option(
    "--gen-length", help="one output length for every request (the paper's 256), a block multiple [preset]")]
BlockLength = Annotated[int | None, typer.Option("--block-length", help="diffusion block length [preset]")]
MaxPromptLen = Annotated[int | None, typer.Option("--max-prompt-len", help="cut prompts to this many tokens")]
Dtype = Annotated[str | None, typer.Option(
    "--dtype", help="float32 | bfloat16 | float16 | float64 [preset; a CPU preset on CUDA: bfloat16]")]
Device = Annotated[str | None, typer.Option("--device", help="cpu | cuda [preset]")]
Threads = Annotated[int | None, typer.Option("--threads", help="torch threads of every system process [preset]")]
Seed = Annotated[int, typer.Option("--seed", help="workload seed (arrivals, lengths, prompt ids)")]
Repeats = Annotated[int, typer.Option(
    "--repeats", help="run every point N times with workload seeds seed, seed+1, ...; tables give median [min-max]")]
MaxDuration = Annotated[float | None, typer.Option(
    "--max-duration", help="abort a point after this many seconds (unfinished requests are counted)")]
NumWarmups = Annotated[int, typer.Option("--num-warmups", help="unmeasured warm-up requests per system")]
NoProfileCache = Annotated[bool, typer.Option("--no-profile-cache", help="re-measure KV pools and static batches")]
# Parallel decoding (dllm_bench.systems.decoding): run by every system that has the rule upstream.
DecodingPolicy = Annotated[str, typer.Option(
    "--decoding", help="fixed (one token per step: the presets' parity mode) | threshold:τ | factor:f | entropy:γ; "
    "the engine runs every policy, Fast-dLLM threshold and factor (its knobs), the other baselines (and Fast-dLLM "
    "under entropy) run fixed, marked")]

# vLLM `bench serve`'s reporting and concurrency flags (docs/SERVE.md).
MaxConcurrency = Annotated[int | None, typer.Option(
    "--max-concurrency", help="at most N requests in flight: arrivals keep their times, one that finds every slot "
    "taken waits for a free one (latencies count from its start; the wait is its client queue time)")]
PercentileMetrics = Annotated[str | None, typer.Option(
    "--percentile-metrics", help="which of ttft,tpot,itl,e2el get percentiles (default: all four)")]
MetricPercentiles = Annotated[str | None, typer.Option(
    "--metric-percentiles", help="the percentiles of those metrics, e.g. 50,90,99 [99]")]
Goodput = Annotated[list[str] | None, typer.Option(
    "--goodput", help="SLOs in ms, e.g. --goodput ttft:500 tpot:50 e2el:3000: goodput = requests meeting every "
    "SLO given, per second (vLLM's)")]
# vLLM's `--goodput ttft:500 e2el:3000` gives several values to one flag, which click has not: a
# command taking it is registered with GOODPUT_CONTEXT and the values after the first arrive as
# extra arguments (goodput_pairs).
GOODPUT_CONTEXT = {"allow_extra_args": True}


def goodput_pairs(ctx: typer.Context, goodput: list[str] | None) -> tuple[str, ...]:
    """--goodput's values, those click left as extra arguments included."""
    if ctx.args and not goodput:
        raise UserError(f"unexpected argument {ctx.args[0]!r}")
    return tuple(goodput or ()) + tuple(ctx.args)
TensorParallelSize = Annotated[int | None, typer.Option(
    "--tensor-parallel-size", "--tp", help="engine: its ranks (heads, MLP, vocabulary split): N GPUs, or on a CPU N "
    "processes sharing --threads; baselines run on one device (docs/PARALLEL.md) [1]")]
CudaGraphs = Annotated[bool | None, typer.Option(
    "--cuda-graphs/--no-cuda-graphs", help="engine: replay Reuse-only steps, padded to batch buckets, as CUDA graphs "
    "[on on CUDA; on a CPU --cuda-graphs runs the same padding with plain calls]")]
TraceSteps = Annotated[bool, typer.Option(
    "--trace-steps", help="write steps.jsonl beside each point's requests.jsonl: one row per forward (wall ms, "
    "phase mix, requests, query rows, key tokens, logit rows, CUDA-graph replay or eager)")]

# The run directory and output of every command that writes a run.
ResultDir = Annotated[Path | None, typer.Option(
    "--result-dir", help="runs root (default results/runs, or $DLLM_BENCH_RESULTS_DIR)")]
RunId = Annotated[str | None, typer.Option("--run-id", help="name of the run directory (default: timestamp-name)")]
Resume = Annotated[bool, typer.Option(
    "--resume", help="continue a run (--run-id, default the latest): skip finished points and repeats")]
AsJson = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]

# `serve` against an OpenAI-compatible server, and its GPU projection (docs/SERVE.md).
NoProjection = Annotated[bool, typer.Option(
    "--no-projection", envvar="DLLM_BENCH_NO_PROJECTION", help="on a CPU, skip the comparison simulated at GPU "
    "scale (paper preset on rtx4090, >= 200 requests) printed under the measured one")]
Endpoint = Annotated[str | None, typer.Option(
    "--endpoint", help="also (without --systems: only) benchmark this OpenAI-compatible server, e.g. "
    "http://127.0.0.1:8000/v1")]
EndpointModel = Annotated[str | None, typer.Option(
    "--endpoint-model", help="model name sent to --endpoint (default: its first model)")]
Api = Annotated[str, typer.Option("--api", help="--endpoint API: completions (token-id prompts) | chat (text)")]
Stream = Annotated[bool, typer.Option("--stream/--no-stream", help="--endpoint: streamed responses (TTFT = first block)")]
DllmExtras = Annotated[bool, typer.Option(
    "--dllm-extras/--no-dllm-extras", help="--endpoint: send block_length, steps, return_token_ids")]
ApiKey = Annotated[str | None, typer.Option(
    "--api-key", help="--endpoint: sent as Authorization: Bearer KEY [$OPENAI_API_KEY]")]
