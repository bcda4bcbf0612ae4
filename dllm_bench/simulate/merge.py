"""Several calibrations of one machine merged into one profile (`dllm-bench calibrate --merge`).

On a machine whose speed wanders (a shared virtual machine), one calibration catches one state,
and most of the state lands in the fitted host terms: the operator efficiencies of the same
machine agree to a few per cent between calibrations, while a system's host time per sequence
has come out anywhere between 0 and 48 ms (docs/SIMULATE.md). A profile of the median over
several calibrations predicts the machine's typical state instead.

The median is taken where the calibrations measured: for each efficiency (every calibration
timed the same operators) and, for the host terms, on the host time at each batch size the
calibrations timed, with c_step + c_seq·n refitted through those medians. Taking the median of
c_step and of c_seq separately would pair one calibration's low intercept with another's low
slope and underestimate every batch. The per-row term is merged by its own median and the
host time at each size is evaluated at that size's mean query rows (as the calibrations recorded
them), so the refitted terms carry the rest.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from dllm_bench.errors import UserError
from dllm_bench.simulate.cost_model import HostCost
from dllm_bench.simulate.hardware import Hardware
from dllm_bench.simulate.validate import speed_reference

# What must agree for two calibrations to describe one machine serving one model.
SAME = ("model", "preset", "dtype", "device", "threads")


def merge(profiles: Sequence[Hardware], name: str) -> Hardware:
    if len(profiles) < 2:
        raise UserError("--merge needs at least two calibrated profiles")
    first = profiles[0]
    for hw in profiles:
        if not hw.fit.get("model"):
            raise UserError(f"--merge: {hw.name!r} is not a calibration of this machine (no fit); "
                            "merge the profiles `dllm-bench calibrate` wrote")
        _check_same(first, hw)
    effs = [hw.efficiency for hw in profiles]
    by_m = [dict(e.u_c_by_m) for e in effs]
    eff = replace(first.efficiency, u_c=med(e.u_c for e in effs), u_m=med(e.u_m for e in effs),
                  u_attn=med(e.u_attn for e in effs), c_op=med(e.c_op for e in effs),
                  c_attn=med(e.c_attn for e in effs),
                  u_c_by_m=tuple((m, med(t[m] for t in by_m)) for m, _ in first.efficiency.u_c_by_m))
    sizes = sorted({int(n) for hw in profiles for n in hw.fit.get("sizes", [])}) or [1, 2]
    host = {k: _host_median([hw.host[k] for hw in profiles], sizes, _rows(profiles, k.split("/", 1)[-1], sizes))
            for k in first.host}
    gauges = [g for hw in profiles if (g := speed_reference(hw.fit)[0])]
    names = [hw.name for hw in profiles]
    fit = {k: first.fit[k] for k in SAME if k in first.fit}
    fit.update(sizes=sizes, merged_from=names)
    if len(gauges) == len(profiles):
        fit["speed_gauge_s"] = {"profile": med(gauges)}
    return Hardware(
        name=name, kind=first.kind, peak_flops=med(hw.peak_flops for hw in profiles),
        bandwidth=med(hw.bandwidth for hw in profiles), memory_bytes=first.memory_bytes, efficiency=eff,
        host=host, description=first.description, impl=first.impl, fit=fit,
        sleep_overshoot=_overshoot_median(profiles),
        sources=[f"median of {len(profiles)} dllm-bench calibrations of this machine: {', '.join(names)}"])


def med(values) -> float:
    return float(statistics.median(values))


def _rows(profiles: Sequence[Hardware], system: str, sizes: Sequence[int]) -> dict[int, float]:
    """A system's mean query rows per step at each calibrated size: the median over the
    calibrations that recorded it (0 where none did: their row terms are 0 too)."""
    out = {}
    for n in sizes:
        seen = [r for hw in profiles
                if (r := ((hw.fit.get("host") or {}).get(system) or {}).get("mean_rows_by_seqs", {}).get(str(n)))]
        out[n] = med(seen) if seen else 0.0
    return out


def _host_median(costs: Sequence[HostCost], sizes: Sequence[int], rows: dict[int, float]) -> HostCost:
    """c_step + c_seq·n (both >= 0) through the median host time at each size (its steps' mean
    rows), by relative error; c_row, the wake terms, c_add and c_sl (not fitted by calibrate) by their own medians."""
    from scipy.optimize import nnls

    c_row = med(c.c_row for c in costs)
    A = np.array([[1.0, n] for n in sizes])
    total = np.array([med(c.c_step + c.c_seq * n + c.c_row * rows[n] for c in costs) for n in sizes])
    y = total - c_row * np.array([rows[n] for n in sizes])
    w = 1.0 / np.maximum(total, 1e-9)       # relative errors, as calibrate's host fit: the largest batch
    (c_step, c_seq), _ = nnls(A * w[:, None], y * w)        # does not decide the lone request's time
    return HostCost(c_step=float(c_step), c_seq=float(c_seq), c_sl=med(c.c_sl for c in costs), c_row=c_row,
                    wake_s=med(c.wake_s for c in costs), wake_tau_s=med(c.wake_tau_s for c in costs),
                    c_add=med(c.c_add for c in costs))


def _overshoot_median(profiles: Sequence[Hardware]) -> tuple[tuple[float, float], ...]:
    """The median lateness at each duration the calibrations that measured it share."""
    tables = [dict(hw.sleep_overshoot) for hw in profiles if hw.sleep_overshoot]
    if not tables:
        return ()
    common = sorted(set.intersection(*(set(t) for t in tables)))
    return tuple((dt, med(t[dt] for t in tables)) for dt in common)


def _check_same(a: Hardware, b: Hardware) -> None:
    where = f"--merge: {b.name!r} and {a.name!r}"
    if (a.kind, a.impl) != (b.kind, b.impl):
        raise UserError(f"{where} are of different kinds ({a.kind}/{a.impl or '-'} vs {b.kind}/{b.impl or '-'})")
    for k in SAME:
        if a.fit.get(k) != b.fit.get(k):
            raise UserError(f"{where} differ in {k} ({a.fit.get(k)!r} vs {b.fit.get(k)!r})")
    if set(a.host) != set(b.host):
        raise UserError(f"{where} fitted the host time of different systems")
    if [m for m, _ in a.efficiency.u_c_by_m] != [m for m, _ in b.efficiency.u_c_by_m]:
        raise UserError(f"{where} timed GEMMs at different row counts")
