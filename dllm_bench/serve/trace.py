"""Per-step traces (`--trace-steps`): one JSON line per forward of the measured system, written
to `steps.jsonl` beside the point's requests.jsonl (the simulator is fitted to them).

Each row is the `StepRecord` a system's `StepCounters` hands its sink (an engine step or a
baseline's forward) as TRACE_FIELDS, with the step's number and start time: `step` (0, 1, ...
over the replay), `t_s` (seconds since the replay started, the clock of requests.jsonl),
`wall_ms`, `requests`, `padded_requests`, `refresh`, `reuse`, `query_rows`, `key_tokens`,
`logit_rows`, `graph`, and optionally `cache` (members per KV cache mode). The worker streams
rows to `steps.jsonl.part` as the replay runs (a long run holds none in memory); the parent
renames it when it writes the point, so a steps.jsonl is always a whole replay's.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

STEPS_FILE = "steps.jsonl"
PART_SUFFIX = ".part"
# A traced step's fields, in order (after its start time `t_start`, perf_counter seconds):
# `requests` real members, `padded_requests` members the forward ran (dummies included),
# `key_tokens` keys attended summed over members, `graph` a CUDA-graph replay; `cache` (optional)
# members per KV cache mode.
TRACE_FIELDS = ("wall_ms", "requests", "padded_requests", "refresh", "reuse", "query_rows", "key_tokens",
                "logit_rows", "graph", "cache")


class StepRecord(NamedTuple):
    """One forward, as `engine.engine.StepCounters.record` hands its sink the fields (perf_counter times)."""

    started: float
    ended: float
    requests: int
    padded_requests: int
    refresh: int
    reuse: int
    query_rows: int
    key_tokens: int
    logit_rows: int
    graph: bool
    cache: dict[str, int] | None


def row(*fields) -> dict[str, Any]:
    """A forward's trace row from the fields a `StepCounters.sink` gets: `t_start` and TRACE_FIELDS
    (`cache` only when told)."""
    r = StepRecord(*fields)
    out = {"t_start": r.started, "wall_ms": (r.ended - r.started) * 1e3, "requests": r.requests,
           "padded_requests": r.padded_requests, "refresh": r.refresh, "reuse": r.reuse, "query_rows": r.query_rows,
           "key_tokens": r.key_tokens, "logit_rows": r.logit_rows, "graph": r.graph}
    if r.cache:
        out["cache"] = dict(r.cache)
    return out


def part_path(point_dir: Path) -> Path:
    """Where a point's worker streams its trace until the point is written."""
    return point_dir / (STEPS_FILE + PART_SUFFIX)


class StepTrace:
    """A `StepCounters.sink` writing rows to `path`; step times count from `start(t0)`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.origin: float | None = None
        self.steps = 0

    def start(self, t0: float) -> None:
        self.origin = t0

    def __call__(self, *record) -> None:
        fields = row(*record)
        t = fields.pop("t_start")
        out = {"step": self.steps, "t_s": t - (self.origin if self.origin is not None else t), **fields}
        self.file.write(json.dumps(out) + "\n")
        self.steps += 1

    def close(self) -> None:
        self.file.close()


@contextlib.contextmanager
def tracing(system: Any, path: str | os.PathLike | None):
    """Every forward of `system` while inside traced to `path` (None, or a system without step
    counters such as an endpoint: nothing traced); yields the trace (or None)."""
    counters = getattr(system, "counters", None)
    if path is None or counters is None:
        yield None
        return
    trace = StepTrace(path)
    counters.sink = trace
    try:
        yield trace
    finally:
        counters.sink = None
        trace.close()


def forget(point_dir: Path) -> None:
    """A point about to be measured again (--resume after an interruption): its old trace goes,
    traced or not this time."""
    for f in (point_dir / STEPS_FILE, part_path(point_dir)):
        f.unlink(missing_ok=True)


def publish(part: Path | None) -> None:
    """The worker's finished trace under its final name (a missing one: nothing)."""
    if part is not None and part.exists():
        os.replace(part, part.with_name(STEPS_FILE))


def discard(part: Path | None) -> None:
    if part is not None:
        part.unlink(missing_ok=True)
