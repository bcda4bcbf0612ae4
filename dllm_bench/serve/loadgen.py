"""Open-loop, wall-clock benchmark loop for ONE serving system (engine or baseline).

Open loop: request i "arrives" at t0 + offset_i whatever the system is doing, as vLLM's client
fires at the configured rate. The system runs in this thread, so a request whose time passes
during a long step() is handed over right after it, still with arrival_time t0 + offset_i: that
wait is charged to the system as queueing, as a real client would see it. `max_concurrency`
caps the requests in flight as vLLM's `--max-concurrency` does: one that finds every slot taken
waits in arrival order; its latencies count from `start_time` (the later of its arrival and the
finish of the request before it in that slot) and the wait is its client-side queue time.
Times in the returned records are seconds since t0. Conventions: docs/SERVE.md.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# Names a workload item may use for its arrival offset (seconds from the start). The first
# one present wins; workloads/ is free to pick any of them.
ARRIVAL_FIELDS = ("arrival", "arrival_offset", "offset", "arrival_s", "timestamp")
TIME_FIELDS = ("arrival_time", "admitted_time", "first_token_time", "finished_time")
# Cumulative stats() counters: a point reports their increase over the run, so a system object
# reused across points does not leak counts from earlier points. Peaks/sizes are taken as-is.
COUNTER_STATS = ("steps", "forwards", "query_tokens", "logits_rows", "batched_requests", "requests_dual",
                 "requests_sparse", "requests_none", "refresh_steps", "reuse_steps", "stalled_steps",
                 "stalled_requests", "deferred_steps", "deferred_requests")

ProgressFn = Callable[[int, int, float], None]  # (arrived, finished, live output tok/s)


def _get(item: Any, name: str, default: Any = None) -> Any:
    return item.get(name, default) if isinstance(item, Mapping) else getattr(item, name, default)


def arrival_offset(item: Any) -> float:
    for f in ARRIVAL_FIELDS:
        v = _get(item, f)
        if v is not None:
            return float(v)
    raise ValueError(f"workload item has none of the arrival fields {ARRIVAL_FIELDS}: {item!r}")


def _stats_delta(before: Mapping, after: Mapping) -> dict:
    out = dict(after)
    for k in COUNTER_STATS:
        if isinstance(after.get(k), (int, float)) and isinstance(before.get(k), (int, float)):
            out[k] = after[k] - before[k]
    if isinstance(after.get("batch_sizes"), list) and isinstance(before.get("batch_sizes"), list):
        # The per-step history is bounded (engine.engine.STEP_HISTORY): the run's steps are its
        # last entries, as many as it took (all of them while the history holds them).
        sizes, new = after["batch_sizes"], len(after["batch_sizes"]) - len(before["batch_sizes"])
        if isinstance(after.get("steps"), int) and isinstance(before.get("steps"), int):
            new = after["steps"] - before["steps"]
        out["batch_sizes"] = sizes[max(len(sizes) - new, 0):] if new > 0 else []
    if isinstance(after.get("batch_size_maxima"), list) and isinstance(before.get("steps"), int):
        # the maxima are (step, batch size) of every step no later one matched or beat
        out["max_batch_size"] = next((size for step, size in after["batch_size_maxima"] if step > before["steps"]),
                                     None)
    a, b = after.get("step_composition"), before.get("step_composition")
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out["step_composition"] = {k: v - b.get(k, 0) for k, v in a.items()}
    return out


def step_stats_summary(stats: Mapping) -> dict:
    """A replay's stats with its per-step lists (long: one entry per step) reduced to the
    figures a point keeps: mean and max batch size, the engine's refresh/reuse request-steps
    (from its [refresh, reuse, query tokens] per step); the build profile is dropped (a point
    keeps it in its info). Shared by serve's worker and the simulator, so both write the same
    fields. Mean and largest batch and the request-steps are exact from the counters when
    the system keeps them (the per-step history is bounded: `engine.engine.STEP_HISTORY`)."""
    stats = dict(stats)
    sizes = stats.pop("batch_sizes", None)
    maxima = stats.pop("batch_size_maxima", None)
    largest = stats.pop("max_batch_size", None)
    if isinstance(sizes, list):
        steps, total = stats.get("steps"), stats.get("batched_requests")
        if isinstance(steps, int) and isinstance(total, int):
            stats["mean_batch_size"] = total / steps if steps else None
        else:
            stats["mean_batch_size"] = (sum(sizes) / len(sizes)) if sizes else None
        if maxima is None:
            largest = max(sizes) if sizes else None
        stats["max_batch_size_seen"] = largest
    comp = stats.pop("step_composition", None)
    if isinstance(comp, list):  # engine: [refresh, reuse, query tokens] per step
        exact = all(isinstance(stats.get(k), int) for k in ("refresh_steps", "reuse_steps"))
        stats["refresh_request_steps"] = stats["refresh_steps"] if exact else sum(int(c[0]) for c in comp)
        stats["reuse_request_steps"] = stats["reuse_steps"] if exact else sum(int(c[1]) for c in comp)
    stats.pop("profile", None)
    return stats


def inter_token_latencies(times: Sequence[float] | None) -> list[float] | None:
    """vLLM's ITL for a request whose tokens come a block at a time: the gaps between its
    successive blocks (streamed chunks), one value per block after the first."""
    if not times:
        return None
    return [float(b) - float(a) for a, b in zip(times, times[1:])]


def _record(out: Any, t0: float, arrival: float | None, start: float | None, keep_token_ids: bool) -> dict:
    token_ids, prompt_ids = _get(out, "token_ids"), _get(out, "prompt_ids")
    rec: dict[str, Any] = {
        "request_id": _get(out, "request_id"),
        "prompt_len": len(prompt_ids) if prompt_ids is not None else _get(out, "prompt_len"),
        "output_len": len(token_ids) if token_ids is not None else _get(out, "output_len"),
    }
    for k in TIME_FIELDS:
        v = _get(out, k)
        rec[k] = None if v is None else float(v) - t0
    # The system saw the request when it got its slot (its own arrival_time); the workload's
    # arrival is the scheduled one.
    rec["start_time"] = rec["arrival_time"] if rec["arrival_time"] is not None else (
        None if start is None else start - t0)
    if arrival is not None:
        rec["arrival_time"] = arrival - t0
    elif rec["arrival_time"] is None and start is not None:
        rec["arrival_time"] = start - t0
    rec["itl"] = inter_token_latencies(_get(out, "block_times"))
    for k in ("nfe", "logits_rows", "kv_tokens", "kv_bytes", "steps_per_block", "cache"):
        rec[k] = _get(out, k)   # cache: the engine's mode for this request (dual / sparse / none)
    # TPF (tokens per forward): what parallel decoding buys, per request
    rec["tpf"] = rec["output_len"] / rec["nfe"] if rec["nfe"] and rec["output_len"] is not None else None
    if keep_token_ids:
        rec["token_ids"] = list(token_ids or ())
    return rec


def run_open_loop(system: Any, workload: Iterable[Any], make_params: Callable[[Any], Any], *,
                  progress: ProgressFn | None = None, max_duration: float | None = None,
                  id_prefix: str = "req", keep_token_ids: bool = False,
                  progress_interval: float = 0.1, max_concurrency: int | None = None,
                  clock: Callable[[], float] = time.perf_counter,
                  sleep: Callable[[float], None] = time.sleep,
                  on_start: Callable[[float], None] | None = None) -> dict:
    """Replay `workload` (items with prompt_ids, gen_length, an arrival offset in seconds and
    optionally request_id) against `system` in real time, at most `max_concurrency` requests in
    flight (None: no cap). `on_start(t0)`: told the clock reading the records' times count from,
    before the first request is handed over.

    Returns {records, rejected, duration, interrupted, timed_out, unfinished, unfinished_ids,
    not_sent, num_requests, stats}. Ctrl-C stops the loop and keeps what finished
    (interrupted=True); after `max_duration` seconds live requests are aborted (unfinished) and
    requests not yet handed over (not arrived, or waiting for a slot) are never sent (not_sent).
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    items = sorted(enumerate(workload), key=lambda p: arrival_offset(p[1]))  # stable for ties
    offsets = [arrival_offset(it) for _, it in items]
    # Checked up front: a lengths-only workload (no vocab) is a caller bug, not a rejection.
    if any(_get(it, "prompt_ids") is None for _, it in items):
        raise ValueError("workload items need prompt_ids (build the workload with a vocab)")
    stats_before = dict(system.stats())
    records: list[dict] = []
    rejected: list[dict] = []
    live: dict[str, tuple[float, float]] = {}  # request_id -> absolute (arrival, start) times
    waiting: deque[int] = deque()  # arrived, waiting for a slot (positions in items)
    # When each free slot became free (absolute times): a request taking one starts no earlier.
    free: list[float] = [] if max_concurrency is None else [-math.inf] * max_concurrency
    out_tokens = 0
    interrupted = timed_out = False
    nxt = sent = 0
    deadline = math.inf if max_duration is None else float(max_duration)
    last_report = -math.inf

    def report(force: bool = False) -> None:
        nonlocal last_report
        now = clock()
        if progress is not None and (force or now - last_report >= progress_interval):
            last_report = now
            el = now - t0
            progress(nxt, len(records), out_tokens / el if el > 0 else 0.0)

    t0 = clock()
    if on_start is not None:
        on_start(t0)
    try:
        while True:
            now = clock()
            # Every request whose arrival time has passed (never one that has not) is handed
            # over, in arrival order, as long as a slot is free.
            while nxt < len(items) and t0 + offsets[nxt] <= now:
                waiting.append(nxt)
                nxt += 1
            while waiting and (max_concurrency is None or len(live) < max_concurrency):
                pos = waiting.popleft()
                idx, it = items[pos]
                rid = str(_get(it, "request_id") or f"{id_prefix}-{idx}")
                arr = t0 + offsets[pos]
                start = arr if max_concurrency is None else max(arr, heapq.heappop(free))
                sent += 1
                live[rid] = (arr, start)  # before the call: a Ctrl-C inside it must still abort it
                try:
                    system.add_request(list(_get(it, "prompt_ids")), make_params(it),
                                       request_id=rid, arrival_time=start)
                except ValueError as e:  # "can never run": recorded, the benchmark goes on
                    del live[rid]
                    if max_concurrency is not None:
                        heapq.heappush(free, start)
                    rejected.append({"request_id": rid, "prompt_len": len(_get(it, "prompt_ids")),
                                     "gen_length": _get(it, "gen_length"),
                                     "arrival_time": offsets[pos], "error": str(e)})
            if now - t0 >= deadline:
                timed_out = True
                break
            if system.has_unfinished():
                for out in system.step():
                    rid = _get(out, "request_id")
                    if _get(out, "finished", True) is False:
                        continue  # not a completion (still live, or aborted by the system)
                    arr, start = live.pop(rid, (None, None))
                    rec = _record(out, t0, arr, start, keep_token_ids)
                    if max_concurrency is not None and arr is not None:
                        done = _get(out, "finished_time")
                        heapq.heappush(free, clock() if done is None else float(done))
                    records.append(rec)
                    out_tokens += rec["output_len"] or 0
                report()
            elif nxt < len(items):
                # Idle: sleep to the next arrival (or the deadline), not a busy wait.
                report()
                sleep(max(0.0, min(t0 + offsets[nxt], t0 + deadline) - clock()))
            else:
                break
    except KeyboardInterrupt:
        interrupted = True
    duration = clock() - t0
    unfinished_ids = list(live)
    for rid in unfinished_ids:  # free the system's queue/KV; a failing abort must not lose data
        try:
            system.abort(rid)
        except Exception:  # noqa: BLE001
            pass
    report(force=True)
    return {
        "records": records, "rejected": rejected, "duration": duration,
        "interrupted": interrupted, "timed_out": timed_out,
        "unfinished": len(unfinished_ids), "unfinished_ids": unfinished_ids,
        "not_sent": len(items) - sent, "num_requests": len(items),
        "stats": _stats_delta(stats_before, dict(system.stats())),
    }
