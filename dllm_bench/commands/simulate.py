"""`dllm-bench simulate`: `serve`'s options, replayed on a hardware profile by the real schedulers
with a cost model as the forward (docs/SIMULATE.md). `--paper NAME` replays one of the paper's
experiments and prints published vs simulated numbers with the error of each cell; `--fit` fits
a profile to measured runs (dllm_bench.simulate.command.simulate)."""
from __future__ import annotations

import sys

import typer

from dllm_bench.commands import budget_flag
from dllm_bench.commands import serve_flags as f
from dllm_bench.commands import simulate_flags as s
from dllm_bench.simulate.command import SimulateOptions, simulate
from engine.decoding import FIXED


def register(app: typer.Typer) -> None:

    @app.command("simulate", context_settings=f.GOODPUT_CONTEXT)
    def simulate_cmd(
        ctx: typer.Context,
        hardware: s.Hardware = None,
        impl: s.Impl = None,
        paper: s.Paper = None,
        paper_prompt_len: s.PaperPromptLen = None,
        paper_batch: s.PaperBatch = None,
        rps: s.Rps = None,
        systems: f.Systems = None,
        baseline_batch: f.BaselineBatch = "max-fit",
        dataset: s.Dataset = None,
        num_prompts: f.NumPrompts = None,
        duration: f.Duration = None,
        burstiness: f.Burstiness = 1.0,
        memory_budget: budget_flag.Simulate = None,
        model: s.Model = None,
        preset: f.Preset = None,
        max_num_batched_tokens: f.MaxNumBatchedTokens = None,
        max_num_logits: f.MaxNumLogits = None,
        max_num_seqs: f.MaxNumSeqs = None,
        retention: f.Retention = None,
        length_scale: f.LengthScale = None,
        gen_cap: f.GenCap = None,
        gen_length: f.GenLength = None,
        block_length: f.BlockLength = None,
        dtype: s.Dtype = None,
        seed: f.Seed = 0,
        repeats: s.Repeats = 1,
        max_duration: s.MaxDuration = None,
        max_concurrency: f.MaxConcurrency = None,
        decoding: f.DecodingPolicy = FIXED,
        steps_per_block: s.StepsPerBlock = None,
        goodput: f.Goodput = None,
        percentile_metrics: f.PercentileMetrics = None,
        metric_percentiles: f.MetricPercentiles = None,
        result_dir: f.ResultDir = None,
        run_id: f.RunId = None,
        as_json: f.AsJson = False,
        tensor_parallel_size: f.TensorParallelSize = None,
        cuda_graphs: f.CudaGraphs = None,
        validate_runs: s.Validate = None,
        fit_runs: s.Fit = None,
        name: s.Name = None,
        out: s.Out = None,
        fit_evidence: s.FitEvidence = "auto",
        leave_one_out: s.LeaveOneOut = True,
    ) -> None:
        """Simulate `serve` on a hardware profile: the real schedulers, a calibrated cost model."""
        goodput = f.goodput_pairs(ctx, goodput)
        code = simulate(SimulateOptions.pick(locals()))
        if code:
            sys.exit(code)
