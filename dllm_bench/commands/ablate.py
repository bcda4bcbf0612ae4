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
from pathlib import Path

import typer

from dllm_bench import inputs
from dllm_bench.ablate.run import ablate
from dllm_bench.serve.presets import DEFAULT_PRESET, PRESETS


def register(app: typer.Typer) -> None:
    @app.command("ablate")
    def ablate_cmd(
        datasets: str | None = typer.Option(None, "--datasets", "--dataset",
                                            help="comma list of livebench, osc, burstgpt (default: all three)"),
        num_prompts: int | None = typer.Option(None, "--num-prompts",
                                               help="requests per dataset (default: cpu-default 3, serve-126k 8; other presets: the serve preset's)"),
        model: str | None = typer.Option(None, "--model", help="model preset or LLaDA checkpoint dir (default: preset)"),
        memory_budget: str | None = typer.Option(None, "--memory-budget", help="bytes for weights+activations+KV, e.g. 1GiB (default: preset)"),
        seed: int = typer.Option(0, "--seed", help="workload seed"),
        repeats: int = typer.Option(1, "--repeats", help="run every rung N times with workload seeds seed, seed+1, ...; tables give median [min-max]"),
        gen_length: int | None = typer.Option(None, "--gen-length", help="one output length for every request (the paper's 256), a block multiple [preset]"),
        result_dir: Path | None = typer.Option(None, "--result-dir", help="runs root (default results/runs, or $DLLM_BENCH_RESULTS_DIR)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
        threads: int | None = typer.Option(None, "--threads", help="torch threads of every system process (default: preset)"),
        preset: str | None = typer.Option(None, "--preset", help=f"serve preset: {', '.join(PRESETS)} (default {DEFAULT_PRESET})"),
        rps: str = typer.Option("inf", "--rps", help="one arrival rate; inf (default) = all requests at t=0 (saturation)"),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens",
                                                          help="engine token budget of every rung (default: serve-126k 384, else the serve preset's)"),
        max_num_logits: str | None = typer.Option(None, "--max-num-logits",
                                                  help="logit budget of the last rung (default: serve-126k 96, else the serve preset's)"),
        cache_rows: str = typer.Option("first", "--cache-rows",
                                       help="cache-policy rows on: all datasets | first dataset | none"),
        run_id: str | None = typer.Option(None, "--run-id", help="run directory name"),
        resume: bool = typer.Option(False, "--resume", help="continue a run (--run-id, default the latest): skip finished points and repeats"),
        num_warmups: int = typer.Option(1, "--num-warmups", help="unmeasured warm-up requests per system"),
        max_duration: float | None = typer.Option(None, "--max-duration", help="abort a point after this many seconds"),
        no_profile_cache: bool = typer.Option(False, "--no-profile-cache", help="re-measure KV pools and static batches"),
    ) -> None:
        """Ablation (paper Fig. 8): Sparse-dLLM -> +engine -> +phase scheduler -> +logit budget, and cache policies."""
        result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
        code = ablate(datasets=datasets, num_prompts=num_prompts, model=model, memory_budget=memory_budget, seed=seed,
                      result_dir=result_dir, as_json=as_json, threads=threads, preset=preset, rps=rps,
                      max_num_batched_tokens=max_num_batched_tokens, max_num_logits=max_num_logits,
                      cache_rows=cache_rows, run_id=run_id, num_warmups=num_warmups, max_duration=max_duration,
                      no_profile_cache=no_profile_cache, gen_length=gen_length, repeats=repeats,
                      resume=resume)
        if code:
            sys.exit(code)
