"""`dllm-bench doctor`: check this machine (and a checkpoint) before the first real run
(dllm_bench/doctor, docs/GPU.md)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import typer

from dllm_bench import inputs
from dllm_bench.checkpoints.presets import PRESETS
from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.console import console
from dllm_bench.doctor import report
from dllm_bench.doctor.run import run_checks
from dllm_bench.errors import UserError


def _model_dir(value: str | None) -> Path | None:
    """A directory to check, or a preset's (made on first use). Anything else is bad input (exit
    2); a directory that is not a good checkpoint is what the checkpoint row reports."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        if value in PRESETS:
            return resolve_model(value)
        raise UserError(f"--model {value}: not a directory or a model preset (give the checkpoint's directory)")
    return path


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(
        model: str | None = typer.Option(None, "--model", help="checkpoint directory (or model preset) to check "
                                         "(config, index, safetensors headers; no weights loaded)"),
        device: str | None = typer.Option(None, "--device", help="cpu | cuda[:N] [cuda when present, else cpu]"),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    ) -> None:
        """Check this machine for dllm-bench: device, torch/CUDA, attention kernel, dtypes, memory, a checkpoint,
        one request against the reference sampler, one LLaDA-8B layer against the simulator. Exit 1 if a
        check fails."""
        model_dir = _model_dir(model)
        dev = torch.device(inputs.device(device) if device is not None else
                           ("cuda" if torch.cuda.is_available() else "cpu"))
        err = console()
        with err.status("checking") as status:
            checks, seconds = run_checks(dev, model_dir, lambda name: status.update(f"checking {name}"))
        if json_out:
            typer.echo(json.dumps(report.document(checks, model_dir, seconds), default=str))
        else:
            report.show(checks, model_dir, console(stderr=False))
            err.print(f"{seconds:.1f} s")
        code = report.exit_code(checks)
        if code:
            sys.exit(code)  # not typer.Exit: with standalone_mode=False click returns its code unused
