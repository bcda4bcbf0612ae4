"""The per-step history of `StepCounters` is bounded, and what a serve point reports from it
(mean and largest batch, refresh/reuse request-steps) stays exact over any window of steps."""
from __future__ import annotations

import random

from dllm_bench.serve.loadgen import _stats_delta, step_stats_summary
from engine.engine import STEP_HISTORY, StepCounters


def test_history_is_bounded_and_window_summaries_stay_exact():
    rng = random.Random(0)
    c = StepCounters()
    sizes, comps = [], []
    snapshots = {0: c.stats()}
    total = 3 * STEP_HISTORY + 17
    for step in range(1, total + 1):
        b = rng.randint(1, 40)
        refresh = rng.randint(0, b)
        c.record(b, 10 * b, b, b, refresh, b - refresh)
        sizes.append(b)
        comps.append((refresh, b - refresh))
        if step in (5, STEP_HISTORY - 3, 2 * STEP_HISTORY + 1):
            snapshots[step] = c.stats()
    assert len(c.batch_sizes) == len(c.step_log) == STEP_HISTORY
    assert len(c.maxima) <= 40
    after = c.stats()
    for start, before in snapshots.items():
        got = step_stats_summary(_stats_delta(before, after))
        window = sizes[start:]
        assert got["mean_batch_size"] == sum(window) / len(window)
        assert got["max_batch_size_seen"] == max(window)
        # refresh/reuse request-steps are the window's own, as its steps are (a point's, not the warm-up's)
        assert got["refresh_request_steps"] == sum(r for r, _ in comps[start:])
        assert got["reuse_request_steps"] == sum(u for _, u in comps[start:])
        assert got["steps"] == len(window)


def test_short_runs_keep_every_step():
    c = StepCounters()
    for b in (3, 1, 4, 1, 5):
        c.record(b, b, b, b, b, 0)
    before = {"steps": 2, "batch_sizes": [3, 1], "batch_size_maxima": [[1, 3], [2, 1]]}
    delta = _stats_delta(before, c.stats())
    assert delta["batch_sizes"] == [4, 1, 5] and delta["max_batch_size"] == 5
    assert list(c.batch_sizes) == [3, 1, 4, 1, 5]
