"""The speed gauge (dllm_bench.simulate.drift): what it reads, the spread it reports, and that a
serve point reads it only when a validation asks for it (DLLM_BENCH_SPEED_GAUGE)."""
from __future__ import annotations

import torch

from dllm_bench.simulate import drift


def test_drift_is_the_slowest_reading_over_the_fastest():
    assert drift.drift([0.02, 0.025, 0.021]) == 0.025 / 0.02
    assert drift.drift([0.02]) is None and drift.drift([]) is None
    g = drift.SpeedGauge(16, 32, torch.float32, repeats=3)
    assert g.read() > 0 and g.read() > 0 and len(g.readings) == 2


def test_serve_reads_the_gauge_only_when_asked(monkeypatch):
    monkeypatch.delenv(drift.GAUGE_ENV, raising=False)
    assert drift.requested() is False
    for off in ("", "0", "false", "No"):
        monkeypatch.setenv(drift.GAUGE_ENV, off)
        assert drift.requested() is False, off
    for on in ("1", "yes", "true"):
        monkeypatch.setenv(drift.GAUGE_ENV, on)
        assert drift.requested() is True, on
