"""`dllm-bench calibrate`: profile this machine's operators and each system's host time, fit a
hardware profile and write it as the file `dllm-bench simulate --hardware` reads
(dllm_bench.simulate.calibrate, docs/SIMULATE.md)."""
from __future__ import annotations

from pathlib import Path

import typer

from dllm_bench.console import console
from dllm_bench.simulate.calibrate.run import CalibrateOptions, calibrate
from dllm_bench.systems.spec import DEFAULT_SYSTEMS


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_cmd(
        preset: str | None = typer.Option(None, "--preset", help="serve preset whose model, dtype, threads and "
                                          "workload shape are profiled [cpu-default]"),
        model: str | None = typer.Option(None, "--model", help="model preset or checkpoint dir [preset]"),
        device: str | None = typer.Option(None, "--device", help="cpu | cuda[:N]: the device profiled [preset]"),
        systems: str = typer.Option(DEFAULT_SYSTEMS, "--systems", help="systems whose host time is fitted "
                                    "(those `serve` and `simulate` run by default)"),
        name: str = typer.Option("cpu", "--name", help="profile name (`simulate --hardware NAME`)"),
        out: Path | None = typer.Option(None, "--out", help="file to write [~/.cache/dllm-bench/hardware/NAME.json]"),
        dtype: str | None = typer.Option(None, "--dtype", help="float32 | bfloat16 | float16 | float64 "
                                         "[bfloat16 on CUDA, else the preset's]"),
        repeats: int = typer.Option(5, "--repeats", help="timings per operator (median)"),
        sizes: str | None = typer.Option(None, "--sizes", help="concurrent requests per host-time run, in order "
                                         "[powers of 2 up to the preset's concurrency, at most 8 on a CPU (1,2 for "
                                         "cpu-default); on a GPU ascending to 64 and the largest batch the budget "
                                         "admits, stopping where rows/s saturate]"),
    ) -> None:
        """Profile this machine's CPU or GPU (GEMMs, attention, host time per system) and write a hardware
        profile."""
        typer.echo(str(calibrate(CalibrateOptions.pick(locals()), console())))
