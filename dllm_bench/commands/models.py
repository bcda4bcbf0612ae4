"""`dllm-bench models list|make|similarity`: the embedded checkpoint presets
(dllm_bench.checkpoints.catalog) and how closely each keeps LLaDA-8B's ratios
(dllm_bench.scaling.table)."""
from __future__ import annotations

from pathlib import Path

import typer

from dllm_bench import inputs
from dllm_bench.checkpoints import catalog
from dllm_bench.checkpoints.presets import PRESETS
from dllm_bench.scaling.table import similarity


def register(app: typer.Typer) -> None:
    models_app = typer.Typer(help="Embedded model presets: list them, make their checkpoints.",
                             no_args_is_help=True)

    @models_app.command("list")
    def list_cmd() -> None:
        """Show every preset, its shape, and whether/where its checkpoint is made."""
        catalog.list_presets()

    @models_app.command("make")
    def make_cmd(
        name: str = typer.Argument(..., help=f"preset: {', '.join(PRESETS)}"),
        out: Path | None = typer.Option(None, "--out", help="directory to write (default: the cache)"),
        shards: int | None = typer.Option(None, "--shards", help="safetensors shards (>1 writes an index) "
                                          "[the preset's: 6 for llada-8b, else 1]"),
        force: bool = typer.Option(False, "--force", help="overwrite an existing checkpoint"),
    ) -> None:
        """Write a preset's checkpoint (config.json, safetensors, tokenizer)."""
        preset = catalog.makeable(name, shards)
        typer.echo(catalog.make(preset, None if out is None else inputs.writable_dir(out, "--out"), shards, force))

    @models_app.command("similarity")
    def similarity_cmd(
        markdown: bool = typer.Option(False, "--markdown", help="print a Markdown table (docs/SCALING.md)"),
        cpu_peak: bool = typer.Option(True, "--cpu-peak/--no-cpu-peak",
                                      help="measure this CPU's matmul rate and bandwidth for the ridge column"),
        threads: int = typer.Option(2, "--threads", help="torch threads for the CPU measurement"),
    ) -> None:
        """How closely each preset keeps LLaDA-8B's cost ratios (docs/SCALING.md)."""
        similarity(markdown, cpu_peak, threads)

    app.add_typer(models_app, name="models")
