"""What a serving run reports beyond its fixed metrics, with vLLM `bench serve`'s flags and
meanings: which latency metrics get percentiles (`--percentile-metrics`), which percentiles
(`--metric-percentiles`), and the service-level objectives of goodput (`--goodput`), the
requests meeting every SLO given (DistServe's definition, as vLLM computes it).

Parsed once from the CLI into MetricOptions; dllm_bench.metrics.serving computes with it.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dllm_bench.errors import UserError

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")   # vLLM's names, in its order
SLO_METRICS = ("ttft", "tpot", "e2el")                  # the request-level ones goodput can bound
DEFAULT_PERCENTILES = (99.0,)


@dataclass(frozen=True)
class MetricOptions:
    percentile_metrics: tuple[str, ...] = PERCENTILE_METRICS
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    goodput: tuple[tuple[str, float], ...] = ()        # (metric, SLO in ms), each metric once

    @property
    def slo_ms(self) -> dict[str, float]:
        return dict(self.goodput)

    @property
    def is_default(self) -> bool:
        return self == MetricOptions()

    def to_dict(self) -> dict:
        return {"percentile_metrics": list(self.percentile_metrics), "metric_percentiles": list(self.percentiles),
                "goodput": self.slo_ms or None}

    @classmethod
    def from_dict(cls, d: Mapping | None) -> MetricOptions:
        if not d:
            return cls()
        return cls(tuple(d.get("percentile_metrics") or PERCENTILE_METRICS),
                   tuple(float(p) for p in d.get("metric_percentiles") or DEFAULT_PERCENTILES),
                   tuple((d.get("goodput") or {}).items()))


def percentile_word(p: float) -> str:
    """vLLM's spelling of a percentile in a key or label: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if float(p).is_integer() else str(p)


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not names:
        raise UserError(f"--percentile-metrics: give some of {','.join(PERCENTILE_METRICS)}")
    for n in names:
        if n not in PERCENTILE_METRICS:
            raise UserError(f"--percentile-metrics: unknown metric {n!r}; choose from {','.join(PERCENTILE_METRICS)}")
    return tuple(m for m in PERCENTILE_METRICS if m in names)


def parse_metric_percentiles(text: str) -> tuple[float, ...]:
    out: list[float] = []
    for tok in (t.strip() for t in text.split(",")):
        try:
            p = float(tok)
        except ValueError:
            raise UserError(f"--metric-percentiles: expected numbers in [0, 100] like 50,90,99, got {tok!r}") from None
        if not (0 <= p <= 100):   # NaN fails this too
            raise UserError(f"--metric-percentiles: {tok} is not a percentile in [0, 100]")
        out.append(p)
    return tuple(sorted(set(out)))


def parse_goodput(pairs: Iterable[str]) -> tuple[tuple[str, float], ...]:
    """`ttft:500 tpot:50 e2el:3000` (one pair per argument, or several separated by spaces or
    commas) -> ((metric, ms), ...). Each metric at most once, SLOs >= 0 (vLLM's checks)."""
    slo: dict[str, float] = {}
    for pair in (t for arg in pairs for t in re.split(r"[\s,]+", arg) if t):
        name, sep, value = pair.partition(":")
        name = name.strip().lower()
        try:
            ms = float(value) if sep else math.nan
        except ValueError:
            ms = math.nan
        if math.isnan(ms):
            raise UserError(f"--goodput: expected METRIC:MILLISECONDS pairs like ttft:500, got {pair!r}")
        if name not in SLO_METRICS:
            raise UserError(f"--goodput: unknown metric {name!r}; SLOs bound {', '.join(SLO_METRICS)}")
        if ms < 0 or math.isinf(ms):
            raise UserError(f"--goodput: the {name} SLO must be a finite number of ms >= 0, got {value}")
        if name in slo:
            raise UserError(f"--goodput: {name} given twice")
        slo[name] = ms
    return tuple(slo.items())


def metric_options(percentile_metrics: str | None = None, metric_percentiles: str | None = None,
                   goodput: Sequence[str] | None = None) -> MetricOptions:
    """The three flags (None = vLLM's defaults, except that e2el, the paper's latency, is among
    the percentile metrics by default) checked into MetricOptions."""
    return MetricOptions(
        parse_percentile_metrics(percentile_metrics) if percentile_metrics is not None else PERCENTILE_METRICS,
        parse_metric_percentiles(metric_percentiles) if metric_percentiles is not None else DEFAULT_PERCENTILES,
        parse_goodput(goodput) if goodput else ())
