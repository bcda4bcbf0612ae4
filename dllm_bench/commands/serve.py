"""`dllm-bench serve`: open-loop serving benchmark of the engine against the baselines, like
`vllm bench serve` (docs/SERVE.md).

The options (dllm_bench.serve.options.ServeOptions) are resolved into a ServeRun (resolve_run); the workload is
built once per (dataset, rps) from the seed, and every system then replays exactly that arrival
sequence against exactly the same memory budget, one system after another, each in a fresh
worker process (dllm_bench.serve.run.serve, dllm_bench.serve.points.measure_points).
"""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from dllm_bench import inputs
from dllm_bench.commands.serve_flags import (
    GOODPUT_CONTEXT,
    AsJson,
    BaselineBatch,
    BlockLength,
    Burstiness,
    CudaGraphs,
    DecodingPolicy,
    Duration,
    GenCap,
    GenLength,
    Goodput,
    LengthScale,
    MaxConcurrency,
    MaxDuration,
    MaxNumBatchedTokens,
    MaxNumLogits,
    MaxNumSeqs,
    MetricPercentiles,
    Model,
    NoProfileCache,
    NumPrompts,
    NumWarmups,
    PercentileMetrics,
    Repeats,
    ResultDir,
    Resume,
    Retention,
    RunId,
    Seed,
    Systems,
    TensorParallelSize,
    Threads,
    TraceSteps,
    goodput_pairs,
)
from dllm_bench.errors import UserError
from dllm_bench.serve.endpoint import endpoint_api_key, resolve_endpoint
from dllm_bench.serve.options import ServeOptions, resolve_run
from dllm_bench.serve.presets import DEFAULT_PRESET, GPU_PRESET, PRESETS
from dllm_bench.serve.run import serve
from dllm_bench.simulate.projection import gpu_projection


# ---------------------------------------------------------------- the command
def register(app: typer.Typer) -> None:
    @app.command("serve", context_settings=GOODPUT_CONTEXT)
    def serve_cmd(
        ctx: typer.Context,
        rps: str | None = typer.Option(None, "--rps", "--request-rate",
                                       help="arrival rate(s), req/s: 0.5, or a sweep 0.1,0.25,0.5,1.0; inf = all at t=0 [preset: 0.5]"),
        systems: Systems = None,
        baseline_batch: BaselineBatch = "max-fit",
        dataset: str | None = typer.Option(None, "--dataset", "--dataset-name",
                                           help="livebench | osc | burstgpt | random, or a list livebench,osc,burstgpt"),
        dataset_path: Path | None = typer.Option(None, "--dataset-path", help="replay a BurstGPT CSV or a JSONL file"),
        num_prompts: NumPrompts = None,
        duration: Duration = None,
        burstiness: Burstiness = 1.0,
        arrivals: str | None = typer.Option(None, "--arrivals", help="poisson | gamma | trace (default: poisson, gamma if --burstiness != 1)"),
        time_scale: float = typer.Option(1.0, "--time-scale", help="trace replay speed-up (60 = a minute per second)"),
        burstgpt_model: str | None = typer.Option(None, "--burstgpt-model", help="BurstGPT CSV rows of one model: ChatGPT | GPT-4"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV of every system, e.g. 1GiB, 512MiB, 2.5GB; auto = free GPU "
                                                 "memory x 0.9 measured once at the start (CUDA only: a CPU run needs a size) [preset, else auto]"),
        model: Model = None,
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET}, or the one for --model; "
                                                  f"a checkpoint dir on CUDA: {GPU_PRESET})"),
        max_num_batched_tokens: MaxNumBatchedTokens = None,
        max_num_logits: MaxNumLogits = None,
        max_num_seqs: MaxNumSeqs = None,
        retention: Retention = None,
        length_scale: LengthScale = None,
        gen_cap: GenCap = None,
        gen_length: GenLength = None,
        block_length: BlockLength = None,
        max_prompt_len: int | None = typer.Option(None, "--max-prompt-len", help="cut prompts to this many tokens"),
        threads: Threads = None,
        dtype: str | None = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 | float64 [preset; a CPU preset on CUDA: bfloat16]"),
        device: str | None = typer.Option(None, "--device", help="cpu | cuda [preset]"),
        cuda_graphs: CudaGraphs = None,
        decoding: DecodingPolicy = "fixed",
        tensor_parallel_size: TensorParallelSize = None,
        trace_steps: TraceSteps = False,
        seed: Seed = 0,
        repeats: Repeats = 1,
        max_duration: MaxDuration = None,
        num_warmups: NumWarmups = 1,
        max_concurrency: MaxConcurrency = None,
        goodput: Goodput = None,
        percentile_metrics: PercentileMetrics = None,
        metric_percentiles: MetricPercentiles = None,
        result_dir: ResultDir = None,
        run_id: RunId = None,
        resume: Resume = False,
        no_profile_cache: NoProfileCache = False,
        as_json: AsJson = False,
        no_projection: bool = typer.Option(False, "--no-projection", envvar="DLLM_BENCH_NO_PROJECTION",
                                           help="on a CPU, skip the comparison simulated at GPU scale (paper preset "
                                           "on rtx4090, >= 200 requests) printed under the measured one"),
        endpoint: str | None = typer.Option(None, "--endpoint", help="also (without --systems: only) benchmark this OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1"),
        endpoint_model: str | None = typer.Option(None, "--endpoint-model", help="model name sent to --endpoint (default: its first model)"),
        api: str = typer.Option("completions", "--api", help="--endpoint API: completions (token-id prompts) | chat (text)"),
        stream: bool = typer.Option(True, "--stream/--no-stream", help="--endpoint: streamed responses (TTFT = first block)"),
        dllm_extras: bool = typer.Option(True, "--dllm-extras/--no-dllm-extras", help="--endpoint: send block_length, steps, return_token_ids"),
        api_key: str | None = typer.Option(None, "--api-key", help="--endpoint: sent as Authorization: Bearer KEY [$OPENAI_API_KEY]"),
    ) -> None:
        """Open-loop serving benchmark: every system replays the same arrivals under the same memory budget."""
        goodput = goodput_pairs(ctx, goodput)
        if api_key is not None and endpoint is None:
            raise UserError("--api-key is what serve sends to --endpoint: give --endpoint too")
        ep, key = None, endpoint_api_key(api_key)
        if endpoint is not None:
            ep, model = resolve_endpoint(endpoint, endpoint_model, api, stream, dllm_extras, model, api_key=key)
        result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
        run = resolve_run(ServeOptions.pick(locals()))
        if ep is not None:
            run.systems = (run.systems if systems is not None else []) + [ep.variant()]
            run.api_key = key
        code = serve(run, result_dir=result_dir, run_id=run_id, resume=resume, as_json=as_json,
                     projection=None if no_projection else gpu_projection)
        if code:
            sys.exit(code)  # not typer.Exit: with standalone_mode=False click returns its code unused
