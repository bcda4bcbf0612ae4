"""`dllm-bench sweep --vary input-len|output-len`: the paper's Fig. 7 sensitivity sweeps — the
engine's saturation throughput relative to Sparse-dLLM per prompt length (output fixed) or per
output length (prompt fixed); ranges scale with the preset (dllm_bench.sweep.run.sweep, docs/ABLATE.md).

Each (point, system) runs in a fresh serve worker on a fixed-length `random` workload with every
request at t=0; run directory of kind "sweep" (serve's layout + plots/fig7_<vary>.png). Tables
go to stderr; `--json` prints one JSON document on stdout.
"""
from __future__ import annotations

import sys

import typer

from dllm_bench import inputs
from dllm_bench.commands import budget_flag
from dllm_bench.commands.serve_flags import (
    AsJson,
    BaselineBatch,
    CudaGraphs,
    MaxDuration,
    Model,
    NoProfileCache,
    NumWarmups,
    Preset,
    Repeats,
    ResultDir,
    Resume,
    RunId,
    TensorParallelSize,
    Threads,
    TraceSteps,
)
from dllm_bench.serve.options import ServeOptions
from dllm_bench.sweep.run import sweep


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep_cmd(
        vary: str = typer.Option(..., "--vary", help="input-len (prompt length, output fixed) | output-len (output length, prompt fixed)"),
        points: str | None = typer.Option(None, "--points",
                                          help="lengths to sweep, tokens as sent, comma list (default: the paper's 100-600 / 128-512 scaled by the preset)"),
        fixed_len: int | None = typer.Option(None, "--fixed-len", help="the other length, tokens (default: paper 256 output / 300 input, scaled)"),
        systems: str | None = typer.Option(None, "--systems", help="systems (serve's spec syntax) (default: engine:cache=sparse,sparse-dllm, the paper's pair)"),
        scheduler: str | None = typer.Option(None, "--scheduler",
                                             help="engine scheduler(s), comma list of phase | request | lookahead: each engine system without scheduler= swept once per scheduler (default: the engine's, phase)"),
        baseline_batch: BaselineBatch = "max-fit",
        num_prompts: int | None = typer.Option(None, "--num-prompts", help="requests per point (default: cpu-default: 8, else the preset's)"),
        model: Model = None,
        preset: Preset = None,
        memory_budget: budget_flag.Serve = None,
        seed: int = typer.Option(0, "--seed", help="workload seed (prompt ids)"),
        repeats: Repeats = 1,
        gen_length: int | None = typer.Option(None, "--gen-length", help="--vary input-len: the fixed output length of every request (a block multiple)"),
        threads: Threads = None,
        rps: str = typer.Option("inf", "--rps", help="one arrival rate; inf (default) = all requests at t=0 (saturation)"),
        result_dir: ResultDir = None,
        run_id: RunId = None,
        resume: Resume = False,
        as_json: AsJson = False,
        num_warmups: NumWarmups = 1,
        max_duration: MaxDuration = None,
        no_profile_cache: NoProfileCache = False,
        cuda_graphs: CudaGraphs = None,
        tensor_parallel_size: TensorParallelSize = None,
        trace_steps: TraceSteps = False,
    ) -> None:
        """Sensitivity sweeps (paper Fig. 7): engine throughput relative to Sparse-dLLM vs input or output length."""
        result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
        code = sweep(ServeOptions.pick(locals()), vary=vary, points=points, fixed_len=fixed_len, result_dir=result_dir,
                     run_id=run_id, resume=resume, as_json=as_json, schedulers=scheduler)
        if code:
            sys.exit(code)
