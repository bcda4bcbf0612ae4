"""`dllm-bench ablate`: the paper's Fig. 8 ablation ladder (Sparse-dLLM -> + inference engine ->
+ phase-multiplexed scheduler -> + logit-aware budgeting) and the full engine under each cache
policy, on the same arrivals and memory budget (dllm_bench.ablate.run.ablate, docs/ABLATE.md).

Throughput is measured at saturation by default (`--rps inf`: every request arrives at t=0, so
a system's output tokens / makespan is its capacity, not the offered load). Each point runs in
a fresh worker process like `serve`; the run directory has serve's layout (kind "ablate") plus
plots/fig8_ablation.png and plots/cache_policies.png. Tables go to stderr; `--json` prints one
JSON document on stdout.
"""
from __future__ import annotations

import sys

import typer

from dllm_bench import inputs
from dllm_bench.ablate.run import ablate
from dllm_bench.commands import budget_flag
from dllm_bench.commands.serve_flags import (
    AsJson,
    CudaGraphs,
    GenLength,
    MaxDuration,
    Model,
    NoProfileCache,
    NumWarmups,
    Preset,
    Repeats,
    ResultDir,
    Resume,
    RunId,
    Seed,
    TensorParallelSize,
    Threads,
    TraceSteps,
)
from dllm_bench.serve.options import ServeOptions


def register(app: typer.Typer) -> None:
    @app.command("ablate")
    def ablate_cmd(
        datasets: str | None = typer.Option(None, "--datasets", "--dataset",
                                            help="comma list of livebench, osc, burstgpt (default: all three)"),
        num_prompts: int | None = typer.Option(None, "--num-prompts",
                                               help="requests per dataset (default: cpu-default 3, serve-126k 8; other presets: the serve preset's)"),
        model: Model = None,
        memory_budget: budget_flag.Serve = None,
        seed: Seed = 0,
        repeats: Repeats = 1,
        gen_length: GenLength = None,
        result_dir: ResultDir = None,
        as_json: AsJson = False,
        threads: Threads = None,
        preset: Preset = None,
        rps: str = typer.Option("inf", "--rps", help="one arrival rate; inf (default) = all requests at t=0 (saturation)"),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens",
                                                          help="engine token budget of every rung (default: serve-126k 384, else the serve preset's)"),
        max_num_logits: str | None = typer.Option(None, "--max-num-logits",
                                                  help="logit budget of the last rung (default: serve-126k 96, else the serve preset's)"),
        cache_rows: str = typer.Option("first", "--cache-rows",
                                       help="cache-policy rows on: all datasets | first dataset | none"),
        run_id: RunId = None,
        resume: Resume = False,
        num_warmups: NumWarmups = 1,
        max_duration: MaxDuration = None,
        no_profile_cache: NoProfileCache = False,
        cuda_graphs: CudaGraphs = None,
        tensor_parallel_size: TensorParallelSize = None,
        trace_steps: TraceSteps = False,
    ) -> None:
        """Ablation (paper Fig. 8): Sparse-dLLM -> +engine -> +phase scheduler -> +logit budget, and cache policies."""
        result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
        code = ablate(ServeOptions.pick(locals()), datasets=datasets, cache_rows=cache_rows, result_dir=result_dir,
                      run_id=run_id, resume=resume, as_json=as_json)
        if code:
            sys.exit(code)
