"""`dllm-bench train`: train a tiny masked-diffusion model of either family (LLaDA, Dream) on a
generated task (`synth`, `synth-cot`; CPU) and save it as an HF checkpoint of its family +
tokenizer + learning curve (dllm_bench.train.loop.train)."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import typer

from dllm_bench.train.loop import train as run_train
from dllm_bench.train.options import train_config
from workloads.tasks import synth


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        out: Path = typer.Option(..., "--out", "-o", help="Checkpoint directory to write (created; must be empty unless --force)."),
        task: str = typer.Option("synth", help="Training task: synth | synth-cot."),
        train_facts: str = typer.Option("4,8,16", help="synth context_facts drawn per batch (comma list)."),
        eval_facts: int = typer.Option(16, help="synth context_facts of the held-out probe."),
        ops: str = typer.Option(",".join(synth.DEFAULT_OPS), help=f"synth ops, a comma list of {', '.join(synth.OPS)}."),
        needles: int = typer.Option(3, help="synth-cot: digit-valued events in the chain (answer steps + 1)."),
        max_value: int = typer.Option(9, help="Operand range (1..9)."),
        window: int | None = typer.Option(None, help="Answer region length (answer + EOS padding; default: synth 16, synth-cot 32)."),
        model_type: str = typer.Option("llada", "--model-type", help="The family: llada | Dream (its config.json, "
                                       "weight names, special tokens; Dream's logits carry its shift)."),
        vocab_size: int = typer.Option(512, help="Vocabulary size (BPE + the family's special tokens)."),
        d_model: int = typer.Option(128),
        n_layers: int = typer.Option(4),
        n_heads: int = typer.Option(4),
        n_kv_heads: int = typer.Option(4),
        mlp_hidden_size: int = typer.Option(344),
        rope_theta: float = typer.Option(10000.0, help="RoPE base (config.json rope_theta)."),
        objective: str | None = typer.Option(None, help="Default the family's: llada (t~U(eps,1), CE/t; LLaDA SFT) | cart (Dream's CART-weighted CE) | plain (CE on masked, t~U(t_min,1))."),
        t_min: float = typer.Option(0.1, help="plain objective: lowest mask ratio."),
        batch_size: int = typer.Option(32),
        lr: float = typer.Option(1e-3, help="AdamW peak learning rate (warmup + cosine to 10%)."),
        warmup: int = typer.Option(100),
        weight_decay: float = typer.Option(0.01),
        steps: int = typer.Option(3000, help="Optimizer steps (also the LR schedule's horizon)."),
        minutes: float | None = typer.Option(None, help="Wall-clock cap in minutes (stops early; the step count is recorded)."),
        stop_after: int | None = typer.Option(None, help="End after N steps (deterministic early stop; the LR schedule spans --steps)."),
        seed: int = typer.Option(0),
        threads: int | None = typer.Option(1, help="torch threads (1 is fastest on a shared CPU)."),
        eval_every: int = typer.Option(300, help="Probe the held-out set every N steps."),
        eval_n: int = typer.Option(48, help="Held-out probe size."),
        save_dtype: str = typer.Option("float32", help="float32 | bfloat16 (weights on disk)."),
        force: bool = typer.Option(False, "--force", help="Write into a non-empty --out."),
        json_out: bool = typer.Option(False, "--json", help="Print the training summary as JSON."),
    ) -> None:
        """Train a tiny LLaDA (or Dream) on synth or synth-cot with the masked-diffusion objective; save its HF layout."""
        flags = dict(locals())
        json_out = flags.pop("json_out")
        log = (lambda s: typer.echo(s, err=True)) if json_out else typer.echo
        summary = run_train(train_config(**flags), log=log, command=shlex.join(["dllm-bench", *sys.argv[1:]]))
        if json_out:
            typer.echo(json.dumps(summary))
