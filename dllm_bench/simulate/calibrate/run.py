"""One calibration: plan what to time (before any model is loaded), then peaks -> operators ->
each system's host time -> the fitted profile, written as the file `simulate --hardware` reads.

The speed gauge runs alongside (dllm_bench.speed_gauge, dllm_bench.simulate.drift): read around the operator grid and
around every timed batch, it lets the profile describe the machine at its median state over
the calibration; on a machine whose speed holds it changes nothing.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dllm_bench import inputs, speed_gauge
from dllm_bench.checkpoints.load import load_config
from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.console import progress
from dllm_bench.device_defaults import default_dtype, gpu_name, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.serve.presets import preset_for
from dllm_bench.serve.workload import model_info, preset_requests
from dllm_bench.simulate import bounds, drift, hardware
from dllm_bench.simulate.calibrate import host as host_time
from dllm_bench.simulate.calibrate import operators
from dllm_bench.simulate.cost_model import CostModel, HostCost, ModelShape
from dllm_bench.simulate.implementations import MEASURED_HOST, get_impl
from dllm_bench.simulate.simulator import DTYPE_BYTES, TORCH_DTYPES
from dllm_bench.systems.spec import baseline_knobs, engine_knobs, parse_systems
from engine.config import EngineConfig
from engine.models.llada import load_llada
from engine.sampling import SamplingParams

# Concurrent requests timed per host-time run: up to what a point of the preset can run at once
# (every request at t = 0), and at most this many (a CPU batch of 8 cpu-default requests takes
# minutes per system; a GPU serves tens at once).
MAX_SIZE = {"cpu": 8, "cuda": 64}


def default_sizes(p, device_type: str) -> tuple[int, ...]:
    """Powers of two up to the preset's largest concurrency, large and small interleaved
    (1, 4, 2, 8) so that a machine drifting during the calibration does not line up with size."""
    top = min(p.num_prompts, p.max_num_seqs, MAX_SIZE.get(device_type, 8))
    ladder = [2**i for i in range(top.bit_length()) if 2**i <= top]
    return tuple(ladder[0::2] + ladder[1::2])


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


def calibration_dtype(device_type: str, preset_dtype: str, dtype: str | None) -> str:
    """--dtype, else the device's default on CUDA (bfloat16: a CPU preset's float32 would profile
    a GPU at half its rate and twice the bytes), else the preset's."""
    if dtype is not None:
        if dtype not in TORCH_DTYPES:
            raise UserError(f"--dtype must be one of {', '.join(TORCH_DTYPES)}, got {dtype!r}")
        return dtype
    return default_dtype(device_type) if device_type == "cuda" else preset_dtype


def calibration_budget(dev) -> int:
    """The budget every size is bounded by: on CUDA the run default every command uses (free
    memory x 0.9, measured once, before the model loads); on a CPU the same share of the host's
    available RAM, which only a large preset comes near."""
    if dev.type == "cuda":
        return int(resolve_budget("auto", dev).bytes)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = dict(line.split(":", 1) for line in f)
        free = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        free = int(_memory_bytes(dev))
    return bounds.device_budget(free)


def plan(*, preset: str | None, model: str | None, device: str | None, dtype: str | None, systems: str,
         sizes: tuple[int, ...] | None) -> Plan:
    p = preset_for(preset, model)
    variants = parse_systems(systems)
    dev = torch.device(inputs.device(device or p.device))
    p = replace(p, dtype=calibration_dtype(dev.type, p.dtype, dtype), device=str(dev))
    sizes = sizes or default_sizes(p, dev.type)
    model_dir = resolve_model(p.model)
    shape = ModelShape.from_config(load_config(model_dir), DTYPE_BYTES[p.dtype])
    budget = calibration_budget(dev)
    wl = preset_requests(p, model_dir, max(sizes))
    g = max(r.gen_length for r in wl)
    length = max(len(r.prompt_ids) for r in wl) + g      # the longest canvas any timed batch pads to
    if dev.type == "cuda":     # "auto" step budgets scaled with this GPU, as serve scales them
        p = p.with_step_budgets(model_info(model_dir, p.dtype), length, gpu_name(dev), budget)
    by_variant = {}
    for v in variants:
        knobs = engine_knobs(v, p.engine_defaults())
        cap = bounds.host_cap(v.name, shape, budget, length, knobs["max_num_batched_tokens"], knobs["max_num_logits"])
        by_variant[v] = bounds.bounded_sizes(sizes, cap)
        if not by_variant[v]:
            raise UserError(f"calibrate: {v.label} cannot run one request of {length} tokens in "
                            f"{budget / 2**30:.1f} GiB on {dev} (free memory x {bounds.UTILIZATION}); "
                            "leave it out with --systems")
    # On a CPU the operators are small against the host's memory; on a GPU they are sized for the
    # largest devices and must fit what the weights leave.
    spare = bounds.spare_bytes(shape, budget) if dev.type == "cuda" else None
    return Plan(p, dev, model_dir, shape, budget, spare, by_variant, wl,
                SamplingParams(gen_length=g, steps=g, block_length=p.block_length))


def calibrate(*, preset: str | None, model: str | None, device: str | None, systems: str, name: str,
              out: Path | None, repeats: int, sizes: str | tuple[int, ...] | None, console,
              dtype: str | None = None) -> Path:
    """Profile this machine and write the profile; its path. Every option is checked before the
    first timing."""
    if out is not None:
        inputs.out_file(out, "--out")       # before minutes of profiling, not after
    if repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {repeats}")
    pl = plan(preset=preset, model=model, device=device, dtype=dtype, systems=systems,
              sizes=parse_sizes(sizes) if isinstance(sizes, str) else sizes)
    p, dev, shape = pl.preset, pl.device, pl.shape
    torch.set_num_threads(p.threads)
    dtype_t = TORCH_DTYPES[p.dtype]
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.node() or "this machine")
    console.print(f"calibrating {where}: model {p.model} ({p.dtype} on {dev}, {p.threads} threads, budget "
                  f"{pl.budget / 2**30:.1f} GiB); host time of "
                  + "; ".join(f"{v.label} at {', '.join(map(str, s))}" for v, s in pl.sizes.items())
                  + " concurrent requests")
    mdl = load_llada(pl.model_dir, dtype_t, dev)
    gauge = speed_gauge.SpeedGauge(shape.d, shape.ffn, dtype_t, repeats, device=dev)

    # 1. peaks
    reference = gauge.read()
    peak, bw = operators.measure_peaks(dtype_t, repeats, dev, pl.spare)
    console.print(f"peaks: {peak / 1e9:.1f} GFLOP/s GEMM, {bw / 1e9:.1f} GB/s copy")
    # 2. operators
    with progress(con=console) as prog:
        task = prog.add_task("operators", total=len(operators.op_plan(shape, dev.type, spare=pl.spare)))
        ops = operators.measure_ops(shape, dtype_t, repeats, device=dev, tick=lambda: prog.advance(task),
                                    spare=pl.spare)
    peak, bw = operators.peaks_from(ops, peak, bw, shape.wbytes)
    reference = (reference + gauge.read()) / 2           # the machine's speed while the operators were timed
    if dev.type == "cuda":
        torch.cuda.empty_cache()                        # the weight copies' memory, back for the engine's KV pool
    eff, op_fit = operators.fit_efficiency(ops, peak, bw, shape.wbytes)
    console.print(f"operators: u_c {eff.u_c:.3f}, u_m {eff.u_m:.3f}, u_attn {eff.u_attn:.3f}, c_op "
                  f"{eff.c_op * 1e6:.1f} us over {op_fit['ops']} ops (median error {op_fit['median_rel_err']:.1%})")
    # 3. host time
    batches, wakes = _time_host(pl, mdl, gauge, console)
    state = drift.typical_state(gauge.readings)
    peak, bw, eff = drift.at_state(peak, bw, eff, state / reference)
    console.print(f"profile at the calibration's median speed: operator times x{state / reference:.3f} (gauge "
                  f"{reference * 1e3:.4g} ms over the operators, median {state * 1e3:.4g} ms of "
                  f"{len(gauge.readings)} readings)")
    device_only = CostModel(shape, peak, bw, eff, get_impl(MEASURED_HOST), HostCost())
    host, host_fit = _fit_host(batches, wakes, device_only, reference, state, console)
    overshoot = drift.fit_overshoot([w.overshoot for w in wakes.values()])
    if overshoot:
        console.print("an idle sleep returns late by " + ", ".join(f"{late * 1e6:.0f} us at {dt * 1e3:g} ms"
                                                                   for dt, late in overshoot))
    spread = speed_gauge.drift(gauge.readings)
    if spread and spread > speed_gauge.DRIFT_WARN:
        console.print(f"[yellow]warning: this machine's speed changed by {spread:.2f}x during calibration "
                      "(a reference GEMM); operator and step times were rescaled to its median speed, but a "
                      "quieter machine gives a more trustworthy profile[/yellow]")
    hw = hardware.Hardware(
        name=name, kind="gpu" if dev.type == "cuda" else "cpu", peak_flops=peak, bandwidth=bw,
        memory_bytes=_memory_bytes(dev), efficiency=eff, host=host, impl=MEASURED_HOST, sleep_overshoot=overshoot,
        description=f"{where if dev.type == 'cuda' else platform.processor() or platform.machine()} "
        f"({platform.node()}), {p.threads} torch threads, {p.dtype}",
        sources=["measured by dllm-bench calibrate on this machine"],
        fit={"model": p.model, "preset": p.name, "dtype": p.dtype, "device": str(dev), "threads": p.threads,
             "operators": op_fit, "host": host_fit, "repeats": repeats, "budget_bytes": pl.budget,
             "sizes": list(dict.fromkeys(n for s in pl.sizes.values() for n in s)),
             "sizes_by_system": {v.name: list(s) for v, s in pl.sizes.items()},
             "speed_gauge_s": {"operators": reference, "profile": state, "readings": gauge.readings}})
    path = out or hardware.cache_dir() / f"{name}.json"
    hardware.save(hw, path)
    return path


def _time_host(pl: Plan, mdl, gauge, console) -> tuple[dict, dict]:
    """Each system's timed steps at each of its sizes, between gauge readings ((steps, reading,
    attempts) per size), and, where a request is short, one request after idle gaps. Every
    system is built afresh and freed (`host.release`) before the next."""
    prompts = [r.prompt_ids for r in pl.workload]
    batches, wakes = {}, {}
    with progress(con=console, status=True) as prog:
        task = prog.add_task("host time", total=sum(map(len, pl.sizes.values())), status="")
        for v, sizes in pl.sizes.items():
            batches[v] = []
            for n in sizes:
                prog.update(task, status=f"{v.label}, {n} concurrent")
                timed, now, attempts = drift.bracketed(lambda v=v, n=n: timed_steps(v, n, mdl, pl, prompts[:n]),
                                                       gauge.read)
                if attempts > 1:
                    console.print(f"{v.label}, {n} concurrent: timed {attempts} times, the machine's speed moved by "
                                  f"more than {drift.BRACKET_TOL:.2f}x during the batch", markup=False, highlight=False)
                batches[v].append((timed, now, attempts))
                prog.advance(task)
            lone = sum(t for _, t in batches[v][sizes.index(min(sizes))][0])
            if lone <= drift.WAKE_MAX_REQUEST_S:
                prog.update(task, status=f"{v.label}, one request after idle gaps")
                wakes[v] = drift.after_gaps(plain_system(v, mdl, pl), prompts, pl.params, drift.WAKE_GAPS,
                                            drift.WAKE_ROUNDS, pl.device)
                host_time.release(pl.device)
    return batches, wakes


def _fit_host(batches: dict, wakes: dict, device_only: CostModel, reference: float, state: float,
              console) -> tuple[dict, dict]:
    """Each system's host cost (and wake cost) from its timed steps rescaled to the profile's state."""
    host, host_fit = {}, {}
    for v, timed_batches in batches.items():
        steps = [s for timed, now, _ in timed_batches for s in drift.at_reference_speed(timed, state, now)]
        hc, fit = host_time.fit_host(steps, device_only)
        if v in wakes:
            w, tau, fit["wake"] = drift.fit_wake(wakes[v].request)
            hc = replace(hc, wake_s=w, wake_tau_s=tau, c_add=drift.hand_over_s(wakes[v]))
        fit["speed_vs_operators"] = [reference / now for _, now, _ in timed_batches]
        fit["attempts"] = [a for _, _, a in timed_batches]
        host[f"{MEASURED_HOST}/{v.name}"], host_fit[v.name] = hc, fit
        split = ", ".join(f"{k} {e:+.0%}" for k, e in fit["median_err_by_rows"].items())
        by_size = ", ".join(f"{n} {e:+.1%}" for n, e in fit["total_err_by_seqs"].items())
        console.print(f"host {v.label}: {host_terms(hc)} ({fit['steps']} steps, median error "
                      f"{fit['median_rel_err']:.1%}; signed, by query rows: {split}; charged over taken, by "
                      f"sequences: {by_size}; machine speed vs the operator "
                      f"timings {', '.join(f'{x:.2f}x' for x in fit['speed_vs_operators'])}, step times rescaled)")
        if v in wakes:
            console.print(f"  after an idle gap {v.label} takes {hc.wake_s * 1e3:.2f} ms more (tau "
                          f"{hc.wake_tau_s * 1e3:.0f} ms; one request back to back: {fit['wake']['request_s'] * 1e3:.1f} ms, "
                          f"handing it over {hc.c_add * 1e6:.0f} us)")
    return host, host_fit


def host_terms(h: HostCost) -> str:
    return f"{h.c_step * 1e3:.2f} ms/step + {h.c_seq * 1e3:.3f} ms/sequence + {h.c_row * 1e6:.1f} us/query row"


def _knobs(v, pl: Plan):
    """A system's knobs on the preset (as serve runs it): the baseline's, or the engine's config
    (on CUDA with the calibration's budget, so its KV pool is the one the sizes were bounded by)."""
    p = pl.preset
    if v.is_baseline:
        knobs = {k: dict(x) for k, x in p.baseline_knobs.items()}
        knobs.setdefault("sparse-dllm", {})["keep_ratio"] = p.retention
        return baseline_knobs(v, knobs)
    cuda_budget = {"memory_budget": pl.budget} if pl.device.type == "cuda" and pl.budget else {}
    return EngineConfig(dtype=p.dtype, device=str(pl.device), sampling=False, **cuda_budget,
                        **engine_knobs(v, p.engine_defaults()))


def timed_steps(v, n: int, mdl, pl: Plan, prompts) -> list:
    """One system's steps over `n` concurrent requests."""
    if v.is_baseline:
        return host_time.baseline_steps(mdl, v.name, _knobs(v, pl), pl.shape, prompts, pl.params)
    return host_time.engine_steps(mdl, _knobs(v, pl), pl.shape, prompts, pl.params)


def plain_system(v, mdl, pl: Plan):
    if v.is_baseline:
        return host_time.plain_baseline(mdl, v.name, _knobs(v, pl))
    return host_time.plain_engine(mdl, _knobs(v, pl))


def _memory_bytes(dev) -> float:
    """The memory a serving budget is taken from: the GPU's own, or this host's RAM."""
    if dev.type == "cuda":
        return float(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8.0 * 2**30
