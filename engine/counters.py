"""The step counters every serving system reports."""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

STEP_HISTORY = 4096      # per-step entries kept (the aggregates are exact whatever the number of steps)


class StepCounters(dict):
    """Cumulative counters, the last steps' `batch_sizes` and `step_log`, and the batch-size suffix maxima."""

    def __init__(self) -> None:
        super().__init__(steps=0, forwards=0, query_tokens=0, logits_rows=0, max_logits_rows_in_step=0,
                         refresh_steps=0, reuse_steps=0, stalled_steps=0, stalled_requests=0,
                         deferred_steps=0, deferred_requests=0, batched_requests=0)
        self.batch_sizes: deque[int] = deque(maxlen=STEP_HISTORY)
        self.step_log: deque[tuple[int, int, int]] = deque(maxlen=STEP_HISTORY)
        # (step number, batch size) of every step no later step matched or beat
        self.maxima: list[tuple[int, int]] = []
        self.sink: Callable | None = None        # a step trace's: called with each forward's fields

    def record(self, batch_size: int, query_tokens: int, logits_rows: int, max_logits_rows: int,
               refresh: int, reuse: int, stalled: int = 0, deferred: int = 0, *, started: float | None = None,
               key_tokens: int = 0, padded: int | None = None, graph: bool = False, cache: dict | None = None) -> None:
        """One forward (`stalled`: left out by the budget, `deferred`: by the plan; `started`: sink it)."""
        if self.sink is not None and started is not None:
            self.sink(started, time.perf_counter(), batch_size, batch_size if padded is None else padded,
                      refresh, reuse, query_tokens, key_tokens, logits_rows, graph, cache)
        for k, v in dict(steps=1, forwards=1, query_tokens=query_tokens, logits_rows=logits_rows, refresh_steps=refresh,
                         reuse_steps=reuse, stalled_steps=stalled > 0, stalled_requests=stalled,
                         deferred_steps=deferred > 0, deferred_requests=deferred, batched_requests=batch_size).items():
            self[k] += v
        self["max_logits_rows_in_step"] = max(self["max_logits_rows_in_step"], max_logits_rows)
        self.batch_sizes.append(batch_size)
        self.step_log.append((refresh, reuse, query_tokens))
        while self.maxima and self.maxima[-1][1] <= batch_size:
            self.maxima.pop()
        self.maxima.append((self["steps"], batch_size))

    def stats(self) -> dict:
        return dict(self, batch_sizes=list(self.batch_sizes), step_composition=[list(s) for s in self.step_log],
                    batch_size_maxima=[list(m) for m in self.maxima])
