"""Repeated measurements: median and min–max per point, 'within noise' when intervals overlap."""
from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_bench.repeats import Spread, aggregate, ratio, repeat_seeds, verdict
from tests.results_helpers import spread_of


def test_repeat_seeds_extend_the_unrepeated_run():
    assert repeat_seeds(7, 1) == [7]
    assert repeat_seeds(7, 3)[:1] == repeat_seeds(7, 1) and len(set(repeat_seeds(7, 3))) == 3
    with pytest.raises(ValueError):
        repeat_seeds(0, 0)


def test_aggregate_gives_median_and_range_per_point():
    df = pd.DataFrame({"system": ["e", "e", "e", "b", "b", "b"], "tps": [10.0, 14.0, 11.0, 9.0, 5.0, 6.0]})
    agg = aggregate(df, ["system"], ["tps"]).set_index("system")
    assert (agg.loc["e", "tps"], agg.loc["e", "tps_min"], agg.loc["e", "tps_max"]) == (11.0, 10.0, 14.0)
    assert agg.loc["b", "repeats"] == 3 and agg.loc["b", "tps"] == 6.0
    e, b = spread_of(agg.loc["e"], "tps"), spread_of(agg.loc["b"], "tps")
    assert not e.overlaps(b) and verdict(e, b) == "higher"   # [10, 14] vs [5, 9]: apart
    r = ratio(e, b)
    assert r.median == pytest.approx(11 / 6) and r.lo == pytest.approx(10 / 9) and r.hi == pytest.approx(14 / 5)
    assert e.text("{:.1f}") == "11.0 [10.0–14.0]"


def test_overlap_decides_within_noise():
    a, b = Spread(10, 9, 11, 3), Spread(10.5, 10.8, 12, 3)
    assert verdict(a, b) == "within noise"
    c = Spread(13, 12.5, 14, 3)
    assert verdict(c, a) == "higher" and verdict(a, c) == "lower"
    assert verdict(Spread(10, 10, 10, 1), Spread(10.1, 10.1, 10.1, 1)) == "lower"   # one repeat: no interval


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)  # the suite shares a loaded machine
@given(st.lists(st.floats(0.1, 1e3), min_size=1, max_size=9))
def test_spread_bounds_hold(values):
    s = Spread.of(values)
    assert s.lo <= s.median <= s.hi and s.n == len(values)
    assert not math.isnan(s.median)
