"""`dllm-bench bench-gpu`: the one run to make on a CUDA machine (dllm_bench/benchgpu,
docs/GPU.md): every step as a sub-command, one results directory, summary.md."""
from __future__ import annotations

import sys
from pathlib import Path

import typer
import typer.main

from dllm_bench.benchgpu.plan import NAMES
from dllm_bench.benchgpu.run import Options, bench_gpu
from dllm_bench.benchgpu.subcommand import Commands


def register(app: typer.Typer) -> None:
    @app.command("bench-gpu")
    def bench_gpu_cmd(
        model: str | None = typer.Option(None, "--model", help="model preset or checkpoint dir [CUDA: llada-8b, "
                                         "made on the GPU; CPU: tiny]"),
        out: Path | None = typer.Option(None, "--out", help="results directory, new or empty "
                                        "[results/runs/<timestamp>-bench-gpu]"),
        only: str | None = typer.Option(None, "--only", help=f"run only these steps: {','.join(NAMES)}"),
        device: str | None = typer.Option(None, "--device", help="cuda (the GPU scale) | cpu (the toy scale) "
                                          "[cuda when present]"),
        time_budget: float = typer.Option(600.0, "--time-budget", help="seconds for the whole run: sizes serve-22g "
                                          "and leaves out a step that no longer fits; 0 = none"),
    ) -> None:
        """Everything a GPU run needs in one command: checkpoint, doctor, serve on the whole GPU and at 22 GiB,
        step profiles, memory; summary.md answers each goal (measured, target, met or not)."""
        commands = Commands.of(typer.main.get_command(app))
        code = bench_gpu(Options(model, out, only, device, time_budget), commands)
        if code:
            sys.exit(code)  # not typer.Exit: with standalone_mode=False click returns its code unused
