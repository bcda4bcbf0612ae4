"""`dllm-bench sweep --vary input-len|output-len`: the paper's Fig. 7 sensitivity sweeps — the
engine's saturation throughput relative to Sparse-dLLM per prompt length (output fixed) or per
output length (prompt fixed); ranges scale with the preset (dllm_bench.sweep.run.sweep, docs/ABLATE.md).

Each (point, system) runs in a fresh serve worker on a fixed-length `random` workload with every
request at t=0; run directory of kind "sweep" (serve's layout + plots/fig7_<vary>.png). Tables
go to stderr; `--json` prints one JSON document on stdout.
"""
from __future__ import annotations

import sys
from pathlib import Path

import typer

from dllm_bench import inputs
from dllm_bench.serve.presets import DEFAULT_PRESET, PRESETS
from dllm_bench.sweep.run import sweep


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep_cmd(
        vary: str = typer.Option(..., "--vary", help="input-len (prompt length, output fixed) | output-len (output length, prompt fixed)"),
        points: str | None = typer.Option(None, "--points",
                                          help="lengths to sweep, tokens as sent, comma list (default: the paper's 100-600 / 128-512 scaled by the preset)"),
        fixed_len: int | None = typer.Option(None, "--fixed-len", help="the other length, tokens (default: paper 256 output / 300 input, scaled)"),
        systems: str | None = typer.Option(None, "--systems", help="systems (serve's spec syntax) (default: engine,sparse-dllm)"),
        baseline_batch: str = typer.Option("max-fit", "--baseline-batch",
                                           help="baselines without batch=: max-fit | upstream | both (as serve)"),
        num_prompts: int | None = typer.Option(None, "--num-prompts", help="requests per point (default: cpu-default: 8, else the preset's)"),
        model: str | None = typer.Option(None, "--model", help="model preset or LLaDA checkpoint dir (default: preset)"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET})"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV (default: preset)"),
        seed: int = typer.Option(0, "--seed", help="workload seed (prompt ids)"),
        repeats: int = typer.Option(1, "--repeats", help="run every point N times with workload seeds seed, seed+1, ...; tables give median [min-max]"),
        gen_length: int | None = typer.Option(None, "--gen-length", help="--vary input-len: the fixed output length of every request (a block multiple)"),
        threads: int | None = typer.Option(None, "--threads", help="torch threads of every system process (default: preset)"),
        rps: str = typer.Option("inf", "--rps", help="one arrival rate; inf (default) = all requests at t=0 (saturation)"),
        result_dir: Path | None = typer.Option(None, "--result-dir", help="runs root (default results/runs, or $DLLM_BENCH_RESULTS_DIR)"),
        run_id: str | None = typer.Option(None, "--run-id", help="run directory name"),
        resume: bool = typer.Option(False, "--resume", help="continue a run (--run-id, default the latest): skip finished points and repeats"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
        num_warmups: int = typer.Option(1, "--num-warmups", help="unmeasured warm-up requests per system"),
        max_duration: float | None = typer.Option(None, "--max-duration", help="abort a point after this many seconds"),
        no_profile_cache: bool = typer.Option(False, "--no-profile-cache", help="re-measure KV pools and static batches"),
    ) -> None:
        """Sensitivity sweeps (paper Fig. 7): engine throughput relative to Sparse-dLLM vs input or output length."""
        result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
        code = sweep(vary=vary, points=points, fixed_len=fixed_len, systems=systems, num_prompts=num_prompts,
                     model=model, preset=preset, memory_budget=memory_budget, seed=seed, threads=threads, rps=rps,
                     result_dir=result_dir, run_id=run_id, as_json=as_json, num_warmups=num_warmups,
                     max_duration=max_duration, no_profile_cache=no_profile_cache, gen_length=gen_length,
                     repeats=repeats, baseline_batch=baseline_batch, resume=resume)
        if code:
            sys.exit(code)
