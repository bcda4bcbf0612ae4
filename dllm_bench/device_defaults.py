"""The engine's device defaults (engine.config: bfloat16 and CUDA graphs on CUDA, an automatic
budget of the free memory x GPU_MEMORY_UTILIZATION) applied to a command's device; a
`SimulatedGpu` (`simulate` on a GPU profile) takes CUDA's, its memory standing for the free memory.

A CUDA budget is measured once, when a run's options are resolved, handed to every system of the
run and recorded in config.json: each measuring its own would see what the one before left cached.
`--memory-budget` takes a size (`22GiB`), `auto` (the default above; on a CPU no budget, or a
UserError where a command needs one) or `none` (unbounded on a CPU, the engine's own default on CUDA).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from dllm_bench.errors import UserError
from dllm_bench.units import format_size, parse_size
from engine import config as engine_defaults
from engine.config import DTYPES, GPU_MEMORY_UTILIZATION
from engine.profiler import budget_from_free


@dataclass(frozen=True)
class SimulatedGpu:
    """The GPU of a hardware profile, as the device a simulated run resolves its options for: the
    same defaults `serve` takes on that GPU (bfloat16, CUDA graphs, the GPU preset, step budgets
    and ridge scaled with it), its memory standing for the free memory `auto` would measure."""
    name: str                 # the profile's name (h100)
    memory_bytes: int
    peak_flops: float         # what its ridge is computed from (dllm_bench.systems.ridge)
    bandwidth: float
    # a step's fixed cost beyond its roofline (the profile's host c_step and kernel costs), per
    # step and per layer: the engine's overhead_rows (dllm_bench.systems.ridge)
    step_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.name} (simulated)"


Device = str | torch.device | SimulatedGpu | None


def resolve_device(device: Device) -> torch.device:
    """`auto` (or None) -> cuda when present, else cpu; a SimulatedGpu -> cuda; anything else as given."""
    if isinstance(device, SimulatedGpu):
        return torch.device("cuda")
    try:
        return engine_defaults.resolve_device("auto" if device is None else str(device))
    except RuntimeError:
        raise UserError(f"--device must be auto, cpu or cuda[:N], got {device!r}") from None


def is_cuda(device: Device) -> bool:
    return resolve_device(device).type == "cuda"


def default_dtype(device: Device) -> str:
    """The engine's default dtype on `device` (engine.config.default_dtype: bfloat16 on CUDA)."""
    return engine_defaults.default_dtype(resolve_device(device))


def cuda_graphs_on(flag: bool | None, device: Device) -> bool:
    """`--cuda-graphs/--no-cuda-graphs` (None: not given) on `device`, by the engine's rule
    (engine.config.cuda_graphs_on), resolved here so config.json says what ran."""
    return engine_defaults.cuda_graphs_on(flag, resolve_device(device))


def gpu_identity(device: str | torch.device | None) -> dict | None:
    """Name and total memory of a CUDA device (None on CPU): what a measured profile depends on
    besides the code, the model and the knobs."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        return None
    return {"name": torch.cuda.get_device_name(dev),
            "total_memory": int(torch.cuda.get_device_properties(dev).total_memory)}


def gpu_name(device: Device) -> str | None:
    """The name of a CUDA device (None on CPU): what a run scaled for its memory says it ran on."""
    if isinstance(device, SimulatedGpu):
        return device.label
    dev = resolve_device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else None


def free_device_memory(device: str | torch.device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device (`auto` resolved) once this process's cached blocks are returned."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(resolve_device(device))
    return int(free), int(total)


@dataclass(frozen=True)
class MemoryBudget:
    bytes: int | None      # None = no budget
    spec: str              # what was asked for: a size, "auto" or "none"
    detail: str            # how the number came about, for config.json and the run's header

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_budget(value: str | None, device: Device, *, required: bool = False,
                   flag: str = "--memory-budget") -> MemoryBudget:
    """A budget option (None = `auto`) -> bytes on `device`, measured now on CUDA (a SimulatedGpu:
    its memory stands for the free memory). `required`: the command cannot run without one
    (serve measures baselines' largest batches in it), so on a CPU `auto` and `none` are a
    UserError instead of no budget."""
    text = "auto" if value is None else str(value).strip()
    low = text.lower()
    dev = resolve_device(device)
    if low == "none":
        if required:
            raise UserError(f"{flag} none: this command sizes every system for one budget; give a size "
                            f"(e.g. {flag} 1GiB)" + (" or auto" if dev.type == "cuda" else ""))
        return MemoryBudget(None, "none", "no budget (unbounded)")
    if low != "auto":
        n = parse_size(text, flag)
        return MemoryBudget(n, text, f"{format_size(n)} as given")
    if dev.type != "cuda":
        if required:
            raise UserError(f"a {flag} is needed on CPU (e.g. {flag} 1GiB): `auto` measures free "
                            "GPU memory, and a CPU has none to measure")
        return MemoryBudget(None, "auto", "no budget (auto on CPU: unbounded)")
    if isinstance(device, SimulatedGpu):
        n = budget_from_free(device.memory_bytes, 0, GPU_MEMORY_UTILIZATION)
        return MemoryBudget(n, "auto", f"auto: {GPU_MEMORY_UTILIZATION:g} x {format_size(device.memory_bytes)}, "
                                       f"the memory of {device.label}")
    free, total = free_device_memory(dev)
    n = budget_from_free(free, 0, GPU_MEMORY_UTILIZATION)   # measured before any weights are loaded
    if n < 1:
        raise UserError(f"{flag} auto: {dev} has no free memory")
    name = torch.cuda.get_device_name(dev)
    return MemoryBudget(n, "auto", f"auto: {GPU_MEMORY_UTILIZATION:g} x {format_size(free)} free of "
                                   f"{format_size(total)} on {name} ({dev}), measured at the start of the run")


@dataclass(frozen=True)
class DeviceOptions:
    device: torch.device
    dtype: str
    budget: MemoryBudget


def resolve_device_options(device: str | None, dtype: str | None, memory_budget: str | None = "none", *,
                           required: bool = False) -> DeviceOptions:
    """--device (auto when None), --dtype (the device's default when None) and --memory-budget of
    a command that runs in this process (generate, accuracy, the lm-eval model, server)."""
    dev = resolve_device(device)
    if dev.type not in ("cpu", "cuda"):
        raise UserError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: CUDA is not available here (use --device cpu)")
    dtype = dtype or default_dtype(dev)
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DeviceOptions(dev, dtype, resolve_budget(memory_budget, dev, required=required))
