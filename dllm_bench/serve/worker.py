"""One (system, workload) serving point in its own process: `python -m dllm_bench.serve.worker
<spec.json> <out.json>`, so warm caches, allocator high-water marks and imported state never
leak from one system into the next. The spec (serve.process.worker_spec) carries the variant,
checkpoint, device, budget, threads, workload and sampling rule; the worker pins its threads,
builds the system, warms it up (unmeasured), replays the workload open-loop (serve.loadgen),
optionally tracing each forward (serve.trace), and writes {result, info} atomically. Its stdout
is JSON event lines for the parent (see `emit`); exit 0 done (also a partial, interrupted
result), 2 bad input, 130 interrupted before the run, 1 anything else.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any

# The parent reads our stdout as JSON lines: keep a private handle on it and point sys.stdout at
# stderr before anything else is imported, so a stray print() in any library cannot corrupt the stream.
_EVENTS = sys.stdout
sys.stdout = sys.stderr

import torch  # noqa: E402

from dllm_bench.errors import UserError  # noqa: E402
from dllm_bench.results import atomic_write_json  # noqa: E402
from dllm_bench.serve.loadgen import run_open_loop, step_stats_summary  # noqa: E402
from dllm_bench.serve.speed_gauge import SpeedGauge  # noqa: E402
from dllm_bench.serve.trace import tracing  # noqa: E402
from dllm_bench.systems.build import (  # noqa: E402
    STATIC_PROFILE_STEPS,
    WARM_UP_PROMPT,
    WorkloadShape,
    build_system,
    warm_up,
    warm_up_batch,
)
from dllm_bench.systems.spec import SystemVariant  # noqa: E402
from engine.decoding import FIXED, Decoding  # noqa: E402
from engine.profiler import MemoryMeter, weights_bytes  # noqa: E402  (the meter: the budget is held, not only accounted)
from engine.sampling import SamplingParams  # noqa: E402


def emit(event: str, **fields: Any) -> None:
    # Events: status {message} (setup phases), built {info} (scenario, batch, KV pool), progress
    # {arrived, finished, total, tps, elapsed}, done, error {kind: user|internal, message}.
    # Everything else (warnings, tracebacks) goes to stderr, which the parent keeps in a log.
    try:
        _EVENTS.write(json.dumps({"event": event, **fields}, default=str) + "\n")
        _EVENTS.flush()
    except (BrokenPipeError, ValueError):  # the parent went away: keep running to write the result
        pass


def run(spec: dict, out_path: Path) -> int:
    threads = int(spec["threads"])
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set (only possible before any parallel work)

    variant = SystemVariant.from_dict(spec["variant"])
    t_build = time.perf_counter()
    try:
        built = build_system(
            variant, model_dir=spec["model_dir"], dtype=spec["dtype"], device=spec["device"],
            memory_budget=spec["memory_budget"], shape=WorkloadShape(**spec["shape"]),
            engine_defaults=spec.get("engine_defaults") or {},
            baseline_defaults=spec.get("baseline_defaults") or {},
            max_model_len=spec.get("max_model_len"), cache_dir=spec.get("cache_dir"),
            use_cache=spec.get("use_cache", True), log=lambda m: emit("status", message=m))
    except UserError as e:
        emit("error", kind="user", message=str(e))
        return 2
    info = dict(built.info)
    info["build_seconds"] = time.perf_counter() - t_build
    info["torch_threads"] = torch.get_num_threads()
    emit("built", info={k: v for k, v in info.items() if k not in ("profile", "engine_config")})
    system = built.system
    n_warm = int(spec.get("num_warmups", 0))
    if n_warm:
        emit("status", message=f"warming up ({n_warm} request{'s' if n_warm > 1 else ''})")
        most = warm_up_batch(len(spec["workload"]), spec.get("max_concurrency"))
        warm_up(system, spec["workload"][0]["prompt_ids"][:WARM_UP_PROMPT], int(spec["sampling"]["block_length"]),
                n_warm, most)

    steps_rule = spec["sampling"].get("steps", "gen_length")
    block = int(spec["sampling"]["block_length"])
    decoding = Decoding.parse(spec["sampling"].get("decoding", FIXED))   # the text process.py wrote

    def make_params(item: dict) -> SamplingParams:
        g = int(item["gen_length"])
        steps = g if steps_rule == "gen_length" else int(steps_rule)
        return SamplingParams(gen_length=g, steps=steps, block_length=block, temperature=0.0, decoding=decoding)

    total = len(spec["workload"])
    t0 = time.perf_counter()

    def progress(arrived: int, finished: int, tps: float) -> None:
        emit("progress", arrived=arrived, finished=finished, total=total, tps=tps,
             elapsed=time.perf_counter() - t0)

    device = system.model.device
    gauge = _speed_gauge(system.model) if spec.get("speed_gauge") else None
    emit("status", message="serving")
    # On CUDA the meter reads the allocator's peak for free. On CPU it hooks every operator
    # (a Python dispatch mode), which slowed timed runs by 8-16 % and unequally across systems
    # (more for the baselines' many small ops), so a CPU replay runs unmetered and the peak is
    # measured afterwards, untimed (budget_probe).
    with MemoryMeter(device) if device.type == "cuda" else nullcontext() as meter, \
            tracing(system, spec.get("trace_steps")) as trace:
        result = run_open_loop(system, spec["workload"], make_params, progress=progress,
                               max_duration=spec.get("max_duration"), progress_interval=0.25,
                               max_concurrency=spec.get("max_concurrency"),
                               on_start=None if trace is None else trace.start)
    if gauge is not None:
        gauge.read()
        info["speed_gauge_s"] = gauge.readings
    if meter is None:
        emit("status", message="measuring the memory peak (untimed)")
        peak, how = budget_probe(system, spec["workload"], make_params), "probe"
    else:
        peak, how = meter.peak_bytes, "run"
    result["stats"] = step_stats_summary({**(result.get("stats") or {}), "peak_measured_in": how,
                                          **budget_held(system, peak, spec.get("memory_budget"))})
    system.close()                            # an engine over several ranks stops them
    try:  # the whole process (Python, torch, weights...): a sanity number, not the budgeted bytes
        import resource  # Unix only: elsewhere the figure is None

        info["peak_rss_bytes"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError):
        info["peak_rss_bytes"] = None
    atomic_write_json(out_path, {"result": result, "info": info})
    emit("done", interrupted=result["interrupted"], timed_out=result["timed_out"])
    return 0


def _speed_gauge(model) -> SpeedGauge:
    """Read once before the replay (and once after it): the machine's speed while this point was
    measured, in the units `calibrate` records (same GEMM shape, dtype and thread count). Only a
    validation's measured side asks for it (spec `speed_gauge`: dllm_bench.serve.speed_gauge)."""
    cfg = model.config
    gauge = SpeedGauge(cfg.d_model, cfg.mlp_hidden_size, model.dtype, repeats=5)
    gauge.read()
    return gauge


def budget_probe(system, workload: list[dict], make_params, steps: int = STATIC_PROFILE_STEPS) -> int:
    """The metered peak of the point's whole workload submitted at once (the most concurrency,
    so the largest activations and caches) over the steps a static-batch profile measures: a
    full forward, the delayed-selection step and a cache-reusing step with every cache held;
    later steps repeat these shapes. Requests still running afterwards are aborted."""
    ids = []
    for i, it in enumerate(workload):
        try:
            ids.append(system.add_request(list(it["prompt_ids"]), make_params(it), request_id=f"probe-{i}"))
        except ValueError:
            pass  # rejected in the run as well ("can never run")
    with MemoryMeter(system.model.device) as meter:
        for _ in range(steps):
            if not system.has_unfinished():
                break
            system.step()
    for rid in ids:
        try:
            system.abort(rid)
        except (KeyError, ValueError):
            pass  # already finished
    return int(meter.peak_bytes)


def budget_held(system, run_peak_bytes: int, budget: int | None) -> dict:
    """Weights + what the system holds from its construction on (the engine's KV pool: allocated
    before any meter starts, so the meter never sees it, while a baseline's caches are allocated
    in the run and metered) + the meter's peak over the whole replay (activations, KV, logits,
    caches) against the memory budget every system was sized for."""
    resident = int((system.stats() or {}).get("kv_pool_bytes") or 0)
    peak = weights_bytes(system.model) + resident + int(run_peak_bytes)
    return {"peak_memory_bytes": peak, "memory_budget_bytes": budget,
            "within_budget": None if budget is None else bool(peak <= budget)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m dllm_bench.serve.worker <spec.json> <out.json>", file=sys.stderr)
        return 2
    # SIGTERM behaves like Ctrl-C: the run loop stops, keeps what finished and writes it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
        return run(spec, Path(argv[1]))
    except KeyboardInterrupt:
        emit("error", kind="interrupted", message="interrupted before the run started")
        return 130
    except Exception as e:  # noqa: BLE001 - reported to the parent in one line, traceback to the log
        traceback.print_exc()
        emit("error", kind="internal", message=f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
