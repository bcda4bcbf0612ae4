"""EngineLoop: the engine stepping in one background thread, fed by the HTTP handlers.

A model step is seconds of blocking torch work, so it cannot run on the event loop: one thread
owns the engine and is the only code that touches it. Handlers hand it jobs through a queue;
between two steps the thread adds every new request (all of them join the next step's batch:
this is where clients are batched together by the phase scheduler), aborts the ones whose client
went away, and after each step reports to every job on its own asyncio queue, via
`call_soon_threadsafe`: `accepted` / `rejected` (add_request's ValueError), one `block` event
per committed block of a streamed request (read from the engine's running requests: a block is
final once the request's block cursor has passed it), then `finished` with the RequestOutput,
or `failed` if a step raised. Each event is `(job.index, kind, payload)`, so the jobs of one HTTP
request (OpenAI's list of prompts) can share one queue; they are submitted together and admitted
all or none, in the same drain.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("dllm_bench.server")

IDLE_WAIT_S = 0.5   # an idle thread re-checks for stop at least this often


@dataclass
class Job:
    """One request in flight: what to add, and where the engine thread reports to."""

    request_id: str
    prompt_ids: list[int]
    params: Any                      # engine.sampling.SamplingParams
    loop: asyncio.AbstractEventLoop
    stream: bool = False
    arrival_time: float = field(default_factory=time.perf_counter)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    sent: int = 0                    # generated tokens already reported in block events
    index: int = 0                   # its prompt's place in the HTTP request (the choice index)

    def push(self, kind: str, payload: Any = None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (self.index, kind, payload))
        except RuntimeError:  # the event loop is gone (server shutting down)
            pass


def committed_tokens(req: Any, start: int) -> list[int]:
    """Generated tokens of a running engine request from `start` to the end of its last
    committed block (the block cursor `req.block` counts finished blocks)."""
    end = req.block * req.params.block_length
    if end <= start:
        return []
    return req.canvas[req.prompt_len + start: req.prompt_len + end].tolist()


class EngineLoop:
    """Runs `engine` (the serving-system interface of docs/ARCHITECTURE.md, an LLMEngine) in a
    daemon thread. `submit`/`abort` may be called from any thread; `snapshot()` is the state
    published after every step (for /metrics and the waiting-queue limit)."""

    def __init__(self, engine: Any):
        self.engine = engine
        self._submits: queue.SimpleQueue[tuple[Job, ...]] = queue.SimpleQueue()
        self._aborts: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._handed_over = 0                      # jobs submitted, not yet drained
        self._stop = threading.Event()
        self._jobs: dict[str, Job] = {}           # engine thread only
        self._outbox: list[tuple[Job, str, Any]] = []   # engine thread only: events sent by _flush
        self._thread: threading.Thread | None = None
        self.counters = dict(requests_finished=0, requests_aborted=0, requests_rejected=0,
                             requests_failed=0, prompt_tokens=0, generation_tokens=0,
                             batched_requests=0, max_batch_size=0, step_seconds=0.0)
        self._snapshot: dict = {}
        # Engine counters from before the loop (a warm-up) are not the server's work.
        self._counters_at_start = dict(engine.counters)
        self._publish()

    # ------------------------------------------------------------- any thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dllm-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, *jobs: Job) -> None:
        """Hand over the jobs of one HTTP request: all are admitted in the same drain, or none."""
        with self._lock:
            self._handed_over += len(jobs)
        self._submits.put(jobs)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._aborts.put(request_id)
        self._wake.set()

    def num_waiting(self) -> int:
        """Requests not yet admitted to a step: handed over but not added, plus the engine's
        waiting queue (a deque's len is safe to read from another thread)."""
        return self._handed_over + len(self.engine.scheduler.waiting)

    def snapshot(self) -> dict:
        return {**self._snapshot, "requests_waiting": self.num_waiting()}

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------- engine thread
    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain()
            self._flush()
            if self.engine.has_unfinished():
                self._step()
            else:
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
            self._flush()
        for rid in list(self._jobs):  # shutdown: nobody waits forever
            self._jobs.pop(rid).push("failed", "server shutting down")

    def _drain(self) -> None:
        while True:
            try:
                group = self._submits.get_nowait()
            except queue.Empty:
                break
            with self._lock:
                self._handed_over -= len(group)
            self._admit(group)
        while True:
            try:
                rid = self._aborts.get_nowait()
            except queue.Empty:
                break
            if self._jobs.pop(rid, None) is not None:
                try:
                    self.engine.abort(rid)   # frees its KV reservation
                except Exception:  # noqa: BLE001
                    log.exception("abort failed")
                self.counters["requests_aborted"] += 1

    def _admit(self, group: tuple[Job, ...]) -> None:
        """Add every job of one HTTP request, or none: when one is refused, the ones already
        added are taken out again and the refused job reports why."""
        added: list[Job] = []
        for job in group:
            try:
                self.engine.add_request(job.prompt_ids, job.params, request_id=job.request_id,
                                        arrival_time=job.arrival_time)
            except Exception as e:  # noqa: BLE001 - an engine bug fails this request, not the loop
                for a in added:
                    self.engine.abort(a.request_id)
                if isinstance(e, ValueError):
                    self.counters["requests_rejected"] += len(group)
                    self._tell(job, "rejected", str(e))
                else:
                    log.exception("add_request failed")
                    self.counters["requests_failed"] += len(group)
                    self._tell(job, "failed", f"add_request failed: {type(e).__name__}: {e}")
                return
            added.append(job)
        for job in group:
            self._jobs[job.request_id] = job
            self.counters["prompt_tokens"] += len(job.prompt_ids)
            self._tell(job, "accepted")

    def _step(self) -> None:
        eng = self.engine
        steps_before = eng.counters["steps"]
        t = time.perf_counter()
        try:
            outs = eng.step()
        except Exception as e:  # noqa: BLE001 - fail the requests in flight, keep serving
            log.exception("engine step failed")
            self._fail_all(f"engine step failed: {type(e).__name__}: {e}")
            return
        c = self.counters
        c["step_seconds"] += time.perf_counter() - t
        if eng.counters["steps"] > steps_before:         # one engine step: the newest history entry
            b = eng.batch_sizes[-1]
            c["batched_requests"] += b
            c["max_batch_size"] = max(c["max_batch_size"], b)
        for req in eng.scheduler.running:
            job = self._jobs.get(req.request_id)
            if job is not None and job.stream:
                toks = committed_tokens(req, job.sent)
                if toks:
                    job.sent += len(toks)
                    self._tell(job, "block", toks)
        for out in outs:
            job = self._jobs.pop(out.request_id, None)
            if job is None:
                continue
            c["requests_finished"] += 1
            c["generation_tokens"] += len(out.token_ids)
            self._tell(job, "finished", out)

    def _fail_all(self, message: str) -> None:
        for rid in list(self._jobs):
            try:
                self.engine.abort(rid)
            except Exception:  # noqa: BLE001 - the engine is already in trouble
                log.exception("abort after a failed step")
            self.counters["requests_failed"] += 1
            self._tell(self._jobs.pop(rid), "failed", message)

    def _tell(self, job: Job, kind: str, payload: Any = None) -> None:
        self._outbox.append((job, kind, payload))

    def _flush(self) -> None:
        """Publish the counters, then send the events they count: a client that has its answer
        finds it in /metrics already."""
        self._publish()
        outbox, self._outbox = self._outbox, []
        for job, kind, payload in outbox:
            job.push(kind, payload)

    def _publish(self) -> None:
        eng = self.engine
        pool = eng.pool
        self._snapshot = {
            **self.counters,
            **{f"engine_{k}": v - self._counters_at_start.get(k, 0) for k, v in eng.counters.items()},
            "requests_running": len(eng.scheduler.running),
            "kv_pool_used_tokens": pool.used, "kv_pool_capacity_tokens": pool.capacity,
            "kv_pool_bytes_per_token": pool.bytes_per_token,
        }

