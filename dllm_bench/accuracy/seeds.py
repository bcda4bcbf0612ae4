"""Several trained models of one task (training seeds) in one accuracy run: per point, every
seed's accuracy, their mean and spread (sample standard deviation, min and max), next to the
Wilson interval of the pooled counts.

The Wilson interval answers "how sure are we of this accuracy given n questions"; the spread
across seeds answers "how much does it move with the training run" — a selection rule can look
good on one model by luck, which only the second number shows.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dllm_bench.accuracy.points import PointResult, wilson


@dataclass(frozen=True)
class SeedSpread:
    point: str
    models: tuple[str, ...]
    accuracies: tuple[float, ...]        # one per model, in `models` order
    mean: float
    sd: float                            # sample standard deviation (0 for one model)
    low: float                           # min over models
    high: float                          # max over models

    def row(self) -> dict:
        return {"point": self.point, "seeds": len(self.models), "seed_mean": self.mean, "seed_sd": self.sd,
                "seed_min": self.low, "seed_max": self.high,
                "per_seed": dict(zip(self.models, self.accuracies, strict=True))}


def spreads(results: Sequence[PointResult]) -> dict[str, SeedSpread]:
    """Point name -> its spread over the run's models (in first-seen point order)."""
    by: dict[str, list[PointResult]] = {}
    for r in results:
        by.setdefault(r.point.name, []).append(r)
    out = {}
    for name, rs in by.items():
        accs = tuple(r.accuracy for r in rs)
        out[name] = SeedSpread(name, tuple(r.model for r in rs), accs, statistics.fmean(accs),
                               statistics.stdev(accs) if len(accs) > 1 else 0.0, min(accs), max(accs))
    return out


def pooled(results: Sequence[PointResult]) -> list[PointResult]:
    """One PointResult per point over all models: accuracy = the mean over models (each model
    answers the same questions), counts and the Wilson interval pooled over models' samples;
    for `analyse` and the figure."""
    by: dict[str, list[PointResult]] = {}
    for r in results:
        by.setdefault(r.point.name, []).append(r)
    out = []
    for rs in by.values():
        k, n = sum(r.correct for r in rs), sum(r.n for r in rs)
        lo, hi = wilson(k, n)
        other = {f: {"correct": sum(r.other[f]["correct"] for r in rs),
                     "accuracy": statistics.fmean(r.other[f]["accuracy"] for r in rs)} for f in rs[0].other}
        out.append(replace(rs[0], n=n, correct=k, accuracy=statistics.fmean(r.accuracy for r in rs), ci_low=lo,
                           ci_high=hi, other=other, elapsed_s=sum(r.elapsed_s for r in rs), samples=[],
                           model="+".join(r.model for r in rs) if len(rs) > 1 else rs[0].model))
    return out
