"""`dllm-bench server`'s options: ServerOptions as given (the shared run options, RunOptions, plus
the server's own), resolved once by `resolve_server_options` into a ServerSetup before a weight
is loaded or the port served.

Engine knobs default to the serve preset of the model (`serve --model tiny` and `server --model
tiny` build the same engine); a checkpoint directory on a CUDA machine takes the GPU preset's
(bfloat16, budget auto). Device, dtype, budget, threads, CUDA graphs and the decoding policy
resolve through dllm_bench.systems.options, as every other command's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from dllm_bench import inputs
from dllm_bench.device_defaults import gpu_name, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.serve.presets import ServePreset, preset_for
from dllm_bench.serve.workload import model_info
from dllm_bench.systems.options import RunOptions, RunSetup, resolve
from dllm_bench.systems.ridge import device_ridge
from dllm_bench.systems.spec import SystemVariant, make_variant
from dllm_bench.units import format_size
from engine.config import DTYPES
from engine.decoding import FIXED

DEFAULT_MAX_WAITING = 256
# The engine knobs `server` takes as flags, one value each (its --tensor-parallel-size included).
KNOBS = ("cache", "selection", "retention", "scheduler", "max_num_batched_tokens", "max_num_logits",
         "max_num_seqs", "tensor_parallel_size")


@dataclass(frozen=True)
class ServerOptions(RunOptions):
    """`server`'s options as given (field names are its CLI parameters'); None: the preset's."""
    model: str | None = None
    preset: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    cache: str | None = None
    selection: str | None = None
    retention: float | None = None
    scheduler: str | None = None
    max_num_batched_tokens: int | None = None
    max_num_logits: str | None = None
    max_num_seqs: int | None = None
    block_length: int | None = None
    max_waiting: int = DEFAULT_MAX_WAITING
    sampling: bool = True
    no_profile_cache: bool = False
    log_level: str = "warning"
    api_key: str | None = None
    decoding: str = FIXED

    def knobs(self) -> dict:
        """The engine knobs given (the others are the preset's)."""
        return {k: getattr(self, k) for k in KNOBS if getattr(self, k) is not None}


@dataclass
class ServerSetup:
    """The server's options resolved: what build_state builds."""

    preset: ServePreset
    variant: SystemVariant
    model_dir: Path
    run: RunSetup               # device, dtype, budget, threads, CUDA graphs, decoding
    block_length: int

    @property
    def device(self) -> str:
        return str(self.run.device)


def resolve_server_options(o: ServerOptions) -> ServerSetup:
    """Every option checked, before a weight is loaded: a budget that cannot hold the weights is
    refused here, not after loading them (LLaDA-8B in float32: 32 GB) and profiling for minutes.
    The engine's CUDA graphs (None: on for CUDA) are resolved into the preset."""
    sp = preset_for(o.preset, o.model, device=o.device or "auto")
    # The server's counts, in its own wording (before resolve's checks of the run options).
    for name, v in (("--threads", o.threads), ("--block-length", o.block_length), ("--max-waiting", o.max_waiting)):
        if v is not None and v < 1:
            raise UserError(f"{name} must be >= 1, got {v}")
    # The --systems knobs' own parsers, checks and canonical label, one value per flag.
    variant = make_variant("engine", o.knobs().items())
    run = resolve(replace(o.run_options(), device=o.device or sp.device), auto_device=False, dtype=sp.dtype_on,
                  memory_budget=sp.memory_budget, threads=sp.threads)
    device = str(run.device)
    sp = replace(sp, cuda_graphs=run.cuda_graphs)
    model_dir = inputs.checkpoint_dir(sp.model)
    info = model_info(model_dir, run.dtype)
    weights = info["weights_bytes"]
    if run.budget.bytes is not None and run.budget.bytes <= weights:
        raise UserError(f"--memory-budget {format_size(run.budget.bytes)} does not even hold the weights "
                        f"({format_size(weights)} in {run.dtype})")
    block = o.block_length or sp.block_length
    if sp.auto_budgets:     # scaled with the GPU (dllm_bench.systems.step_budgets); a request may be a whole canvas
        gpu = gpu_name(device)
        scale = run.budget.bytes if run.budget.bytes is not None or gpu is None else resolve_budget("auto", device).bytes
        sp = replace(sp, dtype=run.dtype, block_length=block).with_step_budgets(
            info, sp.max_model_len or info["max_sequence_length"], gpu, scale)
    sp = sp.with_ridge(device_ridge(device, DTYPES[run.dtype]))     # what cache=auto weighs (dllm_bench.systems.ridge)
    return ServerSetup(sp, variant, model_dir, run, block)
