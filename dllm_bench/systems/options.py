"""Where and how a run's systems run, the options every command that runs one shares: device,
dtype, memory budget, torch threads, CUDA graphs, tensor-parallel size and the decoding policy.

`RunOptions` holds them as given (None: the command's default, e.g. its serve preset's); a
command's options class extends it (ServeOptions: serve, ablate, sweep, simulate; Accuracy-,
Frontier-, Generate-, Profile-, Server-, CalibrateOptions) and is built from the CLI's parameters
by `pick`.
`resolve` checks them once, before anything is loaded or written, into a `RunSetup`
(device_defaults.DeviceOptions plus the rest): the device defaults of dllm_bench.device_defaults.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from dllm_bench import inputs
from dllm_bench.device_defaults import DeviceOptions, cuda_graphs_on, default_dtype, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.systems import decoding as system_decoding
from dllm_bench.systems.build import rank_threads
from dllm_bench.systems.spec import ENGINE, SystemVariant, engine_knobs
from engine.attention import choose_backend
from engine.config import DTYPES
from engine.decoding import Decoding


@dataclass(frozen=True)
class RunOptions:
    """The run options as given; field names are the CLI parameters' (`--memory-budget` ->
    memory_budget), so a command builds its options class with `pick(locals())`."""
    device: str | None = None
    dtype: str | None = None
    memory_budget: str | None = None
    threads: int | None = None
    cuda_graphs: bool | None = None
    tensor_parallel_size: int | None = None
    decoding: str | None = None

    @classmethod
    def pick(cls, values: Mapping[str, Any]):
        """The options among a command's parameters (the others, e.g. --run-id, are the
        command's own); the ones a command does not expose keep their defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def run_options(self) -> RunOptions:
        return RunOptions(**{f.name: getattr(self, f.name) for f in fields(RunOptions)})


@dataclass(frozen=True)
class RunSetup(DeviceOptions):
    """The run options resolved (device, dtype and budget: DeviceOptions)."""
    threads: int | None = None          # torch threads of the run's processes (None: as they are)
    cuda_graphs: bool = False           # the engine's CUDA graphs (on by default on CUDA)
    tensor_parallel_size: int = 1       # the engine's ranks; baselines run on one device
    decoding: Decoding = Decoding()   # the parallel-decoding policy (engine.decoding)

    @property
    def rank_threads(self) -> int:
        """Torch threads per rank of the engine: the process's shared out among its ranks."""
        return rank_threads(self.tensor_parallel_size)

    def apply_threads(self) -> None:
        """This process's torch threads, when the run sets them."""
        if self.threads is not None:
            torch.set_num_threads(self.threads)


def device_of(value: str | None, auto: bool = True) -> torch.device:
    """--device: auto (or None: CUDA when present), cpu or cuda[:N] with that GPU present.
    `auto=False`: a command whose --device names one (server, calibrate: cpu or cuda[:N])."""
    if not auto:
        return torch.device(inputs.device(str(value)))
    text = "auto" if value is None else str(value).strip()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise UserError(f"--device must be auto, cpu or cuda[:N], got {value!r}")
    return torch.device(inputs.device(text))


def positive(value: int | None, flag: str) -> int | None:
    if value is not None and value < 1:
        raise UserError(f"{flag} must be >= 1, got {value}")
    return value


def resolve(o: RunOptions, *, device: str | None = None, dtype: str | Callable[[torch.device], str] | None = None,
            memory_budget: str | None = None, threads: int | None = None, tensor_parallel_size: int = 1,
            decoding: str | None = None, required: bool = False, auto_device: bool = True) -> RunSetup:
    """`o` checked and resolved, each option None falling back to the keyword of the same name
    (the command's default: a serve preset's device, dtype (a function of the device), budget,
    threads, ranks), then to the device defaults (auto device; bfloat16 on CUDA, float32 on a
    CPU; budget auto = free GPU memory x GPU_MEMORY_UTILIZATION, measured now, none on a CPU). `required`: the
    command sizes its systems for one budget, so a CPU needs a size. `auto_device=False`: the
    command's --device has no `auto` (device_of)."""
    n = positive(o.tensor_parallel_size, "--tensor-parallel-size") or tensor_parallel_size
    t = o.threads if o.threads is not None else threads
    if t is not None and t < 1:
        raise UserError(f"--threads must be positive, got {t}")
    if o.dtype is not None and o.dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {o.dtype!r}")
    dec = system_decoding.parse(o.decoding if o.decoding is not None else decoding)
    dev = device_of(o.device if o.device is not None else device, auto_device)
    kind = o.dtype or (dtype(dev) if callable(dtype) else dtype) or default_dtype(dev)
    budget = resolve_budget(o.memory_budget if o.memory_budget is not None else memory_budget, dev,
                            required=required)
    return RunSetup(dev, kind, budget, t, cuda_graphs_on(o.cuda_graphs, dev), n, dec)


def check_engine_only(tensor_parallel_size: int, system: str) -> None:
    """--tensor-parallel-size splits the engine only: a command running one system refuses it for
    a baseline."""
    if tensor_parallel_size > 1 and system != ENGINE:
        raise UserError(f"--tensor-parallel-size applies to the engine only, not to system {system!r}")


def check_backends(variants, engine_defaults: Mapping[str, Any] | None, device: str, dtype: str) -> None:
    """Each engine variant's attention backend runs on `device` in `dtype` (engine.attention): a
    backend the device or dtype cannot run is refused before the run starts, not at its first point."""
    for v in variants:
        if v.is_baseline:
            continue
        name = engine_knobs(v, dict(engine_defaults or {})).get("attention_backend", "auto")
        try:
            choose_backend(name, torch.device(device), DTYPES[dtype])
        except ValueError as e:
            raise UserError(f"system {v.label!r}: {e}") from None


def variant_ranks(variant: SystemVariant, engine_defaults: Mapping[str, Any] | None = None) -> int:
    """The ranks a --systems variant runs on: an engine its tensor_parallel_size, a baseline one."""
    return 1 if variant.is_baseline else engine_knobs(variant, dict(engine_defaults or {})).get("tensor_parallel_size", 1)


def parallel_labels(variants, engine_defaults: Mapping[str, Any] | None = None) -> list[str]:
    """The labels of the variants that run over several ranks."""
    return [v.label for v in variants if variant_ranks(v, engine_defaults) > 1]


def check_one_device(tensor_parallel_size: int, label: str, command: str) -> None:
    """A command that measures one device refuses an engine over several ranks up front."""
    if tensor_parallel_size != 1:
        raise UserError(f"system {label!r}: {command} measures one device (tensor_parallel_size=1)")


def parallel_only(tensor_parallel_size: int, value: Any, otherwise: Any = "") -> Any:
    """`value` for a run whose engine spans several ranks, else `otherwise`: what a command's
    lines and records add only then (a rank count, threads per rank), decided here once."""
    return value if tensor_parallel_size > 1 else otherwise
