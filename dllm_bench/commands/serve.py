"""`dllm-bench serve`: open-loop serving benchmark of the engine against the baselines, like
`vllm bench serve` (docs/SERVE.md): every system replays the same arrivals under the same memory
budget, each point in a fresh worker process (dllm_bench.serve.run.serve_command)."""
from __future__ import annotations

import sys

import typer

from dllm_bench.commands import budget_flag
from dllm_bench.commands import serve_flags as f
from dllm_bench.serve.run import ServeCommand, serve_command
from dllm_bench.simulate.projection import gpu_projection
from engine.decoding import FIXED


def register(app: typer.Typer) -> None:
    @app.command("serve", context_settings=f.GOODPUT_CONTEXT)
    def serve_cmd(
        ctx: typer.Context,
        rps: f.Rps = None,
        systems: f.Systems = None,
        baseline_batch: f.BaselineBatch = "max-fit",
        dataset: f.Dataset = None,
        dataset_path: f.DatasetPath = None,
        num_prompts: f.NumPrompts = None,
        duration: f.Duration = None,
        burstiness: f.Burstiness = 1.0,
        arrivals: f.Arrivals = None,
        time_scale: f.TimeScale = 1.0,
        burstgpt_model: f.BurstgptModel = None,
        memory_budget: budget_flag.Serve = None,
        model: f.Model = None,
        preset: f.ServePreset = None,
        max_num_batched_tokens: f.MaxNumBatchedTokens = None,
        max_num_logits: f.MaxNumLogits = None,
        max_num_seqs: f.MaxNumSeqs = None,
        retention: f.Retention = None,
        length_scale: f.LengthScale = None,
        gen_cap: f.GenCap = None,
        gen_length: f.GenLength = None,
        block_length: f.BlockLength = None,
        max_prompt_len: f.MaxPromptLen = None,
        threads: f.Threads = None,
        dtype: f.Dtype = None,
        device: f.Device = None,
        cuda_graphs: f.CudaGraphs = None,
        decoding: f.DecodingPolicy = FIXED,
        tensor_parallel_size: f.TensorParallelSize = None,
        trace_steps: f.TraceSteps = False,
        seed: f.Seed = 0,
        repeats: f.Repeats = 1,
        max_duration: f.MaxDuration = None,
        num_warmups: f.NumWarmups = 1,
        max_concurrency: f.MaxConcurrency = None,
        goodput: f.Goodput = None,
        percentile_metrics: f.PercentileMetrics = None,
        metric_percentiles: f.MetricPercentiles = None,
        result_dir: f.ResultDir = None,
        run_id: f.RunId = None,
        resume: f.Resume = False,
        no_profile_cache: f.NoProfileCache = False,
        as_json: f.AsJson = False,
        no_projection: f.NoProjection = False,
        endpoint: f.Endpoint = None,
        endpoint_model: f.EndpointModel = None,
        api: f.Api = "completions",
        stream: f.Stream = True,
        dllm_extras: f.DllmExtras = True,
        api_key: f.ApiKey = None,
    ) -> None:
        """Open-loop serving benchmark: every system replays the same arrivals under the same memory budget."""
        goodput = f.goodput_pairs(ctx, goodput)
        code = serve_command(ServeCommand.pick(locals()), projection=gpu_projection)
        if code:
            sys.exit(code)  # not typer.Exit: with standalone_mode=False click returns its code unused
