"""The step counters every serving system reports (`LLMEngine`, the static-batch baselines):
forwards, query tokens, logits rows, the phase mix, batch sizes and stalls."""
from __future__ import annotations


class StepCounters(dict):
    """A dict of cumulative counters plus the per-step `batch_sizes` and `step_log`
    ((refresh, reuse, query tokens) per step)."""

    def __init__(self) -> None:
        super().__init__(steps=0, forwards=0, query_tokens=0, logits_rows=0, max_logits_rows_in_step=0,
                         refresh_steps=0, reuse_steps=0, stalled_steps=0, stalled_requests=0)
        self.batch_sizes: list[int] = []
        self.step_log: list[tuple[int, int, int]] = []

    def record(self, batch_size: int, query_tokens: int, logits_rows: int, max_logits_rows: int,
               refresh: int, reuse: int, stalled: int = 0) -> None:
        """One forward. `stalled`: running requests left out of it because their step did not fit
        the token budget (head-of-line blocking behind a Refresh)."""
        self["steps"] += 1
        self["forwards"] += 1
        self["query_tokens"] += query_tokens
        self["logits_rows"] += logits_rows
        self["max_logits_rows_in_step"] = max(self["max_logits_rows_in_step"], max_logits_rows)
        self["refresh_steps"] += refresh
        self["reuse_steps"] += reuse
        self["stalled_steps"] += stalled > 0
        self["stalled_requests"] += stalled
        self.batch_sizes.append(batch_size)
        self.step_log.append((refresh, reuse, query_tokens))

    def stats(self) -> dict:
        return dict(self, batch_sizes=list(self.batch_sizes), step_composition=[list(s) for s in self.step_log])
