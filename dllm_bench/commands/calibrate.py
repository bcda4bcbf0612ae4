"""`dllm-bench calibrate`: profile this machine's operators and each system's host time, fit a
hardware profile and write it as the file `dllm-bench simulate --hardware` reads
(dllm_bench/simulate/calibrate.py, docs/SIMULATE.md)."""
from __future__ import annotations

import platform
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import typer

from dllm_bench import inputs
from dllm_bench.checkpoints.load import load_config
from dllm_bench.checkpoints.store import resolve_model
from dllm_bench.console import progress
from dllm_bench.device_defaults import default_dtype, resolve_budget
from dllm_bench.errors import UserError
from dllm_bench.serve.presets import preset_for
from dllm_bench.serve.speed_gauge import DRIFT_WARN, SpeedGauge, drift
from dllm_bench.serve.workload import preset_requests
from dllm_bench.simulate import bounds, hardware, host_profile
from dllm_bench.simulate import calibrate as cal
from dllm_bench.simulate.cost_model import CostModel, HostCost, ModelShape
from dllm_bench.simulate.implementations import MEASURED_HOST, get_impl
from dllm_bench.simulate.simulator import DTYPE_BYTES, TORCH_DTYPES
from dllm_bench.systems.spec import DEFAULT_SYSTEMS, baseline_knobs, engine_knobs, parse_systems
from engine.config import EngineConfig
from engine.models.llada import load_llada
from engine.sampling import SamplingParams

# Concurrent requests timed per host-time run: up to what a point of the preset can run at once
# (every request at t = 0), and at most this many (a CPU batch of 8 cpu-default requests takes
# minutes per system; a GPU serves tens at once).
MAX_SIZE = {"cpu": 8, "cuda": 64}
# A request is timed alone after idle gaps (HostCost.wake) when it takes at most this long: the
# wake cost is milliseconds, nothing to a request of seconds, and the measurement costs rounds of them.
# The same timings give the cost of handing a request over (add_request, outside the steps) and
# how late the idle sleeps return: both fractions of a millisecond, ignored where requests take longer.
WAKE_GAPS, WAKE_ROUNDS, WAKE_MAX_REQUEST_S = (0.0, 0.001, 0.01, 0.03, 0.1, 0.3), 16, 0.5


def default_sizes(p, device_type: str) -> tuple[int, ...]:
    """Powers of two up to the preset's largest concurrency, large and small interleaved
    (1, 4, 2, 8) so that a machine drifting during the calibration does not line up with size."""
    top = min(p.num_prompts, p.max_num_seqs, MAX_SIZE.get(device_type, 8))
    ladder = [2**i for i in range(top.bit_length()) if 2**i <= top]
    return tuple(ladder[0::2] + ladder[1::2])


@dataclass
class Plan:
    """What a calibration will time, resolved before any model is loaded (tests fake a GPU and
    read it): the device, the dtype, the memory budget and every size bounded by it."""

    preset: object                     # the serve preset with the resolved dtype and device
    device: object                     # torch.device
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
    import torch

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
              out: Path | None, repeats: int, sizes: tuple[int, ...] | None, console,
              dtype: str | None = None) -> Path:
    import torch

    if repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {repeats}")
    pl = plan(preset=preset, model=model, device=device, dtype=dtype, systems=systems, sizes=sizes)
    p, dev, shape, model_dir = pl.preset, pl.device, pl.shape, pl.model_dir
    all_sizes = tuple(dict.fromkeys(n for s in pl.sizes.values() for n in s))
    torch.set_num_threads(p.threads)
    dtype_t = TORCH_DTYPES[p.dtype]
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.node() or "this machine")
    console.print(f"calibrating {where}: model {p.model} ({p.dtype} on {dev}, {p.threads} threads, budget "
                  f"{pl.budget / 2**30:.1f} GiB); host time of "
                  + "; ".join(f"{v.label} at {', '.join(map(str, s))}" for v, s in pl.sizes.items())
                  + " concurrent requests")
    mdl = load_llada(model_dir, dtype_t, dev)

    gauge = SpeedGauge(shape.d, shape.ffn, dtype_t, repeats, device=dev)
    reference = gauge.read()
    peak, bw = cal.measure_peaks(dtype_t, repeats, dev, pl.spare)
    console.print(f"peaks: {peak / 1e9:.1f} GFLOP/s GEMM, {bw / 1e9:.1f} GB/s copy")
    with progress(con=console) as prog:
        task = prog.add_task("operators", total=len(cal.op_plan(shape, dev.type, spare=pl.spare)))
        ops = cal.measure_ops(shape, dtype_t, repeats, device=dev, tick=lambda: prog.advance(task), spare=pl.spare)
    peak, bw = cal.peaks_from(ops, peak, bw, shape.wbytes)
    reference = (reference + gauge.read()) / 2           # the machine's speed while the operators were timed
    if dev.type == "cuda":
        torch.cuda.empty_cache()                        # the weight copies' memory, back for the engine's KV pool
    eff, op_fit = cal.fit_efficiency(ops, peak, bw, shape.wbytes)
    console.print(f"operators: u_c {eff.u_c:.3f}, u_m {eff.u_m:.3f}, u_attn {eff.u_attn:.3f}, c_op "
                  f"{eff.c_op * 1e6:.1f} us over {op_fit['ops']} ops (median error {op_fit['median_rel_err']:.1%})")

    batches, wakes = _time_host(pl.sizes, mdl, shape, pl.workload, pl.params, p, dev, gauge, console, pl.budget)
    # The profile describes the machine in its typical state over the whole calibration (the median
    # gauge reading), not in the minutes of the operator grid: operators and steps are rescaled to it.
    state = cal.typical_state(gauge.readings)
    peak, bw, eff = cal.at_state(peak, bw, eff, state / reference)
    console.print(f"profile at the calibration's median speed: operator times x{state / reference:.3f} (gauge "
                  f"{reference * 1e3:.4g} ms over the operators, median {state * 1e3:.4g} ms of "
                  f"{len(gauge.readings)} readings)")
    device_only = CostModel(shape, peak, bw, eff, get_impl(MEASURED_HOST), HostCost())
    host, host_fit = _fit_host(batches, wakes, device_only, reference, state, console)
    overshoot = cal.fit_overshoot([w.overshoot for w in wakes.values()])
    if overshoot:
        console.print("an idle sleep returns late by " + ", ".join(f"{late * 1e6:.0f} us at {dt * 1e3:g} ms"
                                                                   for dt, late in overshoot))
    spread = drift(gauge.readings)
    if spread and spread > DRIFT_WARN:
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
             "operators": op_fit,
             "host": host_fit, "sizes": list(all_sizes), "repeats": repeats, "budget_bytes": pl.budget,
             "sizes_by_system": {v.name: list(s) for v, s in pl.sizes.items()},
             "speed_gauge_s": {"operators": reference, "profile": state, "readings": gauge.readings}})
    path = out or hardware.cache_dir() / f"{name}.json"
    hardware.save(hw, path)
    return path


def _time_host(sizes_by: dict, mdl, shape, wl, params, p, dev, gauge, console, budget: int) -> tuple[dict, dict]:
    """Each system's timed steps at each of its sizes, between gauge readings ((steps, reading,
    attempts) per size), and, where a request is short, one request after idle gaps. Every
    system is built afresh and freed (`host_profile.release`) before the next."""
    batches, wakes = {}, {}
    with progress(con=console, status=True) as prog:
        task = prog.add_task("host time", total=sum(map(len, sizes_by.values())), status="")
        for v, sizes in sizes_by.items():
            batches[v] = []
            for n in sizes:
                prog.update(task, status=f"{v.label}, {n} concurrent")
                timed, now, attempts = cal.bracketed(
                    lambda v=v, n=n: timed_steps(v, n, mdl, shape, [r.prompt_ids for r in wl[:n]], params, p, dev,
                                                 budget),
                    gauge.read)
                if attempts > 1:
                    console.print(f"{v.label}, {n} concurrent: timed {attempts} times, the machine's speed moved by "
                                  f"more than {cal.BRACKET_TOL:.2f}x during the batch", markup=False, highlight=False)
                batches[v].append((timed, now, attempts))
                prog.advance(task)
            lone = sum(t for _, t in batches[v][sizes.index(min(sizes))][0])
            if lone <= WAKE_MAX_REQUEST_S:
                prog.update(task, status=f"{v.label}, one request after idle gaps")
                wakes[v] = host_profile.after_gaps(plain_system(v, mdl, p, dev, budget), [r.prompt_ids for r in wl],
                                                   params, WAKE_GAPS, WAKE_ROUNDS, dev)
                host_profile.release(dev)
    return batches, wakes


def _fit_host(batches: dict, wakes: dict, device_only: CostModel, reference: float, state: float,
              console) -> tuple[dict, dict]:
    """Each system's host cost (and wake cost) from its timed steps rescaled to the profile's state."""
    host, host_fit = {}, {}
    for v, timed_batches in batches.items():
        steps = [s for timed, now, _ in timed_batches for s in cal.at_reference_speed(timed, state, now)]
        hc, fit = cal.fit_host(steps, device_only)
        if v in wakes:
            w, tau, fit["wake"] = cal.fit_wake(wakes[v].request)
            hc = replace(hc, wake_s=w, wake_tau_s=tau, c_add=statistics.median(wakes[v].add[0.0]))
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


def merge_profiles(specs: str, name: str, out: Path | None, console) -> Path:
    """`--merge`: the median profile of several calibrations (dllm_bench.simulate.merge)."""
    from dllm_bench.simulate.merge import merge

    names = [x.strip() for x in specs.split(",") if x.strip()]
    hw = merge([hardware.load(n, "--merge") for n in names], name)
    path = out or hardware.cache_dir() / f"{name}.json"
    if any(hardware.resolve_path(n, "--merge").resolve() == path.resolve() for n in names):
        raise UserError(f"--merge: {path} is one of the profiles merged; give another --name or --out")
    hardware.save(hw, path)
    for k, h in hw.host.items():
        console.print(f"host {k.split('/', 1)[-1]}: {host_terms(h)} (median of {len(names)} calibrations at "
                      f"{', '.join(map(str, hw.fit['sizes']))} sequences)")
    return path


def host_terms(h: HostCost) -> str:
    return f"{h.c_step * 1e3:.2f} ms/step + {h.c_seq * 1e3:.3f} ms/sequence + {h.c_row * 1e6:.1f} us/query row"


def _knobs(v, p, dev, budget: int | None = None):
    """A system's knobs on the preset (as serve runs it): the baseline's, or the engine's config
    (on CUDA with the calibration's budget, so its KV pool is the one the sizes were bounded by)."""
    if v.is_baseline:
        knobs = {k: dict(x) for k, x in p.baseline_knobs.items()}
        knobs.setdefault("sparse-dllm", {})["keep_ratio"] = p.retention
        return baseline_knobs(v, knobs)
    cuda_budget = {"memory_budget": budget} if dev.type == "cuda" and budget else {}
    return EngineConfig(dtype=p.dtype, device=str(dev), sampling=False, **cuda_budget,
                        **engine_knobs(v, p.engine_defaults()))


def timed_steps(v, n: int, mdl, shape: ModelShape, prompts, params, p, dev, budget: int | None = None) -> list:
    """One system's steps over `n` concurrent requests."""
    if v.is_baseline:
        return host_profile.baseline_steps(mdl, v.name, _knobs(v, p, dev), shape, prompts, params)
    return host_profile.engine_steps(mdl, _knobs(v, p, dev, budget), shape, prompts, params)


def plain_system(v, mdl, p, dev, budget: int | None = None):
    if v.is_baseline:
        return host_profile.plain_baseline(mdl, v.name, _knobs(v, p, dev))
    return host_profile.plain_engine(mdl, _knobs(v, p, dev, budget))


def _memory_bytes(dev) -> float:
    """The memory a serving budget is taken from: the GPU's own, or this host's RAM."""
    import os

    import torch

    if dev.type == "cuda":
        return float(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8.0 * 2**30


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise UserError(f"--sizes must be a comma list of positive integers, got {text!r}")
    return sizes


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
                                         "[powers of 2 up to the preset's concurrency, at most 8 on a CPU and "
                                         "64 on a GPU: 1,2 for cpu-default]"),
        merge: str | None = typer.Option(None, "--merge", help="profile names or files, comma-separated: profile "
                                         "nothing, write their median as NAME (a machine whose speed wanders)"),
    ) -> None:
        """Profile this machine's CPU or GPU (GEMMs, attention, host time per system) and write a hardware
        profile."""
        from rich.console import Console

        if out is not None:
            inputs.out_file(out, "--out")       # before minutes of profiling, not after
        if merge is not None:
            if any(x is not None for x in (preset, model, device, sizes, dtype)):
                raise UserError("--merge combines calibrated profiles: it takes no --preset, --model, --device, "
                                "--dtype or --sizes")
            typer.echo(str(merge_profiles(merge, name, out, Console(stderr=True))))
            return
        path = calibrate(preset=preset, model=model, device=device, systems=systems, name=name, out=out,
                         repeats=repeats, sizes=_sizes(sizes) if sizes is not None else None,
                         console=Console(stderr=True), dtype=dtype)
        typer.echo(str(path))
