"""Repeated measurements: each point is run N times with different workload seeds, reported as
the median with its min–max, and a comparison of two systems is "within noise" when their
min–max intervals overlap (neither is better in every repeat's range).

The repeat seeds are `seed, seed + 1, ...`, so repeat 0 is the unrepeated run and resuming a
run with a larger N keeps the finished repeats.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd


def repeat_seeds(seed: int, repeats: int) -> list[int]:
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    return [seed + i for i in range(repeats)]


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        v = np.asarray([float(x) for x in values if x is not None and not np.isnan(float(x))])
        if v.size == 0:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(float(np.median(v)), float(v.min()), float(v.max()), int(v.size))

    def overlaps(self, other: Spread) -> bool:
        return self.lo <= other.hi and other.lo <= self.hi

    def text(self, fmt: str = "{:.2f}") -> str:
        if self.n == 0:
            return "-"
        if self.n == 1:
            return fmt.format(self.median)
        return f"{fmt.format(self.median)} [{fmt.format(self.lo)}–{fmt.format(self.hi)}]"


def ratio(a: Spread, b: Spread) -> Spread:
    """a / b: the median ratio and the extreme ratios the two intervals allow."""
    return Spread(a.median / b.median, a.lo / b.hi, a.hi / b.lo, min(a.n, b.n))


def verdict(a: Spread, b: Spread) -> str:
    """'within noise' when the intervals overlap (with one repeat each: never), else which is higher."""
    if a.n > 1 and b.n > 1 and a.overlaps(b):
        return "within noise"
    return "higher" if a.median > b.median else "lower"


def aggregate(points: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per `keys` group: `repeats` and, per metric, its median, min and max
    (columns `<metric>`, `<metric>_min`, `<metric>_max`)."""
    rows = []
    for k, g in points.groupby(list(keys), sort=False, dropna=False):
        row = dict(zip(keys, k if isinstance(k, tuple) else (k,), strict=True))
        row["repeats"] = len(g)
        for m in metrics:
            s = Spread.of(g[m]) if m in g else Spread.of([])
            row[m], row[f"{m}_min"], row[f"{m}_max"] = s.median, s.lo, s.hi
        rows.append(row)
    return pd.DataFrame(rows)


# What identifies a repeat rather than measures it: never aggregated.
REPEAT_FIELDS = ("repeat", "workload_seed", "_point")
# Flags that hold for the aggregate only if they hold in every repeat; other flags (interrupted,
# timed_out) hold if they hold in any.
EVERY_REPEAT = ("within_budget", "fits_budget", "is_baseline", "profile_cached")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _median_fields(rows: Sequence[Mapping], spreads: bool) -> dict:
    """Field by field over the repeats of one point: numbers -> median (an int stays an int when
    every repeat agrees) with `<k>_min`/`<k>_max` if `spreads`; flags -> all/any; dicts of
    numbers (stats) -> medians; anything else -> the first repeat's."""
    out: dict[str, Any] = {}
    for k, v0 in rows[0].items():
        if k in REPEAT_FIELDS:
            continue
        vals = [r.get(k) for r in rows]
        nums = [v for v in vals if _number(v)]
        if _number(v0) and nums:
            s = Spread.of(nums)
            same = all(v == nums[0] for v in nums)
            out[k] = nums[0] if same else s.median
            if spreads:
                out[f"{k}_min"], out[f"{k}_max"] = s.lo, s.hi
        elif isinstance(v0, bool):
            out[k] = all(bool(v) for v in vals) if k in EVERY_REPEAT else any(bool(v) for v in vals)
        elif isinstance(v0, Mapping) and k == "stats":
            out[k] = _median_fields([r.get(k) or {} for r in rows], spreads=False)
        else:
            out[k] = v0
    return out


def aggregate_points(points: Iterable[Mapping], keys: Sequence[str] = ("dataset", "system", "rps")) -> list[dict]:
    """The repeats of each point (same `keys`) as one summary of the same shape: every metric is
    the median over the repeats, with `<metric>_min`/`<metric>_max`, `repeats` (how many) and
    `seeds` (their workload seeds). A point run once is its own aggregate (min = max). Order:
    first appearance."""
    groups: dict[tuple, list[Mapping]] = {}
    for p in points:
        groups.setdefault(tuple(p.get(k, "") for k in keys), []).append(p)
    out = []
    for rows in groups.values():
        rows = sorted(rows, key=lambda r: r.get("repeat", 0) or 0)
        agg = _median_fields(rows, spreads=True)
        agg["repeats"] = len(rows)
        agg["seeds"] = [r.get("workload_seed") for r in rows]
        out.append(agg)
    return out


def point_spread(summary: Mapping, metric: str) -> Spread:
    """The Spread an aggregated summary (aggregate_points) holds for `metric`; a plain summary
    is one repeat."""
    v = summary.get(metric)
    if not _number(v):
        return Spread.of([])
    n = int(summary.get("repeats", 1) or 1)
    return Spread(float(v), float(summary.get(f"{metric}_min", v)), float(summary.get(f"{metric}_max", v)), n)


def cell(summary: Mapping, metric: str, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    """A table cell: the value, or `median [min–max]` when the point was repeated."""
    s = point_spread(summary, metric)
    if s.n == 0:
        return "–"
    s = Spread(s.median * scale, s.lo * scale, s.hi * scale, s.n)
    return s.text(fmt)


def batch_text(summary: Mapping) -> str:
    """A baseline's static batch B; over repeats whose profiles differed (each repeat's workload
    has its own longest request), the range it took."""
    b = summary.get("max_batch_size")
    if b is None:
        return "?"
    lo, hi = summary.get("max_batch_size_min", b), summary.get("max_batch_size_max", b)
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"


def compare(summary: Mapping, reference: Mapping, metric: str, higher_better: bool = True) -> tuple[Spread, str]:
    """`summary` against `reference` on one metric of two (aggregated) point summaries: the
    ratio as a Spread (> 1 = better: system / reference for throughput, reference / system for
    latency) and "better", "worse", "within noise" (intervals overlap), or "n/a"."""
    a, b = point_spread(summary, metric), point_spread(reference, metric)
    if not (a.n and b.n) or min(a.lo, b.lo) <= 0:
        return Spread.of([]), "n/a"
    r = ratio(a, b) if higher_better else ratio(b, a)
    v = verdict(a, b)
    if v != "within noise":
        v = "better" if (v == "higher") == higher_better else "worse"
    return r, v
