"""A machine whose speed drifts: what calibrate and validation do about it, in one place.

A shared virtual machine changes speed by up to 1.5x within minutes, and a calibration describes
the state it was taken in. Reading the speed gauge (dllm_bench.serve.speed_gauge), three things keep
that out of a profile and out of a validation: the profile describes the machine at the median
of the calibration's readings, operator and step times are rescaled to that state and a batch
during which the gauge moved is timed again (`bracketed`); where a request is short, a request
alone after idle gaps gives the wake and hand-over costs and the idle sleep's lateness
(`fit_wake`, `fit_overshoot`); `simulate --validate` re-simulates each measured point at its own
gauge reading over the calibration's (`measured_speeds`). On a machine whose speed holds (a
dedicated GPU) every factor here is ~1. Thresholds: docs/SIMULATE.md (`dllm-bench calibrate`).
"""
from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from dllm_bench.simulate.cost_model import Efficiency, Forward
from dllm_bench.timing import device_sync

# ---------------------------------------------------------------- state rescaling (calibrate)
BRACKET_TOL, RETIMES = 1.15, 2


def bracketed(run: Callable[[], object], read: Callable[[], float], tol: float = BRACKET_TOL,
              retimes: int = RETIMES) -> tuple[object, float, int]:
    """run() between two gauge readings, re-run (up to `retimes` times) while the two readings
    differ by more than `tol`: the machine changed speed during the batch, so neither reading,
    nor their mean, says how fast it ran. Returns the attempt whose readings agreed best, its
    mean reading, and how many attempts were made."""
    best, attempts = None, 0
    while attempts <= retimes:
        attempts += 1
        before = read()
        out = run()
        after = read()
        spread = max(before, after) / min(before, after)
        if best is None or spread < best[0]:
            best = (spread, out, (before + after) / 2)
        if spread <= tol:
            break
    return best[1], best[2], attempts


def at_reference_speed(steps: list[tuple[Forward, float]], reference: float, now: float) -> list[tuple[Forward, float]]:
    """Step times taken while the gauge read `now` seconds, rescaled to the state in which it
    reads `reference`: without this the host terms would absorb the difference between the two
    moments, and a negative difference cannot be absorbed at all (host terms are >= 0)."""
    f = reference / now
    return [(fw, t * f) for fw, t in steps]


def typical_state(readings: list[float]) -> float:
    """The machine's typical speed over a calibration: the median of every gauge reading (the
    minutes of the operator grid are one state among several)."""
    return float(np.median(readings))


def at_state(peak: float, bw: float, eff: Efficiency, f: float) -> tuple[float, float, Efficiency]:
    """Peaks and fixed costs of operators timed in one machine state, moved to a state `f` times
    slower (every operator time x f): the rates divided by f, the per-call overheads multiplied."""
    return peak / f, bw / f, replace(eff, c_op=eff.c_op * f, c_attn=eff.c_attn * f)


# ---------------------------------------------------------------- idle gaps (calibrate)
# A request is timed alone after idle gaps when it takes at most WAKE_MAX_REQUEST_S: the wake
# cost is milliseconds, nothing to a request of seconds, and the measurement costs rounds of them.
WAKE_GAPS, WAKE_ROUNDS, WAKE_MAX_REQUEST_S = (0.0, 0.001, 0.01, 0.03, 0.1, 0.3), 16, 0.5
WAKE_TAUS = np.geomspace(0.02, 1.0, 40)


@dataclass
class GapTimes:
    """`after_gaps`' timings, each list indexed by round: the whole request (add_request to its
    last step), its add_request alone, and how late each idle sleep returned."""

    request: dict[float, list[float]]
    add: dict[float, list[float]]
    overshoot: dict[float, list[float]]


def after_gaps(system, prompts, params, gaps: Sequence[float], rounds: int, device,
               sleep: Callable[[float], None] = time.sleep, seed: int = 0) -> GapTimes:
    """One request alone, run after each idle gap (the gaps shuffled every round, each round on
    one prompt), after three warm-up requests: what a request pays for the idle time before it,
    as a served point at a low rate sees it."""
    wait = device_sync(device) or (lambda: None)

    def one(prompt) -> tuple[float, float]:
        wait()
        t0 = time.perf_counter()
        system.add_request(prompt, params)
        added = time.perf_counter() - t0
        while system.has_unfinished():
            system.step()
        wait()
        return time.perf_counter() - t0, added

    for i in range(3):
        one(prompts[i % len(prompts)])
    out = GapTimes(*({g: [] for g in gaps} for _ in range(3)))
    order, rnd = list(gaps), random.Random(seed)
    for r in range(rounds):
        rnd.shuffle(order)
        for g in order:
            t0 = time.perf_counter()
            sleep(g)
            out.overshoot[g].append(time.perf_counter() - t0 - g)
            total, added = one(prompts[r % len(prompts)])
            out.request[g].append(total)
            out.add[g].append(added)
    return out


def fit_wake(times: dict[float, list[float]]) -> tuple[float, float, dict]:
    """(wake_s, wake_tau_s) of `HostCost.wake` from requests timed after idle gaps (gap 0 = back
    to back, the i-th time of every gap from round i): the median over the rounds of each gap's
    extra time over the same round's back-to-back request (paired, so a drift over the rounds
    cancels), fitted as wake_s·(1 − exp(−gap/tau)) by least squares, wake_s >= 0, tau on a log grid."""
    zero = np.array(times[0.0])
    gaps = np.array(sorted(g for g in times if g > 0))
    extra = np.array([float(np.median(np.array(times[g]) - zero)) for g in gaps])
    best = (math.inf, 0.0, float(WAKE_TAUS[len(WAKE_TAUS) // 2]))
    for tau in WAKE_TAUS:
        x = -np.expm1(-gaps / tau)
        w = max(0.0, float(x @ extra / (x @ x)))
        err = float(((w * x - extra) ** 2).sum())
        if err < best[0]:
            best = (err, w, float(tau))
    return best[1], best[2], {"request_s": float(np.median(zero)), "gaps_s": gaps.tolist(), "extra_s": extra.tolist()}


def hand_over_s(times: GapTimes) -> float:
    """A request's hand-over cost (its add_request, outside the steps): the back-to-back median."""
    return statistics.median(times.add[0.0])


def fit_overshoot(samples: Sequence[dict[float, list[float]]]) -> tuple[tuple[float, float], ...]:
    """`Hardware.sleep_overshoot`: per duration asked, the median lateness of the idle sleeps over
    every system's gap timings (a property of the machine, not of a system)."""
    gaps = sorted({g for s in samples for g in s if g > 0})
    return tuple((float(g), max(0.0, float(np.median([x for s in samples for x in s.get(g, [])])))) for g in gaps)


# ---------------------------------------------------------------- validation at the measured speed
def speed_reference(fit: dict) -> tuple[float | None, str | None]:
    """(the gauge reading of the machine state a profile describes, its preset) from a hardware
    profile's `fit`: the calibration's median reading (`profile`), else the reading while the
    operators were timed; (None, None) for a profile without a gauge (the built-in GPU files)."""
    g = fit.get("speed_gauge_s") or {}
    ref = g.get("profile") or g.get("operators")
    return (float(ref), fit.get("preset")) if ref else (None, None)


def measured_speeds(meas: pd.DataFrame, reference: float | None, preset: str | None) -> pd.DataFrame:
    """The measured points that read the calibration's speed gauge: their cell, workload seed and
    `speed` = their gauge / the calibration's. Points of another preset timed another GEMM (model,
    dtype or threads) and are left out."""
    keys = ["dataset", "system", "rps"]
    if not reference or not {"speed_gauge_s", "workload_seed"} <= set(meas.columns):
        return pd.DataFrame(columns=[*keys, "workload_seed", "speed"])
    m = meas[meas["speed_gauge_s"].notna() & meas["workload_seed"].notna()]
    if preset and "preset" in m:
        m = m[m["preset"] == preset]
    out = m[[*keys, "workload_seed"]].copy()
    out["speed"] = m["speed_gauge_s"] / reference
    return out.reset_index(drop=True)
