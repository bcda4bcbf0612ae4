"""One calibration: plan what to time (plan.py, before any model is loaded), then peaks ->
operators -> each system's host time -> the fitted profile, written as the file `simulate
--hardware` reads.

On a CPU the speed gauge runs alongside (dllm_bench.serve.speed_gauge, dllm_bench.simulate.drift): read around the operator
grid and around every timed batch, it lets the profile describe the machine at its median state
over the calibration. A GPU is timed as a GPU (mode.GPU): operators by CUDA events after
warm-up, each batch warmed on its own shapes then timed for a bounded number of steps, sizes
ascending to the largest batch the budget admits, and its clocks read through NVML instead of a
gauge (clocks.py).
"""
from __future__ import annotations

import platform
from dataclasses import replace
from pathlib import Path

import torch

from dllm_bench import inputs
from dllm_bench.console import progress
from dllm_bench.errors import UserError
from dllm_bench.serve import speed_gauge
from dllm_bench.simulate import drift, hardware
from dllm_bench.simulate.calibrate import host as host_time
from dllm_bench.simulate.calibrate import operators
from dllm_bench.simulate.calibrate.clocks import open_clocks
from dllm_bench.simulate.calibrate.plan import CalibrateOptions, Plan, knobs, memory_bytes, plan  # noqa: F401 (re-exported)
from dllm_bench.simulate.cost_model import CostModel, HostCost
from dllm_bench.simulate.implementations import MEASURED_HOST, get_impl
from dllm_bench.simulate.simulator import TORCH_DTYPES
from engine.models import load_model

SATURATED = 1.05          # a size whose rows/s beat the best before it by less than this: saturated
POOR_FIT = 0.2            # a host fit whose median step error exceeds this describes its steps poorly


def calibrate(o: CalibrateOptions, console) -> Path:
    """Profile this machine and write the profile; its path. Every option is checked before the
    first timing."""
    inputs.profile_name(o.name, "--name")     # all before minutes of profiling, not after
    out = inputs.out_file(o.out, "--out") if o.out is not None else \
        inputs.out_file(hardware.cache_dir() / f"{o.name}.json", "--name's profile file")
    if o.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {o.repeats}")
    pl = plan(o)
    repeats = o.repeats
    p, dev, shape, mode = pl.preset, pl.device, pl.shape, pl.mode
    torch.set_num_threads(p.threads)
    dtype_t = TORCH_DTYPES[p.dtype]
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.node() or "this machine")
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    say(f"calibrating {where}: model {p.model} ({p.dtype} on {dev}, {p.threads} threads, budget "
        f"{pl.budget / 2**30:.1f} GiB); host time of "
        + "; ".join(f"{v.label} at {', '.join(map(str, s))}" for v, s in pl.sizes.items()) + " concurrent requests"
        + (f" (each batch warmed {mode.warm_steps} steps, then {mode.timed_steps} timed; ascending sizes stop "
           "where rows/s saturate)" if mode.timed_steps else ""))
    mdl = load_model(pl.model_dir, dtype_t, dev)
    gauge = speed_gauge.SpeedGauge(shape.d, shape.ffn, dtype_t, repeats, device=dev) if mode.gauge else None
    clocks, why = (None, "") if mode.gauge else open_clocks(dev)
    if why:
        say(why)
    tick = clocks.read if clocks is not None else (lambda: None)     # a GPU's clocks, read between phases
    timer = mode.timer(dev)

    # 1. peaks
    reference = gauge.read() if gauge is not None else None
    tick()
    peak, bw = operators.measure_peaks(dtype_t, repeats, dev, pl.spare, timer)
    say(f"peaks: {peak / 1e9:.1f} GFLOP/s GEMM, {bw / 1e9:.1f} GB/s copy")
    # 2. operators
    with progress(con=console) as prog:
        task = prog.add_task("operators", total=len(operators.op_plan(shape, dev.type, spare=pl.spare)))
        ops = operators.measure_ops(shape, dtype_t, repeats, device=dev, tick=lambda: prog.advance(task),
                                    spare=pl.spare, timer=timer)
    peak, bw = operators.peaks_from(ops, peak, bw, shape.wbytes)
    if gauge is not None:
        reference = (reference + gauge.read()) / 2     # the machine's speed while the operators were timed
    tick()
    if dev.type == "cuda":
        torch.cuda.empty_cache()                        # the weight copies' memory, back for the engine's KV pool
    eff, op_fit = operators.fit_efficiency(ops, peak, bw, shape.wbytes)
    say(f"operators: u_c {eff.u_c:.3f}, u_m {eff.u_m:.3f}, u_attn {eff.u_attn:.3f}, c_op {eff.c_op * 1e6:.1f} us over "
        f"{op_fit['ops']} ops (median error {op_fit['median_rel_err']:.1%})")
    # 3. host time
    batches, wakes = _time_host(pl, mdl, gauge.read if gauge is not None else None, console, tick)
    state = reference
    if gauge is not None:
        state = drift.typical_state(gauge.readings)
        peak, bw, eff = drift.at_state(peak, bw, eff, state / reference)
        say(f"profile at the calibration's median speed: operator times x{state / reference:.3f} (gauge "
            f"{reference * 1e3:.4g} ms over the operators, median {state * 1e3:.4g} ms of {len(gauge.readings)} readings)")
    device_only = CostModel(shape, peak, bw, eff, get_impl(MEASURED_HOST), HostCost())
    host, host_fit = _fit_host(batches, wakes, device_only, reference, state, console)
    overshoot = drift.fit_overshoot([w.overshoot for w in wakes.values()])
    if overshoot:
        say("an idle sleep returns late by " + ", ".join(f"{late * 1e6:.0f} us at {dt * 1e3:g} ms" for dt, late in overshoot))
    fit = {"model": p.model, "preset": p.name, "dtype": p.dtype, "device": str(dev), "threads": p.threads,
           "timing": mode.name, "operators": op_fit, "host": host_fit, "repeats": repeats, "budget_bytes": pl.budget,
           "sizes": list(dict.fromkeys(n for s in pl.sizes.values() for n in s)),
           "sizes_by_system": {v.name: list(s[:len(batches[v])]) for v, s in pl.sizes.items()}}
    if gauge is not None:
        fit["speed_gauge_s"] = {"operators": reference, "profile": state, "readings": gauge.readings}
        spread = speed_gauge.drift(gauge.readings)
        if spread and spread > speed_gauge.DRIFT_WARN:
            console.print(f"[yellow]warning: this machine's speed changed by {spread:.2f}x during calibration "
                          "(a reference GEMM); operator and step times were rescaled to its median speed, but a "
                          "quieter machine gives a more trustworthy profile[/yellow]")
    if clocks is not None:
        fit["clocks"] = clocks.summary()
        say(clocks.line())
        if fit["clocks"]["dropped"]:
            console.print("[yellow]warning: the GPU's SM clock dropped by more than 10 % during calibration (power "
                          "or thermal limits): the profile describes it partly throttled[/yellow]")
    hw = hardware.Hardware(
        name=o.name, kind="gpu" if dev.type == "cuda" else "cpu", peak_flops=peak, bandwidth=bw,
        memory_bytes=memory_bytes(dev), efficiency=eff, host=host, impl=MEASURED_HOST, sleep_overshoot=overshoot,
        description=f"{where if dev.type == 'cuda' else platform.processor() or platform.machine()} "
        f"({platform.node()}), {p.threads} torch threads, {p.dtype}",
        sources=["measured by dllm-bench calibrate on this machine"], fit=fit)
    hardware.save(hw, out)
    return out


def _time_host(pl: Plan, mdl, read, console, tick=lambda: None) -> tuple[dict, dict]:
    """Each system's timed steps at each of its sizes ((steps, reading, attempts) per size): on a
    CPU between speed-gauge readings (`read`), re-timed when the machine's speed moved; on a GPU
    ascending, stopping once rows/s no longer grows (`tick` after each batch: its clocks). Where a
    request is short, one request after idle gaps. Every system is built afresh and freed
    (`host.release`) before the next."""
    prompts = [r.prompt_ids for r in pl.workload]
    batches, wakes = {}, {}
    with progress(con=console, status=True) as prog:
        task = prog.add_task("host time", total=sum(map(len, pl.sizes.values())), status="")
        for v, sizes in pl.sizes.items():
            batches[v] = []
            best = 0.0
            for i, n in enumerate(sizes):
                prog.update(task, status=f"{v.label}, {n} concurrent")
                run = lambda v=v, n=n: timed_steps(v, n, mdl, pl, prompts[:n])  # noqa: E731
                if read is None:
                    timed, now, attempts = run(), 1.0, 1
                else:
                    timed, now, attempts = drift.bracketed(run, read)
                if attempts > 1:
                    console.print(f"{v.label}, {n} concurrent: timed {attempts} times, the machine's speed moved by "
                                  f"more than {drift.BRACKET_TOL:.2f}x during the batch", markup=False, highlight=False)
                batches[v].append((timed, now, attempts))
                tick()
                prog.advance(task)
                rate = rows_per_s(timed)
                if pl.mode.saturate and pl.default_sizes and i >= 2 and rate < SATURATED * best:
                    console.print(f"{v.label}: {rate:,.0f} query rows/s at {n} concurrent, {best:,.0f} before: "
                                  f"saturated, larger batches not timed", markup=False, highlight=False)
                    prog.advance(task, len(sizes) - i - 1)
                    break
                best = max(best, rate)
            lone = sum(t for _, t in batches[v][sizes.index(min(sizes))][0])
            if lone <= drift.WAKE_MAX_REQUEST_S and pl.mode.timed_steps is None:
                prog.update(task, status=f"{v.label}, one request after idle gaps")
                wakes[v] = drift.after_gaps(plain_system(v, mdl, pl), prompts, pl.params, drift.WAKE_GAPS,
                                            drift.WAKE_ROUNDS, pl.device)
                host_time.release(pl.device)
    return batches, wakes


def rows_per_s(steps: list) -> float:
    t = sum(dt for _, dt in steps)
    return sum(fw.query_tokens for fw, _ in steps) / t if t > 0 else 0.0


def _fit_host(batches: dict, wakes: dict, device_only: CostModel, reference, state, console) -> tuple[dict, dict]:
    """Each system's host cost (and wake cost) from its timed steps (on a CPU rescaled to the
    profile's machine state)."""
    host, host_fit = {}, {}
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    for v, timed_batches in batches.items():
        steps = [s for timed, now, _ in timed_batches
                 for s in (drift.at_reference_speed(timed, state, now) if reference else timed)]
        hc, fit = host_time.fit_host(steps, device_only)
        if v in wakes:
            w, tau, fit["wake"] = drift.fit_wake(wakes[v].request)
            hc = replace(hc, wake_s=w, wake_tau_s=tau, c_add=drift.hand_over_s(wakes[v]))
        fit["rows_per_s_by_size"] = [rows_per_s(timed) for timed, _, _ in timed_batches]
        if reference:
            fit["speed_vs_operators"] = [reference / now for _, now, _ in timed_batches]
            fit["attempts"] = [a for _, _, a in timed_batches]
        host[f"{MEASURED_HOST}/{v.name}"], host_fit[v.name] = hc, fit
        split = ", ".join(f"{k} {e:+.0%}" for k, e in fit["median_err_by_rows"].items())
        by_size = ", ".join(f"{n} {e:+.1%}" for n, e in fit["total_err_by_seqs"].items())
        speed = (f"; machine speed vs the operator timings {', '.join(f'{x:.2f}x' for x in fit['speed_vs_operators'])}, "
                 "step times rescaled" if reference else "")
        say(f"host {v.label}: {host_terms(hc, fit['unresolved'])} ({fit['steps']} steps, median error "
            f"{fit['median_rel_err']:.1%}; signed, by query rows: {split}; charged over taken, by sequences: "
            f"{by_size}{speed})")
        if fit["captures"]:
            say(f"  {fit['captures']} steps captured a CUDA graph: {hc.c_capture * 1e3:.0f} ms each over the fit "
                "(left out of it)")
        if fit["unresolved"]:
            say(f"  {', '.join(fit['unresolved'])}: unresolved — the fit put them at 0, which says the sizes timed "
                "cannot tell them from the operators' time, not that they cost nothing (more --sizes, or fit serve "
                "runs: simulate --fit)")
        if fit["median_rel_err"] > POOR_FIT:
            say(f"  the host fit misses its steps by {fit['median_rel_err']:.0%} (median): its terms describe "
                f"{v.label}'s steps poorly")
        if v in wakes:
            say(f"  after an idle gap {v.label} takes {hc.wake_s * 1e3:.2f} ms more (tau {hc.wake_tau_s * 1e3:.0f} ms; "
                f"one request back to back: {fit['wake']['request_s'] * 1e3:.1f} ms, handing it over "
                f"{hc.c_add * 1e6:.0f} us)")
    return host, host_fit


def host_terms(h: HostCost, unresolved: list[str] = ()) -> str:
    """The fitted terms, a term fitted to its bound shown as unresolved rather than as 0."""
    def term(name: str, v: float, scale: float, unit: str, digits: int) -> str:
        return f"– {unit} (unresolved)" if name in unresolved else f"{v * scale:.{digits}f} {unit}"
    return (f"{term('c_step', h.c_step, 1e3, 'ms/step', 2)} + {term('c_seq', h.c_seq, 1e3, 'ms/sequence', 3)} + "
            f"{term('c_row', h.c_row, 1e6, 'us/query row', 1)}")


def timed_steps(v, n: int, mdl, pl: Plan, prompts) -> list:
    """One system's steps over `n` concurrent requests."""
    if v.is_baseline:
        return host_time.baseline_steps(mdl, v.name, knobs(v, pl), pl.shape, prompts, pl.params, pl.mode)
    return host_time.engine_steps(mdl, knobs(v, pl), pl.shape, prompts, pl.params, pl.mode)


def plain_system(v, mdl, pl: Plan):
    if v.is_baseline:
        return host_time.plain_baseline(mdl, v.name, knobs(v, pl))
    return host_time.plain_engine(mdl, knobs(v, pl))
