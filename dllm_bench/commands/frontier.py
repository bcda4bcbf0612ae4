"""`dllm-bench frontier`: accuracy and throughput of every (system, decoding policy) on one task at
a fixed concurrency, its Pareto front and the goals' verdicts (dllm_bench.frontier.run.frontier;
docs/FRONTIER.md)."""
from __future__ import annotations

import typer

from dllm_bench import inputs
from dllm_bench.commands import budget_flag
from dllm_bench.commands.serve_flags import AsJson, ResultDir, RunId
from dllm_bench.frontier.configs import DEFAULT_DECODING, DEFAULT_SYSTEMS
from dllm_bench.frontier.run import CONCURRENCY, LIMIT, REPEATS, THREADS, FrontierOptions, frontier


def register(app: typer.Typer) -> None:
    @app.command("frontier")
    def frontier_cmd(
        model: str | None = typer.Option(None, "--model", "-m", help="Preset or LLaDA checkpoint dir; a comma list = "
                                         "several trained models (seeds), pooled; a committed trained model's seed-0 "
                                         "name (synth-cot, tiny-math) = its --seeds committed seeds (default: the "
                                         "task's, synth-cot,synth-cot-s1,synth-cot-s2)"),
        seeds: int = typer.Option(3, "--seeds", help="how many of a trained model's committed seeds (1-3)"),
        task: str | None = typer.Option(None, help="synth-cot | synth | gsm8k | humaneval (default: the model's "
                                        "training task, else synth-cot; gsm8k/humaneval need --model DIR)"),
        systems: str | None = typer.Option(None, "--systems", help=f"systems as in serve [{DEFAULT_SYSTEMS}]; "
                                           "each runs the --decoding policies it has upstream"),
        decoding: str = typer.Option(DEFAULT_DECODING, "--decoding", help="policies, comma list: fixed, threshold:τ, "
                                     "factor:f, entropy:γ (engine only)"),
        concurrency: int = typer.Option(CONCURRENCY, "--concurrency", help="requests in flight at once (a baseline's "
                                        "static batch)"),
        limit: int = typer.Option(LIMIT, "--limit", help="questions per model (the first N of the split)"),
        repeats: int = typer.Option(REPEATS, "--repeats", help="throughput repeats: median and min–max"),
        split: str = typer.Option("test", help="test | dev (generated tasks' splits)"),
        retention: float = typer.Option(0.5, help="engine sparse cache retention and Sparse-dLLM keep_ratio"),
        seed: int = typer.Option(0, help="question seed (generated tasks) and request seed"),
        data: str | None = typer.Option(None, help="local GSM8K/HumanEval-shaped JSONL or datasets dir"),
        num_fewshot: int | None = typer.Option(None, help="gsm8k: CoT exemplars, 0..8 (default 8)"),
        dtype: str | None = typer.Option(None, help="float64 | float32 | bfloat16 (default: bfloat16 on CUDA, float32 on CPU)"),
        device: str = typer.Option("auto", help="auto | cpu | cuda"),
        memory_budget: budget_flag.EnginePoints = "auto",
        threads: int | None = typer.Option(THREADS, help="torch threads (CPU)"),
        result_dir: ResultDir = None,
        run_id: RunId = None,
        json_out: AsJson = False,
    ) -> None:
        """Speed and quality on one plot: accuracy vs tok/s of each (system, decoding), Pareto front, goals."""
        result_dir, run_id = inputs.result_dir(result_dir), inputs.run_id(run_id)
        frontier(FrontierOptions.pick(locals()), result_dir=result_dir, run_id=run_id, as_json=json_out)
