"""Repeated measurements: each point is run N times with different workload seeds, reported as
the median with its min–max, and a comparison of two systems is "within noise" when their
min–max intervals overlap (neither is better in every repeat's range).

The repeat seeds are `seed, seed + 1, ...`, so repeat 0 is the unrepeated run and resuming a
run with a larger N keeps the finished repeats.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
        return f"{fmt.format(self.median)} ({fmt.format(self.lo)}–{fmt.format(self.hi)})"


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


def spread_of(row: pd.Series | dict, metric: str, repeats_col: str = "repeats") -> Spread:
    """The Spread an `aggregate` row holds for `metric`."""
    n = int(row.get(repeats_col, 1) or 1)
    return Spread(float(row[metric]), float(row[f"{metric}_min"]), float(row[f"{metric}_max"]), n)
