"""Running one serving point in a fresh worker process (dllm_bench.serve.worker): the spec
the parent writes, the subprocess and its Ctrl-C handling, and the JSON-line events it prints.

A fresh process per point keeps warm caches, the allocator's high-water mark and imported state
from leaking between systems. The worker gets its own session so the terminal's SIGINT reaches
only the parent, which forwards it and waits for the worker's partial result.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dllm_bench.serve import speed_gauge
from dllm_bench.serve.config import ServeRun

INTERRUPT_GRACE_S = 30.0  # after Ctrl-C, how long a worker may take to write its partial result


class WorkerFailed(Exception):
    """A worker that ended without a result. kind "user": bad input (e.g. a budget that cannot
    hold the weights), which stops the run; "internal": recorded, and the run goes on."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def worker_spec(run: ServeRun, variant, workload, shape, trace_path: Path | None = None) -> dict:
    """`trace_path`: where the worker streams its per-step trace (dllm_bench.serve.trace)."""
    p = run.preset
    dec = run.decoding_for(variant)
    baseline_defaults = run.baseline_defaults
    if dec.knobs:   # Fast-dLLM's threshold / factor knob for the policy (the variant's own knobs still win)
        baseline_defaults.setdefault(variant.name, {}).update(dec.knobs)
    return {
        "variant": variant.to_dict(), "model_dir": str(run.model_dir), "dtype": p.dtype,
        "device": p.device, "memory_budget": run.memory_budget, "threads": p.threads,
        "engine_defaults": run.engine_defaults, "baseline_defaults": baseline_defaults,
        "max_model_len": p.max_model_len, "shape": shape.__dict__,
        "sampling": {"block_length": p.block_length, "steps": "gen_length", "decoding": str(dec.decoding)},
        "workload": [{"request_id": r.request_id, "prompt_ids": r.prompt_ids, "gen_length": r.gen_length,
                      "arrival": r.arrival} for r in workload],
        "max_duration": run.max_duration, "num_warmups": run.num_warmups, "use_cache": run.use_cache,
        "max_concurrency": run.max_concurrency,
        # the machine's speed around the replay, for `simulate --validate` (DLLM_BENCH_SPEED_GAUGE=1)
        "speed_gauge": speed_gauge.requested(),
        "trace_steps": None if trace_path is None else str(trace_path),
    }


def run_worker(spec: dict, log_path: Path, threads: int, on_event) -> dict:
    """Run one point in a fresh `python -m dllm_bench.serve.worker` process; return its output.

    on_event(dict) gets every JSON line the worker prints. Ctrl-C is forwarded to the worker
    (its own session, so the terminal's SIGINT reaches only us), which stops serving, writes its
    partial result, and exits; the KeyboardInterrupt is re-raised after that, with the partial
    result attached as `.partial` (None if there was none)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dllm-serve-") as tmp, open(log_path, "w") as log:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        proc = subprocess.Popen([sys.executable, "-m", "dllm_bench.serve.worker", str(spec_path), str(out_path)],
                                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                                env=env, start_new_session=True)
        events: queue.Queue = queue.Queue()

        def reader() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                events.put(line)
            events.put(None)
        th = threading.Thread(target=reader, daemon=True)
        th.start()
        error: dict | None = None
        interrupted = False
        deadline = math.inf

        def pump(timeout: float) -> bool:
            """Handle queued lines; False once the worker's stdout is closed."""
            nonlocal error
            try:
                line = events.get(timeout=timeout)
            except queue.Empty:
                return True
            if line is None:
                return False
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                log.write(line)
                return True
            if ev.get("event") == "error":
                error = ev
            on_event(ev)
            return True

        try:
            while pump(0.2):
                pass
        except KeyboardInterrupt:
            interrupted = True
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            try:
                while time.monotonic() < deadline and pump(0.2):
                    pass
            except KeyboardInterrupt:  # a second Ctrl-C: stop now
                pass
        finally:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()) if interrupted else None)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                proc.kill()
                proc.wait()
        out = None
        if out_path.exists():
            out = json.loads(out_path.read_text(encoding="utf-8"))
        if interrupted:
            exc = KeyboardInterrupt()
            exc.partial = out  # type: ignore[attr-defined]
            raise exc
        if proc.returncode == 0 and out is not None:
            return out
        if error is not None:
            raise WorkerFailed(error.get("kind", "internal"), error.get("message", "worker failed"))
        raise WorkerFailed("internal", f"worker exited with code {proc.returncode} (log: {log_path})")


def progress_handler(progress, task, said: set[str] | None = None) -> Callable[[dict], None]:
    """An on_event for run_worker that mirrors the worker's events onto one Rich progress task.
    `said`: the run's lines said so far: a built engine's attention line is printed once a run,
    not once a worker (each point builds its own engine)."""
    def on_event(ev: dict) -> None:
        e = ev.get("event")
        if e == "status":
            progress.update(task, status=ev.get("message", ""))
        elif e == "built":
            info = ev.get("info", {})
            line = info.get("attention")
            if line and said is not None and line not in said:
                said.add(line)
                progress.console.print(line, markup=False, highlight=False)
            b = info.get("max_batch_size")
            progress.update(task, status=f"B={b}" if b else f"KV pool {info.get('kv_pool_tokens')} tok")
        elif e == "progress":
            progress.update(task, completed=ev.get("finished", 0), arrived=ev.get("arrived", 0),
                            tps=float(ev.get("tps") or 0.0))
        elif e == "done":
            progress.update(task, status="done")
    return on_event
