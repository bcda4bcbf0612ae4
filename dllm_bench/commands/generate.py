"""`dllm-bench generate`: decode prompts with the engine or a baseline; several prompts run
concurrently (dllm_bench.generate). `--json` prints one JSON document on stdout; progress goes
to stderr."""
from __future__ import annotations

import json

import typer

from dllm_bench.commands.serve_flags import CudaGraphs
from dllm_bench.generate import run
from engine.decoding import FIXED


def register(app: typer.Typer) -> None:
    @app.command()
    def generate(
        model: str = typer.Option("tiny", "--model", "-m", help="Preset name or HF LLaDA checkpoint directory."),
        prompt: list[str] | None = typer.Option(None, "--prompt", "-p", help="Prompt text (repeatable)."),
        prompt_ids: list[str] | None = typer.Option(None, "--prompt-ids", help="Prompt as comma-separated token ids (repeatable)."),
        gen_length: int = typer.Option(64, help="Tokens to generate (a multiple of --block-length)."),
        block_length: int = typer.Option(32, help="Semi-autoregressive block length."),
        steps: int | None = typer.Option(None, help="Denoising steps in total (default: gen-length, one token per step)."),
        temperature: float = typer.Option(0.0, help="Gumbel-max temperature (0 = greedy)."),
        remasking: str = typer.Option("low_confidence", help="low_confidence | random"),
        seed: int = typer.Option(0, help="Per-request seed (noise, random remasking)."),
        decoding: str = typer.Option(FIXED, help="fixed | threshold:τ | factor:f | entropy:γ: tokens committed per "
                                     "step (engine: every policy; fast-dllm: threshold, factor)."),
        dtype: str | None = typer.Option(None, help="float64 | float32 | bfloat16 (default: bfloat16 on CUDA, float32 on CPU)"),
        device: str | None = typer.Option(None, help="auto | cpu | cuda (default: auto)"),
        system: str = typer.Option("engine", help="engine | llada | fast-dllm | dllm-cache | sparse-dllm"),
        cache: str = typer.Option("none", help="Engine cache policy: none (exact LLaDA) | dual | sparse | auto "
                                  "(dual per request while the KV pool holds it, else sparse)."),
        retention: float = typer.Option(0.5, help="Engine sparse cache: fraction of context kept per head."),
        selection: str = typer.Option("head", help="Engine sparse cache: head | uniform."),
        max_num_logits: int | None = typer.Option(None, help="Engine logit budget (rows per chunk) [CPU: 1024; "
                                                  "CUDA: scaled with the GPU, max_num_seqs x block]."),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens",
                                                          help="Engine token budget (query tokens per step) [CPU: "
                                                               "8192; CUDA: scaled with the GPU and the model]."),
        no_logit_budget: bool = typer.Option(False, "--no-logit-budget", help="Engine: monolithic full-sequence logits."),
        scheduler: str = typer.Option("phase", help="Engine scheduler: phase | request | lookahead."),
        cuda_graphs: CudaGraphs = None,
        batch: int = typer.Option(8, help="Baselines: static batch size."),
        threshold: float | None = typer.Option(None, help="fast-dllm: parallel-decoding confidence threshold."),
        fast_dllm_cache: str | None = typer.Option(None, help="fast-dllm: dual | prefix."),
        prompt_interval: int | None = typer.Option(None, help="dllm-cache: prompt refresh interval."),
        gen_interval: int | None = typer.Option(None, help="dllm-cache: generation refresh interval."),
        transfer_ratio: float | None = typer.Option(None, help="dllm-cache: adaptive update ratio."),
        keep_ratio: float | None = typer.Option(None, help="sparse-dllm: KV keep ratio."),
        kernel_size: int | None = typer.Option(None, help="sparse-dllm: max-pool kernel (odd)."),
        chat: bool = typer.Option(True, "--chat/--no-chat", help="Apply the tokenizer's chat template to text prompts."),
        threads: int | None = typer.Option(None, help="torch threads (CPU; with --tensor-parallel-size: per rank, default 1)."),
        tensor_parallel_size: int | None = typer.Option(
            None, "--tensor-parallel-size", "--tp",
            help="Engine: ranks of one engine (heads, MLP, vocabulary split): N GPUs (NCCL), or on a CPU N processes "
                 "x --threads (gloo); workers spawned here, or launch with torchrun (docs/PARALLEL.md)."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    ) -> None:
        """Generate with the engine (continuous batching) or a baseline system."""
        doc = run.generate(run.GenerateOptions.pick(locals()), show_progress=not json_out)
        if json_out:
            typer.echo(json.dumps(doc))
        else:
            run.print_run(doc)
