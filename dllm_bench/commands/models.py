"""`dllm-bench models list|make`: the embedded checkpoint presets."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from dllm_bench import inputs
from dllm_bench.checkpoints.make import make_checkpoint
from dllm_bench.checkpoints.presets import PRESETS, Preset, get_preset
from dllm_bench.checkpoints.store import is_made, make_cached, preset_path
from dllm_bench.console import console, md_table, print_df
from dllm_bench.errors import UserError
from dllm_bench.scaling.similarity import measure_cpu, similarity_table
from engine.config import DTYPES


def _human(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G"):
        if n < 1000:
            return f"{n:.3g}{suffix}{unit}"
        n /= 1000
    return f"{n:.3g}T{unit}"


def _status(p: Preset) -> str:
    path = preset_path(p)
    if path is None:
        return "shape only"
    if p.asset:
        return str(path) if (path / "config.json").is_file() else f"missing asset {path}"
    return str(path) if is_made(p, path) else "not made"


def _dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


def list_presets() -> None:
    table = Table(title="model presets (LLaDA layout)")
    for col in ("name", "vocab", "d_model", "layers", "heads", "kv heads", "head dim", "mlp",
                "params", "weights", "made? / path"):
        left = col in ("name", "made? / path")
        table.add_column(col, justify="left" if left else "right", no_wrap=col != "made? / path",
                         overflow="fold")
    for p in PRESETS.values():
        disk = p.n_params * DTYPES[p.dtype].itemsize
        table.add_row(p.name, str(p.vocab_size), str(p.d_model), str(p.n_layers), str(p.n_heads),
                      str(p.n_kv_heads), str(p.head_dim), str(p.mlp_hidden_size), _human(p.n_params),
                      f"{_human(disk, 'B')} {p.dtype}", _status(p))
    console(stderr=False, width=200).print(table)  # piped: paths are not squeezed into 80 columns


SIMILARITY_FLOATS = {"lm_head_over_body": "{:.3f}", "logit_row_over_kv_token": "{:.2f}", "prompt_over_block": "{:.1f}",
                     "attention_share": "{:.3f}", "blocks_per_request": "{:.1f}", "weights_over_budget": "{:.2f}",
                     "request_kv_over_free": "{:.3f}", "dllm-cache step share": "{:.2f}", "reuse AI (1 req)": "{:.0f}", "reuse AI (n req)": "{:.0f}",
                     "ridge": "{:.0f}"}


def similarity(markdown: bool, cpu_peak: bool, threads: int) -> None:
    """The scale-similarity table (dllm_bench.scaling.similarity) on stdout."""
    if threads < 1:
        raise UserError(f"--threads must be >= 1, got {threads}")
    cpu = measure_cpu(threads) if cpu_peak else None
    df = similarity_table(cpu)
    if markdown:
        typer.echo(md_table(df, SIMILARITY_FLOATS), nl=False)
    else:
        print_df(console(stderr=False), df, "scale similarity (ratios at each workload; capacities for a 256+256-token request)",
                 SIMILARITY_FLOATS, drop=())
    if cpu is not None:
        typer.echo(f"cpu ridge: {cpu.matmul_flops / 1e9:.0f} GFLOP/s float32 matmul / "
                   f"{cpu.bandwidth / 1e9:.1f} GB/s copy, measured now with {threads} threads", err=True)


def make(name: str, out: Path | None, shards: int | None, force: bool) -> Path:
    """Make a preset into --out, or into the cache when --out is not given."""
    preset = get_preset(name)
    if shards is not None and shards < 1:
        raise UserError(f"--shards must be >= 1, got {shards}")
    if not preset.makeable or preset.asset:
        raise UserError(f"preset {name!r} can't be made ({preset.note or 'packaged checkpoint'})")
    if out is None:
        return make_cached(preset, shards=shards, force=force)
    return make_checkpoint(preset, inputs.writable_dir(out, "--out"), shards=shards, force=force)


def register(app: typer.Typer) -> None:
    models_app = typer.Typer(help="Embedded model presets: list them, make their checkpoints.",
                             no_args_is_help=True)

    @models_app.command("list")
    def list_cmd() -> None:
        """Show every preset, its shape, and whether/where its checkpoint is made."""
        list_presets()

    @models_app.command("make")
    def make_cmd(
        name: str = typer.Argument(..., help=f"preset: {', '.join(PRESETS)}"),
        out: Path | None = typer.Option(None, "--out", help="directory to write (default: the cache)"),
        shards: int | None = typer.Option(None, "--shards", help="safetensors shards (>1 writes an index) "
                                          "[the preset's: 6 for llada-8b, else 1]"),
        force: bool = typer.Option(False, "--force", help="overwrite an existing checkpoint"),
    ) -> None:
        """Write a preset's checkpoint (config.json, safetensors, tokenizer)."""
        path = make(name, out, shards, force)
        cfg = json.loads((path / "config.json").read_text())
        ids = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id")}
        typer.echo(f"{name}: {path} ({_human(_dir_bytes(path), 'B')}, {cfg['torch_dtype']}); "
                   + ", ".join(f"{k}={v}" for k, v in ids.items()))

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
