"""What a calibration will time, resolved before any model is loaded (tests fake a GPU and read
it): the device and how it is timed (mode.Mode), the dtype, the memory budget and every host-time
size bounded by it: on a CPU a few interleaved sizes, on a GPU every power of two up to the largest
batch the budget admits (and that batch itself), where rows per second stop growing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dllm_bench.checkpoints.load import load_config
from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.device_defaults import default_dtype, gpu_name, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.serve.presets import preset_for
from dllm_bench.serve.workload import model_info, preset_requests
from dllm_bench.simulate import bounds
from dllm_bench.simulate.calibrate.mode import Mode, mode_for
from dllm_bench.simulate.cost_model import ModelShape
from dllm_bench.simulate.simulator import DTYPE_BYTES
from dllm_bench.systems.families import for_family
from dllm_bench.systems.options import RunOptions, check_one_device, resolve, variant_ranks
from dllm_bench.systems.spec import (
    DEFAULT_SYSTEMS,
    baseline_knobs,
    engine_knobs,
    parse_systems,
    retention_knobs,
)
from engine.config import EngineConfig
from engine.sampling import SamplingParams

# Concurrent requests timed per host-time run: up to what a point of the preset can run at once
# (every request at t = 0), and at most this many (a CPU batch of 8 cpu-default requests takes
# minutes per system; a GPU serves tens at once).
MAX_SIZE = {"cpu": 8, "cuda": 64}


def default_sizes(p, device_type: str) -> tuple[int, ...]:
    """Powers of two up to the preset's largest concurrency. On a CPU large and small interleaved
    (1, 4, 2, 8) so that a machine drifting during the calibration does not line up with size; on
    a GPU ascending, so that the calibration can stop where rows per second saturate."""
    top = min(p.num_prompts, p.max_num_seqs, MAX_SIZE.get(device_type, 8))
    ladder = [2**i for i in range(top.bit_length()) if 2**i <= top]
    return tuple(ladder) if device_type == "cuda" else tuple(ladder[0::2] + ladder[1::2])


def sizes_within(sizes: tuple[int, ...], cap: int, up_to_cap: bool) -> tuple[int, ...]:
    """The sizes a system can run (`bounds.bounded_sizes`); with `up_to_cap` the largest batch the
    budget admits joins them when it lies below the largest size asked for: where a baseline serves."""
    out = bounds.bounded_sizes(sizes, cap)
    if up_to_cap and out and cap < max(sizes) and cap not in out:
        out = (*out, cap)
    return out


def parse_sizes(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise UserError(f"--sizes must be a comma list of positive integers, got {text!r}")
    return sizes


@dataclass(frozen=True)
class CalibrateOptions(RunOptions):
    """`calibrate`'s options as given (field names are its CLI parameters'): the run options it
    exposes (device, dtype; threads are the preset's) and its own."""
    preset: str | None = None
    model: str | None = None
    systems: str = DEFAULT_SYSTEMS
    name: str = "cpu"
    out: Path | None = None
    repeats: int = 5
    sizes: str | tuple[int, ...] | None = None      # --sizes' text, or the sizes themselves


@dataclass
class Plan:
    """What a calibration will time, resolved before any model is loaded (tests fake a GPU and
    read it): the device, the dtype, the memory budget and every size bounded by it."""

    preset: object                     # the serve preset with the resolved dtype and device
    device: torch.device
    model_dir: Path
    shape: ModelShape
    budget: int                        # bytes, weights included
    spare: float | None                # bytes one timed operator may take; None = unbounded (CPU)
    sizes: dict                        # variant -> its bounded host-time sizes
    workload: list
    params: SamplingParams
    mode: Mode                         # how the device is timed (mode.CPU / mode.GPU)
    default_sizes: bool = True         # sizes chosen here (a GPU may stop at saturation), not --sizes


def calibration_dtype(device: torch.device, preset_dtype: str) -> str:
    """Without --dtype: the device's default on CUDA (bfloat16: a CPU preset's float32 would
    profile a GPU at half its rate and twice the bytes), else the preset's."""
    return default_dtype(device) if device.type == "cuda" else preset_dtype


def calibration_budget(dev) -> int:
    """The budget every size is bounded by: on CUDA the run default every command uses (free
    memory x GPU_MEMORY_UTILIZATION, measured once, before the model loads); on a CPU the same share of the host's
    available RAM, which only a large preset comes near."""
    if dev.type == "cuda":
        return int(resolve_budget("auto", dev).bytes)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = dict(line.split(":", 1) for line in f)
        free = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        free = int(memory_bytes(dev))
    return bounds.device_budget(free)


def plan(o: CalibrateOptions) -> Plan:
    """What `o` times, every option checked; the run options through dllm_bench.systems.options
    (--device cpu or cuda[:N], else the preset's; the preset's threads). The memory budget is the
    calibration's own (calibration_budget), not a run option."""
    sizes = parse_sizes(o.sizes) if isinstance(o.sizes, str) else o.sizes
    p = preset_for(o.preset, o.model)
    variants = parse_systems(o.systems)
    run = resolve(replace(o.run_options(), device=o.device or p.device), auto_device=False,
                  dtype=lambda dev: calibration_dtype(dev, p.dtype), memory_budget="none", threads=p.threads)
    dev = run.device
    p = replace(p, dtype=run.dtype, device=str(dev), threads=run.threads)
    mode = mode_for(dev)
    chosen = sizes is None
    sizes = sizes or default_sizes(p, dev.type)
    model_dir = resolve_model(p.model)
    cfg = load_config(model_dir)
    shape = ModelShape.from_config(cfg, DTYPE_BYTES[p.dtype])
    # the default systems: those with a version for the model's family; a named one it lacks: refused
    variants = for_family(variants, cfg.model_type, explicit=o.systems != DEFAULT_SYSTEMS)
    budget = calibration_budget(dev)
    wl = preset_requests(p, model_dir, max(sizes))
    g = max(r.gen_length for r in wl)
    length = max(len(r.prompt_ids) for r in wl) + g      # the longest canvas any timed batch pads to
    if dev.type == "cuda":     # "auto" step budgets scaled with this GPU, as serve scales them
        p = p.with_step_budgets(model_info(model_dir, p.dtype), length, gpu_name(dev), budget)
    by_variant = {}
    for v in variants:
        check_one_device(variant_ranks(v, p.engine_defaults()), v.label, "calibrate")
        ek = engine_knobs(v, p.engine_defaults())
        cap = bounds.host_cap(v.name, shape, budget, length, ek["max_num_batched_tokens"], ek["max_num_logits"])
        by_variant[v] = sizes_within(sizes, cap, chosen and mode.saturate)
        if not by_variant[v]:
            raise UserError(f"calibrate: {v.label} cannot run one request of {length} tokens in "
                            f"{budget / 2**30:.1f} GiB on {dev} (free memory x {bounds.UTILIZATION}); "
                            "leave it out with --systems")
    # On a CPU the operators are small against the host's memory; on a GPU they are sized for the
    # largest devices and must fit what the weights leave.
    spare = bounds.spare_bytes(shape, budget) if dev.type == "cuda" else None
    return Plan(p, dev, model_dir, shape, budget, spare, by_variant, wl,
                SamplingParams(gen_length=g, steps=g, block_length=p.block_length), mode, chosen)


def knobs(v, pl: Plan):
    """A system's knobs on the preset (as serve runs it): the baseline's, or the engine's config
    (on CUDA with the calibration's budget, so its KV pool is the one the sizes were bounded by)."""
    p = pl.preset
    if v.is_baseline:
        knobs = {k: dict(x) for k, x in p.baseline_knobs.items()}
        for name, r in retention_knobs(p.retention).items():
            knobs.setdefault(name, {}).update(r)
        return baseline_knobs(v, knobs)
    cuda_budget = {"memory_budget": pl.budget} if pl.device.type == "cuda" and pl.budget else {}
    return EngineConfig(dtype=p.dtype, device=str(pl.device), sampling=False, **cuda_budget,
                        **engine_knobs(v, p.engine_defaults()))


def memory_bytes(dev) -> float:
    """The memory a serving budget is taken from: the GPU's own, or this host's RAM."""
    if dev.type == "cuda":
        return float(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8.0 * 2**30
