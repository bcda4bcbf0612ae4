"""`--memory-budget`, declared once for every command that takes it. The value is the same
everywhere (a size such as 1GiB, `auto`, and `none` where a command runs without a budget;
dllm_bench.device_defaults.resolve_budget reads it); what `auto` measures and the default differ
per command, so each command's alias below states its own."""
from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from engine.config import GPU_MEMORY_UTILIZATION

FLAG = "--memory-budget"
SIZE = "bytes for weights+activations+KV, e.g. 1GiB"
AUTO = f"auto = free GPU memory x {GPU_MEMORY_UTILIZATION:g}"
AT_START = AUTO + " measured once at the start"


def option(auto: str | None = AT_START, default: str = "", none: bool = False, scope: str = "") -> typer.models.OptionInfo:
    """The option: `scope` (whose budget), the size, what `auto` means, `none` if allowed, [default]
    (escaped: Rich, which renders the help, would take `[preset]` for a style tag and drop it)."""
    parts = [scope + SIZE] + ([auto] if auto else []) + (["none = no budget"] if none else [])
    return typer.Option(FLAG, help="; ".join(parts) + (" " + escape(f"[{default}]") if default else ""))


# serve, ablate, sweep: a CPU run needs a size (baselines' largest batches are measured in it).
Serve = Annotated[str | None, option(AT_START + " (CUDA only: a CPU run needs a size)", "preset, else auto")]
Server = Annotated[str | None, option(AT_START + " (on CPU: no budget)", "preset, else auto", none=True)]
EnginePoints = Annotated[str, option(AT_START + " (on CPU: no budget)", none=True, scope="engine points: ")]
Memory = Annotated[str | None, option(AT_START + " (CUDA only: a CPU run needs a size)")]
ProfileStep = Annotated[str | None, option(default="preset")]
Profile = Annotated[str | None, option(AUTO, "auto on CUDA, 4GiB on CPU")]
Simulate = Annotated[str | None, option(None, f"GPU: its memory x {GPU_MEMORY_UTILIZATION:g}; cpu: preset")]
