"""`dllm-bench profile`: what the offline profiler measures and what it leaves for the KV pool,
with the logit budget and without it, side by side (dllm_bench.profiling); `--device-memory`
plans a GPU we do not have from the model's shapes instead."""
from __future__ import annotations

import json

import typer

from dllm_bench.commands import budget_flag
from dllm_bench.profiling import run, tables


def register(app: typer.Typer) -> None:
    @app.command()
    def profile(
        model: str = typer.Option("mini-126k", "--model", "-m", help="Preset name (llada-8b too with --device-memory) or checkpoint directory."),
        memory_budget: budget_flag.Profile = None,
        device_memory: str | None = typer.Option(None, help="Plan a GPU of this memory (24GiB, 80GiB, or a hardware profile: l40s, a100-80g, ...) from the model's shapes alone: no weights, no GPU; budget = this × gpu_memory_utilization."),
        max_num_batched_tokens: int = typer.Option(4096, help="Query tokens per step (token budget)."),
        max_num_logits: int = typer.Option(1024, help="Logit rows per chunk for the budgeted profile."),
        max_num_seqs: int = typer.Option(256, help="Concurrent requests cap."),
        max_model_len: int = typer.Option(1024, help="Longest canvas (prompt + generation)."),
        cache: str = typer.Option("sparse", help="none | dual | sparse | auto (the worst step of dual and sparse)"),
        retention: float = typer.Option(0.5, help="Sparse cache retention."),
        prompt_len: int = typer.Option(256, help="Request shape for the 'requests that fit' column."),
        gen_length: int = typer.Option(256, help="Request shape for the 'requests that fit' column."),
        block_length: int = typer.Option(32),
        sampling: bool = typer.Option(False, "--sampling/--greedy", help="Profile for temperature > 0 (float64 Gumbel noise)."),
        dtype: str | None = typer.Option(None, help="float32 | bfloat16 | float16 | float64 (default: bfloat16 on CUDA or with --device-memory, else float32)."),
        threads: int | None = typer.Option(None, help="torch threads (per rank with --tensor-parallel-size, default 1)"),
        tensor_parallel_size: int | None = typer.Option(
            None, "--tensor-parallel-size", "--tp",
            help="Per rank of an engine split over N devices: with --device-memory the plan of one of N such GPUs, "
                 "else N CPU processes each profile their own shard (the KV pool: the smallest rank's)."),
        json_out: bool = typer.Option(False, "--json"),
    ) -> None:
        """Profile the worst admissible step and size the KV pool, with and without the logit budget."""
        doc = run.profile(run.ProfileOptions.pick(locals()))
        if json_out:
            typer.echo(json.dumps(run.json_doc(doc)))
        else:
            tables.print_doc(doc)
