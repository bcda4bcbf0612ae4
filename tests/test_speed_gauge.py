"""The speed gauge (dllm_bench.serve.speed_gauge): what it reads, the spread it reports, and that a
serve point reads it only when a validation asks for it (DLLM_BENCH_SPEED_GAUGE)."""
from __future__ import annotations

import torch

from dllm_bench.serve import speed_gauge


def test_drift_is_the_slowest_reading_over_the_fastest():
    assert speed_gauge.drift([0.02, 0.025, 0.021]) == 0.025 / 0.02
    assert speed_gauge.drift([0.02]) is None and speed_gauge.drift([]) is None
    g = speed_gauge.SpeedGauge(16, 32, torch.float32, repeats=3)
    assert g.read() > 0 and g.read() > 0 and len(g.readings) == 2


def test_serve_reads_the_gauge_only_when_asked(monkeypatch):
    monkeypatch.delenv(speed_gauge.GAUGE_ENV, raising=False)
    assert speed_gauge.requested() is False
    for off in ("", "0", "false", "No"):
        monkeypatch.setenv(speed_gauge.GAUGE_ENV, off)
        assert speed_gauge.requested() is False, off
    for on in ("1", "yes", "true"):
        monkeypatch.setenv(speed_gauge.GAUGE_ENV, on)
        assert speed_gauge.requested() is True, on
